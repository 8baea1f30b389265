"""Shared pytest setup: one torch thread per process (CI has 2 cores and tests spawn ranks), each test's CPU
seconds in the JUnit XML (tools/slowest_tests.py reads them), and no shared memory left by the ranks tests kill."""
import os
import resource
import time
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

#: JUnit property of a test: the CPU seconds (user + system) of the pytest process and of the processes it reaped
#: (children, and their reaped descendants) from the test's setup to its teardown, and of the fork server
#: (tests/fixtures/forkserver.py) and the rank processes it forked and reaped. CI's 2 cores run busy (~99 %
#: measured through most of `make test`), so CPU, not wall time, is what a test costs the suite. Processes nobody
#: in the test's process tree waits for (Slurm's job steps, started by slurmd) are not counted.
CPU_PROPERTY = "cpu_s"
_CPU_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    from fixtures.forkserver import server_cpu_seconds

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + server_cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_START] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)  # a wrapper: other conftests' makereport hooks return the report (firstresult)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _CPU_START in item.stash:  # before the report that carries the properties
        item.user_properties.append((CPU_PROPERTY, round(_cpu_seconds() - item.stash[_CPU_START], 2)))
    return (yield)


_SESSION_START = time.time()


def _mapped_shm() -> set[str]:
    """The /dev/shm files some live process maps (its /proc/<pid>/maps; another user's unreadable ones are skipped)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        mapped.update(line.split(None, 5)[5].removesuffix(" (deleted)") for line in text.splitlines()
                      if " /dev/shm/" in line)
    return mapped


def pytest_sessionfinish(session, exitstatus):
    """Remove the DeepSpeed CPU allreduce segments (66 MiB of RAM each in /dev/shm) of the ranks this session's tests
    killed: a rank removes its own at its end (`albert_dist.job.stop.release_shm_workspace`), not when SIGKILLed, and
    a full run left 6 (400 MB) a time. Only segments made since the session started that no live process maps (a
    job running beside the tests keeps its own)."""
    from albert_dist.job.stop import SHM_WORKSPACE_PREFIX

    if hasattr(session.config, "workerinput") or not Path("/proc/self/maps").exists():
        return  # a pytest-xdist worker: the controller does it once every worker is done
    mapped = _mapped_shm()
    for path in Path("/dev/shm").glob(f"{SHM_WORKSPACE_PREFIX}_{os.getuid()}_*"):
        try:
            if path.stat().st_mtime >= _SESSION_START and str(path) not in mapped:
                path.unlink()
        except OSError:  # gone already, or not ours to remove
            pass
