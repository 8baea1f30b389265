"""The 2-rank gradient-matrix run that test_grad_matrix.py and test_compile.py share (`two_rank_matrix`)."""
from __future__ import annotations

import os

import pytest

#: Seconds for the whole shared run (the gradient matrix and the compiled cells, 2 CPU cores under load).
TIMEOUT_S = 3600
#: The files whose 2-rank cells `two_rank_matrix` runs.
FILES = ("test_compile.py", "test_grad_matrix.py")


def _selected(request, filename: str) -> bool:
    return any(item.path.name == filename and item.path.parent.name == "distributed" for item in request.session.items)


@pytest.fixture(scope="session")
def two_rank_matrix(request):
    """``results(filename) -> {cell.id: merged result}`` of that file's 2-rank cells, each run in a spawned process
    group (`grad_matrix_worker.run_matrix`), once per session. In one pytest process the first call runs the cells of
    every selected file of the two in ONE process group, which saves a start-up (two ranks importing torch and
    DeepSpeed, the process group); under pytest-xdist (`make test`: ``--dist loadfile``, the files may go to two
    workers and a worker cannot know which files it will get) each file runs its own cells. test_compile.py's cells
    first, as in a process group of their own: the parent warms inductor's caches before the ranks start
    (`grad_matrix_worker.warm_compile_caches`), the setup in which the ranks are known to find them (tried: after
    the eager matrix, warmed by a process beside the ranks, the first compiled cell compiled anew, 83 s against
    11 s; which of the two lost the cache was not isolated); then test_grad_matrix.py's cells (eager: compiled
    engines of earlier cells leave nothing they use); the control cell last. Each cell still builds its own engine
    and is compared with its own references."""
    import grad_matrix_worker as gm

    done: dict[str, dict[str, dict]] = {}

    def results(filename: str) -> dict[str, dict]:
        if filename not in done:
            files = [filename] if os.environ.get("PYTEST_XDIST_WORKER") else \
                [f for f in FILES if f == filename or _selected(request, f)]
            cells: list = []
            if "test_compile.py" in files:
                from test_compile import CELLS, COMPILED

                gm.warm_compile_caches(COMPILED)
                cells += CELLS
            if "test_grad_matrix.py" in files:
                from test_grad_matrix import CONTROL_CELLS, MATRIX_CELLS

                cells += MATRIX_CELLS + CONTROL_CELLS
            merged = gm.run_matrix(cells, timeout_s=TIMEOUT_S)
            done.update({f: merged for f in files})
        return done[filename]

    return results
