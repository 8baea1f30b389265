"""The holder's record in a lock file (`data prepare`'s output lock, albert_dist.data.prepare.lock, and the run
directory's, albert_dist.job.run_lock): a JSON object the holder writes right after it takes the flock."""
from __future__ import annotations

import json
import time
from pathlib import Path


def read_holder(path: Path, wait_s: float = 1.0) -> dict:
    """The record in lock file ``path`` ({} when unreadable or not JSON). A holder that has just taken the lock
    writes it a moment later (1 of 5 same-instant starts read an empty file), so an empty file is read again for up
    to ``wait_s`` seconds."""
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
