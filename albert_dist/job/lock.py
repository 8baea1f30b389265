"""File locks, the one module that calls `flock`: a held lock naming its holder (`HolderLock`), and `flock`.

`HolderLock` is one job per run directory (`RunDirLock`) and one `albert-dist data prepare` per output
(`albert_dist.data.prepare.lock`); `flock` is the plain wait of the object cache, the fine-tune results file and
the MLflow store's creation.

One job per run directory: an OS lock (`flock`) on `<run_dir>/.albert_dist.lock`, held by rank 0 for the
whole job and released by the kernel when the process ends, however it ends (a killed job never leaves it
stuck, so `--resume auto` after a crash and a Slurm requeue take it again).

Two jobs on one run directory (a double `sbatch`, a requeue racing a manual restart) used to both run: each
deleted the other's fresh checkpoints as "left by an earlier attempt", and `metrics.jsonl` got every step
twice. The second job is now refused before any process group (`albert_dist.apps.pretrain.main`: exit 2), with a line
naming the directory and the holder (pid, host, Slurm job, start time), which the holder writes into the lock
file once it holds the lock.

File systems: local ones and NFS (the Linux client turns `flock` into an NFS lock; a crashed client's lock
is released when its lease ends, 90 s by default on NFSv4) lock across nodes; Lustre needs its `flock` mount
option. Where the file system cannot lock (ENOLCK, EOPNOTSUPP, ...), the job runs with a warning saying a
second job would not be refused.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

logger = logging.getLogger(__name__)

LOCK_FILE = ".albert_dist.lock"

#: errnos of a file system that cannot lock at all (as opposed to a lock held by someone else)
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def flock(fd, exclusive: bool = True, blocking: bool = True) -> bool:
    """Lock open file `fd` (an int or a file object): exclusive or shared, waiting or not. Returns False, without
    the lock, when `blocking` is False and another process holds a conflicting one. A lock belongs to the open
    file (released when its last descriptor closes, however the process ends)."""
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, mode)
    except BlockingIOError:
        return False
    return True


def read_holder(path: Path, wait_s: float = 1.0) -> dict:
    """The holder's record in lock file ``path``, a JSON object the holder writes right after it takes the lock
    ({} when unreadable or not JSON). A holder that has just taken the lock writes it a moment later (1 of 5
    same-instant starts read an empty file), so an empty file is read again for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = path.read_text()
        except OSError:
            text = ""
        if text or time.monotonic() >= deadline:
            try:
                return json.loads(text or "{}")
            except ValueError:
                return {}
        time.sleep(0.05)


class RunDirBusy(ValueError):
    """Another live job holds the run directory's lock; the message names the directory and the holder.
    A `ValueError`, so the app refuses the job with exit code 2 like any other bad input."""


def _holder(lock_path: Path) -> str:
    """The holder as its lock file describes it: "pid 123 on host n1 (Slurm job 45), since <UTC time>". A holder
    that has just taken the lock writes its record a moment later: an empty file is read again for up to 1 s."""
    info = read_holder(lock_path)
    if not info.get("pid"):
        return "a job that has not written its pid yet"
    text = f"pid {info['pid']} on host {info.get('host', '?')}"
    if info.get("slurm_job_id"):
        text += f" (Slurm job {info['slurm_job_id']})"
    if info.get("started"):
        text += f", since {info['started']}"
    return text


class HolderLock:
    """An exclusive lock on file `path`, taken without waiting, whose holder writes its pid, host, Slurm job and
    start time into the file; a second taker is refused with `refuse(holder)` naming it. The lock lasts while
    this object's file descriptor is open (`release()`, or the process's end)."""

    def __init__(self, path: str | Path, refuse: Callable[[str], Exception]):
        self.path = Path(path)
        self._refuse = refuse
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "HolderLock":
        """Take the lock without waiting (creating its directory if needed) and record this process in the lock
        file. Returns self. Where the file system cannot lock (ENOLCK, EOPNOTSUPP, ...): a warning, no lock.

        Raises:
            the `refuse` exception: another process holds it (its message names the holder).
            OSError: the directory or the lock file cannot be created.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's record stays
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self._refuse(_holder(self.path)) from None
            if err.errno in _NO_LOCKING:
                logger.warning("cannot lock %s on this file system (%s): a second taker would not be refused",
                               self.path, os.strerror(err.errno))
                return self
            raise
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        # A flock belongs to the open file, which forked children (DataLoader workers) share: without this, a
        # killed rank 0's workers would hold the lock on until they notice their parent is gone (~5 s).
        os.register_at_fork(after_in_child=self._forget)
        return self

    def _forget(self) -> None:
        """In a forked child: drop this process's reference to the lock (the parent keeps it)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def release(self) -> None:
        """Unlock (closing the descriptor releases the flock); the file stays, naming the last holder."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RunDirLock(HolderLock):
    """The lock of one run directory (see the module docstring). `acquire()` once on rank 0, before the process
    group; raises `RunDirBusy` naming the directory, the holder and what to do."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / LOCK_FILE, lambda holder: RunDirBusy(
            f"run directory {self.run_dir} is in use by another job: {holder} (lock {self.path}); one job per "
            "run directory: wait for it to end, or choose another run_dir"))



def auto_run_dir(recipe_name: str, runs: Path = Path("runs")) -> Path:
    """A new run directory for a job without a fixed `run_dir`: the first of `runs/<recipe_name>-<UTC
    time>[-<k>]` (absolute: ranks of other nodes may start in another working directory) that this call creates
    with mkdir, so two jobs started in the same second get two directories and a name another job reserved (not
    locked until its ranks start) is never taken. The one home of the rule: rank 0's preflight
    (`albert_dist.apps.pretrain.preflight.lock_auto_run_dir`) and the launch scripts (`albert-dist train --print-run-dir
    auto`) both name a run here.

    Raises:
        ValueError: no free name after 99 tries, or the directory cannot be created, naming it.
    """
    base = (runs / f"{recipe_name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}").absolute()
    for k in range(1, 100):
        candidate = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as err:
            raise ValueError(f"cannot create the run directory {str(candidate)!r}: {err.strerror or err}") from None
    raise ValueError(f"run_dir: no free run directory {base}[-k] after 99 tries")


__all__ = ["LOCK_FILE", "HolderLock", "RunDirBusy", "RunDirLock", "auto_run_dir", "flock", "read_holder"]
