"""Send what a finished job could not to MLflow (the ``wandb sync`` habit; `albert-dist tracking sync RUN_DIR`,
whose front end is `albert_dist.cli.tracking`).

    albert-dist tracking sync runs/albert-tiny-20260101-120000 [--tracking-uri URI] [--timeout-s 600]

Creates the job's MLflow run if its server never answered (name, experiment, tags from the run directory's
``mlflow_run.json``) or reopens the recorded one, then sends the params (``params.json``), every metric of
``metrics.jsonl`` the run does not hold yet (original steps and timestamps), the uploads left pending, and
ends the run with the job's status. Running it twice sends nothing the second time.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import CheckpointError, read_latest, read_meta
from albert_dist.tracking.base import METRICS_FILE, PARAMS_FILE, NullTracker
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.tracker import STATE_FILE, MLflowTracker, read_state

log = logging.getLogger(__name__)


def sync(run_dir: str, tracking_uri: Optional[str] = None, timeout_s: float = 600.0) -> dict:
    """Replay ``run_dir`` into its MLflow run (module docstring); returns what is still left (all zero: done).

    Raises:
        ValueError: ``run_dir`` holds neither ``mlflow_run.json`` nor ``metrics.jsonl``.
        ConnectionError: the server did not answer within 30 s.
    """
    state = read_state(run_dir)
    if not state and not (Path(run_dir) / METRICS_FILE).is_file():
        raise ValueError(f"{run_dir}: no {STATE_FILE} or {METRICS_FILE}: not a run directory")
    if tracking_uri:  # e.g. the store moved; the state file records where it was
        state["tracking_uri"] = tracking_uri
        (Path(run_dir) / STATE_FILE).write_text(json.dumps(state, indent=1))
    cfg = TrackingConfig(tracking_uri=state.get("tracking_uri"), experiment_name=state.get("experiment_name", "albert_dist"),
                         close_timeout_s=timeout_s, flush_interval_s=0.5, log_system_metrics=False)
    tracker = MLflowTracker(cfg, run_dir=run_dir, resume_run_id=state.get("run_id"), local=NullTracker(), replay=True)
    if tracker.run_id is None:
        tracker.close("KILLED")
        raise ConnectionError(f"MLflow at {tracker._public_uri()} did not answer within {cfg.connect_timeout_s:g} s")
    params = Path(run_dir) / PARAMS_FILE
    if params.is_file():
        tracker.log_params(json.loads(params.read_text()))
    left = tracker.close(state.get("status") or job_status(run_dir))
    log.info("run %s: %s", tracker.run_id, "everything sent" if not any(left.values()) else f"left: {left}")
    return left


def job_status(run_dir: str) -> str:
    """The MLflow status of a job that recorded none (``tracking.enabled=false``, or it died before closing),
    from its newest checkpoint's reason: "final" -> FINISHED, "stop" (a stop signal's) -> KILLED; KILLED
    when there is no checkpoint or it was an interval one (the job ended without a last save). The checkpoints
    are in ``<run_dir>/checkpoints`` or the run's ``checkpoint.dir`` (its config.yaml)."""
    ckpt = Path(run_dir) / "checkpoints"
    try:
        import yaml

        ckpt = Path((yaml.safe_load((Path(run_dir) / "config.yaml").read_text()).get("checkpoint") or {}).get("dir")
                    or ckpt)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        pass
    tag = read_latest(ckpt)
    try:
        reason = read_meta(ckpt / tag).get("reason") if tag else None
    except CheckpointError:
        reason = None
    return "FINISHED" if reason == "final" else "KILLED"
