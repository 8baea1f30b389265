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


def write_latest(ckpt_dir: str | Path, tag: str, name: str = LATEST) -> None:
    """Point `<ckpt_dir>/<name>` at `tag` atomically: a reader sees the old or the new tag, never a partial one."""
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir / f".{name}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(tag)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt_dir / name)
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
