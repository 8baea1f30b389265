"""The names inside a checkpoint directory, torch-free (the engine writes them, tracking uploads and restores them).

A checkpoint directory holds one ``step_<N>`` tag directory per checkpoint (N = optimiser steps done) and a
``latest`` file naming the newest complete one, as DeepSpeed's ``load_checkpoint(load_dir)`` reads it.
``latest`` is replaced atomically (temporary file, fsync, ``os.replace``, fsync of the directory), so a reader
sees the old or the new tag, never a partial one, and a crash leaves the previous checkpoint in place.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

LATEST = "latest"
_TAG_RE = re.compile(r"^step_(\d+)$")


def tag_for(step: int) -> str:
    """Checkpoint tag of optimiser step `step`: "step_<step>"."""
    return f"step_{step}"


def step_of(tag: str) -> Optional[int]:
    """Inverse of `tag_for` (also for a path ending in a tag); None for any other name (universal copies,
    temporary files)."""
    match = _TAG_RE.match(os.path.basename(str(tag).rstrip("/")))
    return int(match.group(1)) if match else None


def read_latest(ckpt_dir: str | Path) -> Optional[str]:
    """The tag in `<ckpt_dir>/latest`, or None if there is none (no complete checkpoint yet)."""
    path = Path(ckpt_dir) / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag or None


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside directory `path` durable (fsync of the directory itself)."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_latest(ckpt_dir: str | Path, tag: str, name: str = LATEST) -> None:
    """Point `<ckpt_dir>/<name>` at `tag` atomically: a reader sees the old or the new tag, never a partial one.
    A failed write (disk full) leaves no temporary file and the previous pointer in place."""
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir / f".{name}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(tag)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, ckpt_dir / name)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(ckpt_dir)


def list_files(root: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, int]:
    """Relative path ("/"-separated) -> size in bytes of every regular file below `root` (symlinks skipped),
    sorted; files named in `exclude` (a checkpoint's own marker or metadata file) are left out."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name not in exclude}
