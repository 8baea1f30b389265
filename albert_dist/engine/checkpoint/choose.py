"""Which checkpoint a job resumes from, read from the checkpoint directory alone (no process group):
`choose_checkpoint` (what `checkpoint.resume` names), `newest_verified`, and what they return, a
`VerifiedCheckpoint` (`checkpoint_at`: one read from its metadata).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import (LATEST, META_FILE, CheckpointError, read_latest, read_meta, step_dirs,
                                                 step_of, verify)

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A verified checkpoint to resume from, as read from its `albert_dist.json` (no process group needed)."""

    ckpt_dir: str
    """Directory holding the tag directory (what engine.load_checkpoint takes as load_dir)."""
    tag: str
    """Tag directory name, "step_<N>"."""
    step: int
    """Optimiser steps done when it was saved."""
    world_size: int
    """Number of ranks that wrote it."""
    zero_stage: int
    """ZeRO stage it was written with."""
    config: dict = field(default_factory=dict, compare=False, hash=False)
    """The resolved config it was written with ({} for format-1 checkpoints)."""

    @property
    def path(self) -> Path:
        """The tag directory."""
        return Path(self.ckpt_dir) / self.tag

    def needs_universal(self, world_size: int) -> bool:
        """True when loading on `world_size` ranks needs DeepSpeed's universal checkpoint (re-partitioning)."""
        return self.world_size != world_size and self.zero_stage > 0


def checkpoint_at(base: Path, tag: str) -> VerifiedCheckpoint:
    """The `VerifiedCheckpoint` of the checkpoint `<base>/<tag>`, read from its metadata (`CheckpointError` when it cannot)."""
    meta = read_meta(base / tag)
    return VerifiedCheckpoint(str(base), tag, int(meta["step"]), int(meta["world_size"]), int(meta["zero_stage"]),
                       dict(meta.get("config") or {}))


def newest_verified(ckpt_dir: str | Path, log: bool = True) -> Optional[VerifiedCheckpoint]:
    """The newest `step_<N>` of `ckpt_dir` that verifies, or None when there is no step directory at all.

    With `log`, every newer directory skipped is logged as a warning with its reason, and so is a `latest`
    that names another tag. Raises `CheckpointError` when step directories exist but none verifies (listing
    each with its reason: starting over from step 0 would silently throw the run away), except when none of
    them ever completed its save (no albert_dist.json in any, no `latest`: a hang or a kill inside the run's
    first save), which throws nothing away: None, with a warning, and the save of that step replaces it.
    """
    ckpt_dir = Path(ckpt_dir)
    latest = read_latest(ckpt_dir)
    skipped = []
    for _, tag in step_dirs(ckpt_dir):
        reason = verify(ckpt_dir / tag)
        if reason is None:
            if log and latest is not None and latest != tag:
                logger.warning("%s names %s, %s; resuming from %s, the newest checkpoint that verifies",
                               ckpt_dir / LATEST, latest,
                               "which does not exist" if not (ckpt_dir / latest).is_dir() else
                               "which is not the newest verified checkpoint", ckpt_dir / tag)
            return checkpoint_at(ckpt_dir, tag)
        skipped.append(f"{tag}: {reason}")
        if log:
            logger.warning("skipping checkpoint %s: %s", ckpt_dir / tag, reason)
    if skipped and latest is None and not any((ckpt_dir / tag / META_FILE).is_file() for _, tag in step_dirs(ckpt_dir)):
        if log:
            logger.warning("no checkpoint in %s ever completed its save (%s): starting from step 0", ckpt_dir,
                           "; ".join(skipped))
        return None
    if skipped:
        raise CheckpointError(f"no checkpoint in {ckpt_dir} verifies ({'; '.join(skipped)})")
    if latest is not None and log:
        logger.warning("%s names %s, which does not exist, and there is no other checkpoint", ckpt_dir / LATEST,
                       latest)
    return None


def choose_checkpoint(resume: Optional[str], ckpt_dir: str | Path, log: bool = True) -> Optional[VerifiedCheckpoint]:
    """Where to resume from: None (fresh start) or a verified `VerifiedCheckpoint`.

    `resume` None -> None; "auto" -> `newest_verified(ckpt_dir)` (None when there is no checkpoint);
    otherwise a path to a tag directory (`.../step_<N>`), which must verify, or to a checkpoint directory,
    which is searched as "auto" does. Needs no process group; every rank reads the same files, so all agree.

    Raises:
        FileNotFoundError: an explicit path that is neither a checkpoint nor a checkpoint directory.
        CheckpointError: the named checkpoint (or every checkpoint of the directory) does not verify; the
            message names it and says why.
    """
    if resume is None:
        return None
    if resume == "auto":
        return newest_verified(ckpt_dir, log)
    path = Path(resume)
    if (path / META_FILE).is_file() or step_of(path.name) is not None and path.is_dir():
        reason = verify(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint.resume={resume!r}: checkpoint {path} does not verify: {reason}")
        return checkpoint_at(path.parent, path.name)
    if path.is_dir() and ((path / LATEST).is_file() or step_dirs(path)):
        point = newest_verified(path, log)
        if point is not None:
            return point
    raise FileNotFoundError(f"checkpoint.resume={resume!r}: neither a checkpoint directory with a "
                            f"'{LATEST}' file nor a complete checkpoint ({META_FILE} missing)")
