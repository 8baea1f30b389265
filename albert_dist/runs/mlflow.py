"""A run read from MLflow: the same rule as a run directory (`albert_dist.runs.source.choose`) over what the run
holds (`albert_dist.tracking.fetch.run_holdings`), and the one download of what it picks, into a local cache laid
out as a run directory (``checkpoints/step_<N>``, the final model, ``tokenizer/``). `--resume-from`,
`model.init_from` and `albert-dist finetune` all read MLflow runs through `fetch` / `fetch_checkpoint`.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import tag_for, verify
from albert_dist.runs.source import FINAL_MODEL, Source, SourceNotFound, choose, find


def cache_dir(run_id: str) -> Path:
    """Where an MLflow run's weights are downloaded: ``$XDG_CACHE_HOME/albert_dist/runs/<run_id>`` (per user)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "albert_dist" / "runs" / run_id


def fetch_checkpoint(uri: str, run_id: str, save_dir: str | Path, step: Optional[int] = None) -> tuple[int, str]:
    """Run `run_id`'s complete checkpoint `step` (None: the newest) into the DeepSpeed checkpoint directory
    `save_dir` (`--resume-from`: the optimizer, schedule and data position too), ``latest`` naming it.
    Returns ``(step, tag_dir)``.

    Raises:
        FileNotFoundError: no complete checkpoint (at `step`). RuntimeError: the download does not match its
        marker; `albert_dist.tracking.fetch.RunReadError` (a RuntimeError): MLflow cannot read the run.
    """
    from albert_dist.tracking.fetch import download_run_checkpoint

    return download_run_checkpoint(uri, run_id, str(save_dir), step)


def fetch(ref: str, run_id: str, uri: str, step: Optional[int] = None, cache: Optional[Path] = None) -> Source:
    """The `Source` MLflow run `run_id` means by the rule, its weights downloaded once into `cache` (default
    `cache_dir`); the tokenizer the weights' config names when it is on this machine, else the run's logged
    ``tokenizer/`` artifact.

    Raises:
        SourceNotFound: the run holds no checkpoint nor final model (or no step `step`, listing those it holds).
        RuntimeError: MLflow cannot read the run (`RunReadError`), or a download does not match its marker.
    """
    from albert_dist.tracking.fetch import download_run_trained_model, download_run_tokenizer, run_holdings

    cache = cache_dir(run_id) if cache is None else Path(cache)
    held = run_holdings(uri, run_id)
    newest = held.checkpoints[0] if held.checkpoints else None
    picked = choose(newest, held.final_step, held.has_final, step)
    if picked is None and step is not None and step in held.checkpoints:
        picked = "checkpoint"
    if picked is None:
        what = (f"no complete checkpoint step {step} (it holds steps {', '.join(map(str, sorted(held.checkpoints)))})"
                if step is not None and held.checkpoints else
                "no complete checkpoint under checkpoints/ and no final model (model/fp32/)")
        raise SourceNotFound(f"MLflow run {run_id} ({uri}): {what}")
    if picked == "final":
        local = download_run_trained_model(uri, run_id, str(cache / FINAL_MODEL))
        found = find(local, f"runs:/{run_id}")
        at = held.final_step if held.final_step is not None else held.max_steps if newest is None else None
        why = (f"--step {step}, the final model" if step is not None else "the final model, no checkpoint left"
               if newest is None else "the final model, the same step as the newest complete checkpoint")
        found = dataclasses.replace(found, step=at, why=why)
    else:
        at = step if step is not None else newest
        tag_dir = cache / "checkpoints" / tag_for(at)
        if not tag_dir.is_dir() or verify(tag_dir) is not None:
            _, tag = fetch_checkpoint(uri, run_id, cache / "checkpoints", at)
            tag_dir = Path(tag)
        found = dataclasses.replace(find(tag_dir, f"runs:/{run_id}"),
                                    why=f"--step {step}" if step is not None else "newest complete checkpoint")
    tokenizer = found.tokenizer
    if tokenizer is None or not Path(tokenizer).exists():  # another machine's path: the run's logged copy
        logged = download_run_tokenizer(uri, run_id, cache)
        tokenizer = logged if logged is not None else tokenizer
    run_dir = Path(held.run_dir) if held.run_dir and Path(held.run_dir).is_dir() else None
    return dataclasses.replace(found, tokenizer=tokenizer, run_id=run_id, run_dir=run_dir)
