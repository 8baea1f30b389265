"""`albert_dist.runs`: the one reader of what a job leaves behind. A run directory, a checkpoint directory, a
checkpoint, a final model, a transformers directory or an MLflow run id -> one `Source` record by one rule
(`albert_dist.runs.source`; docs/checkpoints.md "Which weights a run means"), the weights read one way
(`albert_dist.runs.weights`), an MLflow run downloaded one way (`albert_dist.runs.mlflow`). `albert-dist export`,
`model.init_from`, `albert-dist finetune` and `--resume-from` read through it; each prints `Source.took`.

Above config and tracking, below the apps (tests/unit/test_layering.py's APP_ORDER).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from albert_dist.runs.source import Source, SourceNotFound, choose, find


def resolve(ref: str, step: Optional[int] = None, tracking_uri: Optional[str] = None,
            cache: Optional[Path] = None) -> Source:
    """The `Source` `ref` names: a local path (relative: to the working directory, else the checkout; `find`) or
    an MLflow run id (``<id>`` or ``runs:/<id>``) in the store `tracking_uri` (None: MLFLOW_TRACKING_URI or the
    default; `albert_dist.runs.mlflow.fetch`, into `cache`).

    Raises:
        SourceNotFound: neither an existing path nor a run id; nothing to take (see `find`, `fetch`).
        CheckpointError: checkpoints that do not verify. ValueError: the store does not exist.
        RuntimeError: MLflow cannot read the run, or a download does not match its marker.
    """
    from albert_dist.data.sources.discover import resolve_path

    path = resolve_path(ref)
    if path.exists():
        return find(path, ref, step)
    from albert_dist.tracking.tracker import parse_run_ref, require_existing_store, resolve_tracking_uri

    try:
        run_id = parse_run_ref(ref)
    except ValueError:
        raise SourceNotFound(f"{ref}: no such directory, and not an MLflow run id (32 hex digits or "
                             "runs:/<id>)") from None
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri, f"MLflow run {run_id}")
    from albert_dist.runs.mlflow import fetch

    return fetch(ref, run_id, uri, step, cache)


__all__ = ["Source", "SourceNotFound", "choose", "find", "resolve"]
