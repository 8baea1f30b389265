"""A lock refused because another process holds it names that process, even when the holder took the lock a
moment ago and has not written its record yet (the run directory's lock, albert_dist.job.lock, and
`data prepare`'s output lock, albert_dist.data.prepare.lock). The holder here is another file description of
this process (flock conflicts between them as between processes), writing its record 0.3 s late."""
from __future__ import annotations

import fcntl
import json
import os
import threading

import pytest

from albert_dist.data.prepare.lock import OutputBusy, OutputLock
from albert_dist.job.lock import LOCK_FILE, RunDirBusy, RunDirLock


def _late_holder(path) -> tuple[int, threading.Timer]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    record = json.dumps({"pid": 4242, "host": "n9", "started": "2026-12-03T08:00:00Z"}).encode()
    timer = threading.Timer(0.3, lambda: os.pwrite(fd, record, 0))
    timer.start()
    return fd, timer


def test_prepare_names_a_holder_that_writes_its_record_late(tmp_path):
    fd, timer = _late_holder(tmp_path / ".out.prepare-lock")
    try:
        with pytest.raises(OutputBusy, match="being written by another albert-dist data prepare: pid 4242 on host n9"):
            OutputLock(tmp_path / ".out.prepare-lock", str(tmp_path / "out")).acquire()
    finally:
        timer.join()
        os.close(fd)


def test_a_run_directory_names_a_holder_that_writes_its_record_late(tmp_path):
    fd, timer = _late_holder(tmp_path / LOCK_FILE)
    try:
        with pytest.raises(RunDirBusy, match="in use by another job: pid 4242 on host n9, since 2026-12-03T08:00:00Z"):
            RunDirLock(tmp_path).acquire()
    finally:
        timer.join()
        os.close(fd)
