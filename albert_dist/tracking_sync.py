"""`albert-dist tracking sync RUN_DIR`: send what a finished job could not (the ``wandb sync`` habit).

    albert-dist tracking sync runs/albert-tiny-20260101-120000 [--tracking-uri URI] [--timeout-s 600]

Creates the job's MLflow run if its server never answered (name, experiment, tags from the run directory's
``mlflow_run.json``) or reopens the recorded one, then sends the params (``params.json``), every metric of
``metrics.jsonl`` the run does not hold yet (original steps and timestamps), the uploads left pending, and
ends the run with the job's status. Running it twice sends nothing the second time.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

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
    left = tracker.close(state.get("status") or "KILLED")  # no status: the job died without closing
    log.info("run %s: %s", tracker.run_id, "everything sent" if not any(left.values()) else f"left: {left}")
    return left


def cli(argv: Sequence[str]) -> int:
    """Entry point of `albert-dist tracking`; 0 when everything arrived, 1 when something is left, 2 for bad
    arguments."""
    parser = argparse.ArgumentParser(prog="albert-dist tracking", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sync", help="send a run directory's unsent metrics, params and uploads to MLflow")
    p.add_argument("run_dir")
    p.add_argument("--tracking-uri", default=None, help="default: the one recorded in RUN_DIR/mlflow_run.json")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long (default 600)")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse exits on --help / errors; the dispatcher owns the exit code
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        left = sync(args.run_dir, args.tracking_uri, args.timeout_s)
    except ValueError as exc:
        print(f"albert-dist tracking sync: {exc}", file=sys.stderr)
        return 2
    except (ConnectionError, RuntimeError) as exc:
        print(f"albert-dist tracking sync: {exc}", file=sys.stderr)
        return 1
    return 1 if any(left.values()) else 0
