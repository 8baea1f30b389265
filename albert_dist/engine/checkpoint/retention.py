"""Retention: which checkpoints a job keeps (rank 0, after each verified save).
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import step_dirs, step_of, verify

logger = logging.getLogger(__name__)



def prune(ckpt_dir: str | Path, keep_last: int, protect: Optional[str] = None) -> list[str]:
    """Retention (rank 0): keep the newest `keep_last` verified checkpoints, and `protect` (the checkpoint the
    job resumed from) while no newer verified one exists; delete every other step directory, verified or not,
    with its universal copy. Deletes nothing when no checkpoint verifies. Returns the removed names."""
    ckpt_dir = Path(ckpt_dir)
    steps = step_dirs(ckpt_dir)
    good = [s for s, tag in steps if verify(ckpt_dir / tag) is None]  # newest first
    if not good:
        return []
    keep = set(good[:keep_last])
    protect_step = step_of(protect) if protect else None
    if protect_step is not None and protect_step in good and not any(s > protect_step for s in good):
        keep.add(protect_step)
    removed = []
    for entry in sorted(ckpt_dir.iterdir()):
        name = entry.name
        base = name[: -len("_universal")] if name.endswith("_universal") else name
        step = step_of(base)
        if step is None or not entry.is_dir() or step in keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(name)
    if removed:
        logger.info("retention (keep_last=%d): removed %s", keep_last, ", ".join(removed))
    return removed
