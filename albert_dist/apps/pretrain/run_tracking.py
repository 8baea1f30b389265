"""The app's MLflow glue (what the trainer calls): build the job's tracker, fetch a run's checkpoint for
``--resume-from``, and write (and log) the final model. Kept here so the trainer's MLflow code is three calls.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

from albert_dist.data.sources.discover import resolve_path
from albert_dist.distributed.collectives import all_gather_object, barrier, broadcast_object
from albert_dist.model.sharing import model_param_counts
from albert_dist.runs.mlflow import fetch_checkpoint
from albert_dist.runs.source import FINAL_MODEL
from albert_dist.runs.weights import export_trained_model
from albert_dist.tracking.params import hostname
from albert_dist.tracking.secrets import scrub_text
from albert_dist.tracking.tracker import (MLflowTracker, NodeTracker, RunMovedOn, parse_run_ref, read_run_id,
                                          resolve_tracking_uri)

log = logging.getLogger(__name__)


def fetch_run_checkpoint(cfg: Any, ref: str, ckpt_dir: str | Path, rank: int, local_rank: int) -> str:
    """Download the newest complete checkpoint of MLflow run ``ref`` into ``ckpt_dir`` (collective).

    Global rank 0 downloads; a node that then does not see the files (no shared file system) downloads its
    own copy on its local rank 0. Afterwards ``<ckpt_dir>/latest`` names the checkpoint, so the engine's
    ``--resume auto`` logic loads it.

    Args:
        cfg: the ``TrackingConfig`` (tracking URI).
        ref: run id or ``runs:/<run_id>``.
        ckpt_dir: the job's checkpoint directory.
        rank, local_rank: this process's global and node-local rank.

    Returns:
        the run id.

    Raises:
        ValueError: ``ref`` is not a run reference. RuntimeError: on every rank, when rank 0 could not fetch
        a complete checkpoint (message included).
    """
    run_id = parse_run_ref(ref)
    uri = resolve_tracking_uri(cfg.tracking_uri)
    result: tuple[Optional[str], Optional[str]] = (None, None)
    if rank == 0:
        try:
            step, tag_dir = fetch_checkpoint(uri, run_id, str(ckpt_dir))
            print(f"--resume-from {ref} -> {os.path.basename(tag_dir)}, newest complete checkpoint (step {step})",
                  flush=True)
            result = (os.path.basename(tag_dir), None)
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank
            result = (None, f"{type(exc).__name__}: {exc}")
    tag, error = broadcast_object(result)
    if error is not None:
        raise RuntimeError(f"--resume-from {ref}: {error}")
    if local_rank == 0 and rank != 0 and not (Path(ckpt_dir) / tag).is_dir():
        fetch_checkpoint(uri, run_id, str(ckpt_dir))
    barrier()
    return run_id


def open_tracker(cfg: Any, run_dir: str | Path, rank: int, local_rank: int = 0, **kwargs: Any) -> Any:
    """The job's MLflow tracker on every rank (collective): the hosts of all ranks are gathered, global rank 0
    opens the run (`albert_dist.tracking.tracker.MLflowTracker`, ``kwargs`` passed on) and hands the run id,
    or why the run cannot be opened, to the others; they get a `NodeTracker` (system metrics of their node
    on its local rank 0 when the job spans several hosts).

    Args:
        cfg: the ``TrackingConfig``.
        run_dir: the job's run directory.
        rank, local_rank: this process's global and node-local rank.

    Raises:
        RuntimeError: on every rank, when the server answered that the run cannot be opened; `RunMovedOn` (on
            every rank) when it went on from another run directory.
    """
    hosts = all_gather_object(hostname())
    tracker, error, moved = None, None, False
    if rank == 0:
        try:
            tracker = MLflowTracker(cfg, run_dir=str(run_dir), hosts=hosts, **kwargs)
        except Exception as exc:  # noqa: BLE001 - raised on every rank below
            moved = isinstance(exc, RunMovedOn)
            error = str(exc) if isinstance(exc, (RuntimeError, RunMovedOn)) else scrub_text(
                f"MLflow run could not be opened ({resolve_tracking_uri(cfg.tracking_uri)}): {type(exc).__name__}: {exc}")
    run_id, error, moved = broadcast_object([tracker.run_id if tracker else None, error, moved])
    if error is not None:
        raise RunMovedOn(error) if moved else RuntimeError(error)
    if tracker is None:
        tracker = NodeTracker(cfg, run_id, hostname() if local_rank == 0 and len(set(hosts)) > 1 else None)
    return tracker


def build_tracker(cfg: Any, run_dir: str | Path, rank: int, world_size: int, local: Any, *, local_rank: int = 0,
                  resume_from: Optional[str] = None, resuming: bool = False, resumed_step: Optional[int] = None,
                  model: Any = None) -> Any:
    """The job's tracker: `MLflowTracker` over ``local`` (collective: call on every rank), or ``local`` alone
    when ``cfg.tracking.enabled`` is false.

    Args:
        cfg: the ``TrainConfig``.
        run_dir: the job's run directory (already holding config.yaml and ds_config.json on rank 0).
        local: the console/metrics.jsonl tracker (a no-op tracker on other ranks).
        resume_from: the ``--resume-from`` run reference, continued when given.
        resuming: the job resumes from a local checkpoint (``--resume``): continue the MLflow run a previous
            attempt recorded in ``run_dir`` (a requeued Slurm job), if any.
        resumed_step: the step of the checkpoint the job resumed from (its artifact is never deleted).
        model: the module being trained, for the derived parameter counts.
    """
    if not cfg.tracking.enabled:
        return local
    run_id = parse_run_ref(resume_from) if resume_from else (read_run_id(str(run_dir)) if resuming else None)
    tracker = open_tracker(cfg.tracking, run_dir, rank, local_rank, resume_run_id=run_id, local=local,
                           resumed_step=resumed_step if resuming and not resume_from else None,
                           keep_last_checkpoints=cfg.tracking.keep_last_checkpoints or cfg.checkpoint.keep_last,
                           keep_steps=() if not resumed_step else (resumed_step,),
                           tags={"mlflow.source.name": "albert-dist train", "run_dir": str(Path(run_dir).resolve()),
                                 **({"init_from": cfg.model.init_from} if cfg.model.init_from else {})})
    if rank == 0:
        if model is not None:
            tracker.log_params({"derived": model_param_counts(model)})
        for name in ("config.yaml", "ds_config.json"):
            if (Path(run_dir) / name).is_file():
                tracker.log_artifact(str(Path(run_dir) / name), "config")
        tokenizer = cfg.data.tokenizer_path
        if tokenizer:
            if resolve_path(tokenizer).is_file():
                tracker.log_artifact(str(resolve_path(tokenizer)), "tokenizer")
    return tracker


def log_trained_model(tracker: Any, cfg: Any, ckpt_dir: str | Path, tag: str, run_dir: str | Path) -> Optional[dict]:
    """Rank 0, after the final checkpoint: export the consolidated fp32 and HF models to
    ``<run_dir>/<FINAL_MODEL>`` (whether or not MLflow tracking is on) and, with ``tracking.log_model``,
    queue them as the run's ``model/fp32`` and ``model/hf`` artifacts (the local tracker keeps no artifacts).

    Returns the written directories (`albert_dist.runs.weights.export_trained_model`), or None when the export failed:
    logged, and tagged ``model_export_error`` (the checkpoint itself stays the job's result).
    """
    out = Path(run_dir) / FINAL_MODEL
    try:
        written = export_trained_model(cfg.model, str(ckpt_dir), tag, str(out), cfg.data.tokenizer_path)
    except Exception as exc:  # noqa: BLE001
        log.exception("final model export failed")
        tracker.set_tags({"model_export_error": f"{type(exc).__name__}: {exc}"[:5000]})
        return None
    if cfg.tracking.log_model:
        for kind, path in written.items():
            tracker.log_artifact(path, f"model/{kind}", redact_keys=False)
    return written
