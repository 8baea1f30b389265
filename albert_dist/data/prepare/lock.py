"""One `albert-dist data prepare` per output at a time (`OutputLock`: a second is refused naming the holder)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

from albert_dist.job.lockfile import read_holder

#: the lock beside a local output, ``.<name>.prepare-lock`` (`OutputLock`): kept after the run (deleting it while
#: a holder runs would let a second prepare lock a new file); a dotfile, so a glob or directory source skips it
LOCK_SUFFIX = ".prepare-lock"


class OutputBusy(ValueError):
    """Another `albert-dist data prepare` is writing the same output (exit 2; the message names the holder)."""


class OutputLock:
    """One prepare per output: an exclusive ``fcntl.flock`` on ``path`` (beside the output's work directory), held
    until `release` or the process's end (the kernel drops it however the process ends, so a killed prepare never
    leaves it stuck). The holder writes its pid, host and start time into the file for the refusal message.

    Why: two prepares on one output each took the other's live work directory for an interrupted run, and one
    could finish with a manifest whose sha256 did not match a shard the other had rewritten (issue 26). An
    object-store output is built in a local work directory per URL
    (`albert_dist.data.prepare.publish.remote_work_root`), so this refuses a second prepare of one URL on the
    same node; two nodes preparing one URL are not detected (object stores have no
    lock), and the last upload wins whole: each one's manifest still matches the shards it names.
    """

    def __init__(self, path: Path, output: str) -> None:
        self.path, self.output = path, output
        self._fd: Optional[int] = None

    def acquire(self) -> "OutputLock":
        """Take the lock without waiting. Raises `OutputBusy` naming the holder, OSError if the file cannot be made."""
        import fcntl
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            who = read_holder(self.path)
            holder = (f"pid {who['pid']} on host {who.get('host', '?')} since {who.get('started', '?')}"
                      if who.get("pid") else "a process that has not written its pid yet")
            raise OutputBusy(f"--output {self.output} is being written by another albert-dist data prepare: "
                             f"{holder} (lock {self.path}); wait for it to end, or choose another output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

