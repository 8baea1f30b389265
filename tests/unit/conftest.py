"""The unit tier's rule, enforced: a test here runs in this one process (no subprocess, no forked or spawned
process: DataLoader workers, pools and ranks included), so `make test-fast` stays the few-minute inner loop.

A test that starts one fails, naming what it started and where such a test belongs (tests/integration). The
guard patches the three doors every process start in this code base goes through: `subprocess.Popen` (``run``,
``check_output``... too), `multiprocessing`'s ``Process.start`` (torch's DataLoader workers, pools, spawned
ranks) and `os.fork`/`os.posix_spawn` (whatever calls them directly).
"""
from __future__ import annotations

import multiprocessing.process
import os
import platform
import subprocess

import pytest

# platform.platform() runs `uname -p` once per process and caches it; mlflow's import asks for it, so a unit
# test that happened to import mlflow first failed the guard when run alone. Fill the cache before the guard.
platform.processor()

RULE = "tests/unit runs in one process; a test that starts {what} belongs in tests/integration"


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(RULE.format(what=what))

    return refuse


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a multiprocessing process"))
    monkeypatch.setattr(os, "fork", _refuse("a forked process"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("a spawned process"))


@pytest.fixture
def no_process_group(monkeypatch):
    """A test of a command that must refuse its input before any process group: starting one (or reaching
    Trainer.setup) fails the test; the launcher's rank variables are cleared so the command runs as one process."""
    from albert_dist.apps.pretrain import main as train
    from albert_dist.distributed import group as distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed, "init_distributed", lambda *a, **k: pytest.fail("process group started"))
    monkeypatch.setattr(train.Trainer, "setup", lambda self: pytest.fail("Trainer.setup reached"))
