"""A `albert-dist data prepare` output's manifest, and an object-store output's upload (`publish`).

A URL output is built in a local work directory (`remote_work_root`) and uploaded when complete: the shards,
then the manifest last, so a reader of the bucket never sees a manifest naming a missing shard.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

MANIFEST_NAME = "manifest.json"


def load_manifest(output: str | Path) -> Optional[dict]:
    """The manifest of a prepare output directory or object-store prefix, or None when there is none (or it does
    not parse). Raises `albert_dist.data.sources.store.StoreError` for a denied prefix or missing credentials."""
    from albert_dist.data.sources import store

    try:
        text = store.read_text(store.join(str(output), MANIFEST_NAME))
        return None if text is None else json.loads(text)
    except (OSError, ValueError) as err:
        if isinstance(err, store.StoreError):
            raise
        return None


def remote_work_root(output: str) -> Path:
    """Local work directory of a prepare whose ``--output`` is a URL: the same for every run on that URL (so a
    rerun resumes), under ``$ALBERT_DIST_PREPARE_TMP`` or the system temporary directory."""
    import tempfile

    root = Path(os.environ.get("ALBERT_DIST_PREPARE_TMP") or tempfile.gettempdir())
    return root / f"albert-dist-prepare-{hashlib.sha256(output.encode()).hexdigest()[:16]}"


def publish(shards_dir: Path, output: str, manifest: dict, previous: Optional[dict]) -> None:
    """Upload a finished local output (shards + manifest.json) to the object-store prefix ``output``.

    Order is what makes it safe for readers (`albert_dist.data.sources.pieces` and the loader read the manifest and the
    shards it names): a previous manifest (``--overwrite``) is deleted first, so no reader pairs it with new
    shards; each shard is one PUT (a multipart upload for a large one), which an object store makes visible only
    once complete, so no reader sees a half-written shard; the manifest is uploaded last, one PUT as well (no
    temporary key and move: an object store has no rename, a move is a copy, and a PUT is already all or
    nothing), so a manifest never names a shard that is not there. Shards of the previous
    output that the new one does not name are deleted at the end. Raises `albert_dist.data.sources.store.StoreError`.
    """
    from albert_dist.data.sources import store

    fs, root = store.filesystem(output)
    root = root.rstrip("/")
    url = output.rstrip("/")
    if previous is not None:
        store.call(url, "delete the previous manifest", fs.rm_file, f"{root}/{MANIFEST_NAME}")
    names = [e["path"] for e in manifest["files"]]
    for name in names:
        store.call(url, f"upload {name}", fs.put_file, str(shards_dir / name), f"{root}/{name}")
    store.call(url, "upload the manifest", fs.put_file, str(shards_dir / MANIFEST_NAME), f"{root}/{MANIFEST_NAME}")
    stale = [e["path"] for e in (previous or {}).get("files", []) if e.get("path") not in names]
    for name in stale:
        store.call(url, f"delete the previous {name}", fs.rm_file, f"{root}/{name}")
