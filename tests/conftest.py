"""Shared pytest setup: one torch thread per process (CI has 2 cores and tests spawn ranks)."""
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


#: Files that share a session fixture run on one pytest-xdist worker: the 2-rank matrix run both use
#: (tests/distributed/conftest.py) would otherwise run once per worker.
SHARED_GROUPS = {"test_compile.py": "two_rank_matrix", "test_grad_matrix.py": "two_rank_matrix"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """`make test` runs two pytest-xdist workers with ``--dist loadgroup``: a unit of work is a whole file (its
    module fixtures, a server or a trained run, start once), or the files of a `SHARED_GROUPS` entry together."""
    for item in items:
        group = SHARED_GROUPS.get(item.path.name, f"{item.path.parent.name}/{item.path.name}")
        item.add_marker(pytest.mark.xdist_group(group))
