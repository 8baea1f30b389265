"""Retention: which checkpoints a job keeps (rank 0): `prune` after each verified save and when a job resumes
(a lowered `checkpoint.keep_last` applies at once), and `make_room` before a save when the disk is short.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import META_FILE, read_meta, step_dirs, step_of, verify

logger = logging.getLogger(__name__)

_MIB = 2**20


def _verified(ckpt_dir: Path) -> list[int]:
    """Steps of the verified checkpoints of `ckpt_dir`, newest first."""
    return [s for s, tag in step_dirs(ckpt_dir) if verify(ckpt_dir / tag) is None]


def _remove(ckpt_dir: Path, step: int) -> list[str]:
    """Delete step_<step> and its universal copy; returns the names removed."""
    removed = []
    for name in (f"step_{step}", f"step_{step}_universal"):
        if (ckpt_dir / name).is_dir():
            shutil.rmtree(ckpt_dir / name, ignore_errors=True)
            removed.append(name)
    return removed


def prune(ckpt_dir: str | Path, keep_last: int, protect: Optional[str] = None,
          healthy: Optional[str] = None) -> list[str]:
    """Retention (rank 0): keep the newest `keep_last` verified checkpoints, `protect` (the checkpoint the
    job resumed from) while no newer verified one exists, and `healthy` (the newest checkpoint whose next step's
    loss was read healthy, `albert_dist.engine.divergence`) always; delete every other step directory, verified or
    not, with its universal copy. Deletes nothing when no checkpoint verifies. Returns the removed names."""
    ckpt_dir = Path(ckpt_dir)
    good = _verified(ckpt_dir)
    if not good:
        return []
    keep = set(good[:keep_last])
    protect_step = step_of(protect) if protect else None
    if protect_step is not None and protect_step in good and not any(s > protect_step for s in good):
        keep.add(protect_step)
    if healthy and step_of(healthy) is not None:
        keep.add(step_of(healthy))
    removed = []
    for step, name in sorted(step_dirs(ckpt_dir, universal=True), key=lambda found: found[1]):
        if step in keep:
            continue
        shutil.rmtree(ckpt_dir / name, ignore_errors=True)
        removed.append(name)
    if removed:
        logger.info("retention (keep_last=%d): removed %s", keep_last, ", ".join(removed))
    return removed


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path` (its nearest existing
    ancestor when `path` does not exist yet): `statvfs`'s f_bavail × f_frsize, what `df` shows as Avail."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def checkpoint_bytes(tag_dir: str | Path) -> int:
    """Bytes of the verified checkpoint `tag_dir` on disk: its files as `albert_dist.json` lists them, plus that
    file. 0 when the metadata cannot be read."""
    tag_dir = Path(tag_dir)
    try:
        files = read_meta(tag_dir).get("files") or {}
        return sum(int(size) for size in files.values()) + (tag_dir / META_FILE).stat().st_size
    except (OSError, RuntimeError, ValueError):
        return 0


def last_checkpoint_bytes(ckpt_dir: str | Path) -> tuple[Optional[str], int]:
    """(tag, bytes) of the newest verified checkpoint of `ckpt_dir`, or (None, 0) when there is none: what the
    next save will need, give or take the data-loader state."""
    ckpt_dir = Path(ckpt_dir)
    good = _verified(ckpt_dir)
    if not good:
        return None, 0
    tag = f"step_{good[0]}"
    return tag, checkpoint_bytes(ckpt_dir / tag)


def make_room(ckpt_dir: str | Path, need_bytes: int, keep_last: int, protect: Optional[str] = None,
              healthy: Optional[str] = None) -> list[str]:
    """Headroom before a save (rank 0): while the file system holding `ckpt_dir` has fewer than `need_bytes`
    free (the size of the last checkpoint), delete step directories, oldest first, before the save instead of
    after it (retention alone needs room for `keep_last` + 1 checkpoints): first the unverified ones, then
    verified ones, so fewer than `keep_last` may remain. Never deleted: the newest verified checkpoint (the one
    to fall back on if this save fails), `protect` (the checkpoint the job resumed from) and `healthy` (as
    `prune`'s). Returns the removed
    names; logs a warning saying what was removed and why, and another when the room is still short.
    """
    ckpt_dir = Path(ckpt_dir)
    free = free_bytes(ckpt_dir)
    if need_bytes <= 0 or free >= need_bytes:
        return []
    good = _verified(ckpt_dir)
    keep = {good[0]} if good else set()
    protect_step = step_of(protect) if protect else None
    if protect_step is not None:
        keep.add(protect_step)
    if healthy and step_of(healthy) is not None:
        keep.add(step_of(healthy))
    steps = sorted(s for s, _ in step_dirs(ckpt_dir))  # oldest first
    candidates = [s for s in steps if s not in good] + [s for s in steps if s in good and s not in keep]
    removed: list[str] = []
    before, dropped_good = free, False
    for step in candidates:
        if free >= need_bytes:
            break
        removed += _remove(ckpt_dir, step)
        dropped_good = dropped_good or step in good
        free = free_bytes(ckpt_dir)
    if removed:
        logger.warning("%s: %.1f MiB free, a checkpoint takes about %.1f MiB (the last one's size): removed %s "
                       "before saving%s", ckpt_dir, before / _MIB, need_bytes / _MIB, ", ".join(removed),
                       f" (this file system holds fewer than checkpoint.keep_last={keep_last} + 1)"
                       if dropped_good else "")
    if free < need_bytes:
        logger.warning("only %.1f MiB free in %s, the last checkpoint took %.1f MiB: this save will probably fail "
                       "(kept: %s)", free / _MIB, ckpt_dir, need_bytes / _MIB,
                       ", ".join(f"step_{s}" for s in sorted(keep)) or "nothing")
    return removed
