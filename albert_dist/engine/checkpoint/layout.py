"""A checkpoint directory on disk, torch-free: tag names, the atomic `latest` pointer, the `albert_dist.json`
metadata file and verification (the engine writes them, tracking uploads and restores them).

A checkpoint directory holds one ``step_<N>`` tag directory per checkpoint (N = optimiser steps done) and a
``latest`` file naming the newest complete one, as DeepSpeed's ``load_checkpoint(load_dir)`` reads it.
``latest`` is replaced atomically (temporary file, fsync, ``os.replace``, fsync of the directory), so a reader
sees the old or the new tag, never a partial one, and a crash leaves the previous checkpoint in place.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

LATEST = "latest"
META_FILE = "albert_dist.json"
#: Version of `META_FILE`; 2 adds "files" and "config".
META_FORMAT = 2
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


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used or written; the message names the checkpoint directory."""


# ------------------------------------------------------------------------------------- verification
def payload_files(tag_dir: str | Path) -> dict[str, int]:
    """Relative path ("/"-separated) -> size in bytes of every regular file below `tag_dir`, except META_FILE."""
    return list_files(tag_dir, exclude=(META_FILE,))


def read_meta(tag_dir: str | Path) -> dict[str, Any]:
    """The parsed `<tag_dir>/albert_dist.json`; raises `CheckpointError` naming the file when it cannot."""
    path = Path(tag_dir) / META_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {tag_dir}: no {META_FILE} (its save did not complete)")
    try:
        meta = json.loads(path.read_text())
        for key in ("step", "world_size", "zero_stage", "config_hash"):
            meta[key]  # noqa: B018 - presence check
        return meta
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {tag_dir}: cannot read {path}: {type(err).__name__}: {err}") from err


def verify(tag_dir: str | Path) -> Optional[str]:
    """Why the checkpoint `tag_dir` cannot be trusted, or None when it verifies (metadata readable, every
    listed file present with its listed size). Checkpoints of format 1 (no file list) verify on their
    metadata alone."""
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        return "directory missing"
    try:
        meta = read_meta(tag_dir)
    except CheckpointError as err:
        return str(err).split(": ", 1)[1]
    files = meta.get("files")
    if files is None:
        return None
    if not files:
        return f"{META_FILE} lists no files"
    for rel, size in files.items():
        path = tag_dir / rel
        try:
            actual = path.stat().st_size
        except OSError:
            return f"{rel} is missing ({META_FILE} lists {size} bytes)"
        if actual != size:
            return f"{rel} has {actual} bytes, {META_FILE} lists {size} (truncated or rewritten)"
    return None


def step_dirs(ckpt_dir: Path, universal: bool = False) -> list[tuple[int, str]]:
    """(step, tag) of every step_<N> directory, newest first; with `universal`, their ``step_<N>_universal``
    copies too (as (N, name)). The one lister of a checkpoint directory's step directories."""
    if not ckpt_dir.is_dir():
        return []
    suffix = "_universal"
    found = [(step_of(p.name[: -len(suffix)] if universal and p.name.endswith(suffix) else p.name), p.name)
             for p in ckpt_dir.iterdir() if p.is_dir()]
    return sorted(((s, t) for s, t in found if s is not None), reverse=True)
