"""albert_dist.job.lock: one job per run directory, the lock released by the kernel however the holder ends.

The holders are real processes (a flock is per open file: a second lock in the same process would be a
different open file, and would be refused just the same, but the pid in the message is what a user reads).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from albert_dist.job.lock import LOCK_FILE, RunDirBusy, RunDirLock

HOLD = """
import sys, time
from albert_dist.job.lock import RunDirLock
lock = RunDirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _holder(run_dir: Path, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_job_is_refused_naming_the_directory_and_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir, {"SLURM_JOB_ID": "4242"})
    try:
        with pytest.raises(RunDirBusy) as err:
            RunDirLock(run_dir).acquire()
        msg = str(err.value)
        assert msg.startswith(f"run directory {run_dir} is in use by another job: pid {holder.pid} on host "
                              f"{socket.gethostname()} (Slurm job 4242), since 20"), msg
        assert f"(lock {run_dir / LOCK_FILE}); one job per run directory" in msg
        assert isinstance(err.value, ValueError)  # the app's "refused" family: exit 2
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_job_is_released_by_the_kernel(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = RunDirLock(run_dir).acquire()  # --resume auto after a crash, a Slurm requeue
    assert lock.held and json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    again = RunDirLock(run_dir).acquire()
    again.release()


def test_forked_children_do_not_keep_the_lock(tmp_path):
    """DataLoader workers are forked from rank 0: after rank 0 dies they must not hold its lock on."""
    run_dir = tmp_path / "run"
    code = f"""
import os, sys, time
from albert_dist.job.lock import RunDirLock
lock = RunDirLock({str(run_dir)!r}).acquire()
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
print("forked", flush=True)
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "forked"
        proc.send_signal(signal.SIGKILL)  # the parent only; its forked child lives on
        proc.wait()
        time.sleep(0.2)
        RunDirLock(run_dir).acquire().release()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
