"""One `albert-dist data prepare` per output at a time (`OutputLock`: a second is refused naming the holder)."""
from __future__ import annotations

from pathlib import Path

from albert_dist.job.lock import HolderLock

#: the lock beside a local output, ``.<name>.prepare-lock`` (`OutputLock`): kept after the run (deleting it while
#: a holder runs would let a second prepare lock a new file); a dotfile, so a glob or directory source skips it
LOCK_SUFFIX = ".prepare-lock"


class OutputBusy(ValueError):
    """Another `albert-dist data prepare` is writing the same output (exit 2; the message names the holder)."""


class OutputLock(HolderLock):
    """One prepare per output: an exclusive lock (`albert_dist.job.lock.HolderLock`) on ``path`` (beside the
    output's work directory), held until `release` or the process's end (the kernel drops it however the process
    ends, so a killed prepare never leaves it stuck); a second prepare gets `OutputBusy` naming the holder.

    Why: two prepares on one output each took the other's live work directory for an interrupted run, and one
    could finish with a manifest whose sha256 did not match a shard the other had rewritten (issue 26). An
    object-store output is built in a local work directory per URL
    (`albert_dist.data.prepare.publish.remote_work_root`), so this refuses a second prepare of one URL on the
    same node; two nodes preparing one URL are not detected (object stores have no
    lock), and the last upload wins whole: each one's manifest still matches the shards it names.
    """

    def __init__(self, path: Path, output: str) -> None:
        self.output = output
        super().__init__(path, lambda holder: OutputBusy(
            f"--output {output} is being written by another albert-dist data prepare: {holder} (lock {path}); "
            "wait for it to end, or choose another output"))
