"""How a job loads the checkpoint it resumes from: planned once from the checkpoint directory alone, before any
process group (`plan_load` -> `LoadPlan`: which checkpoint, what the config's changes mean there, whether it
loads through a universal checkpoint), and what the one collective resume call returns (`Resumed`, from
`CheckpointManager.resume`).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from albert_dist.engine.checkpoint.drift import Drift, Rules, check_drift, log_drift
from albert_dist.engine.checkpoint.choose import VerifiedCheckpoint, choose_checkpoint
from albert_dist.engine.checkpoint.layout import step_dirs
from albert_dist.engine.checkpoint.state import rng_state, set_rng_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadPlan:
    """How the job loads: the checkpoint it resumes from and what its config changes mean there (no process group
    needed to make it)."""

    point: Optional[VerifiedCheckpoint] = None
    """The verified checkpoint to load; None: a fresh start."""
    drift: Drift = field(default_factory=lambda: Drift({}))
    """The config's differences from the checkpoint's (already checked: nothing in it is refused)."""
    universal: bool = False
    """Load through DeepSpeed's universal checkpoint: the number of ranks changed (ZeRO >= 1), or a field with
    rule "convert" did (the ZeRO stage, a partition-layout option)."""

    @property
    def step(self) -> Optional[int]:
        """The checkpoint's step, None for a fresh start."""
        return None if self.point is None else self.point.step


def plan_load(resume: Optional[str], ckpt_dir: Optional[str | Path], config: dict, world_size: int,
                rules: Rules, log: bool = True) -> LoadPlan:
    """The resume `checkpoint.resume` asks for (`choose_checkpoint`: "auto" = the newest checkpoint of `ckpt_dir` that
    verifies, a path = that checkpoint), checked against `config` by `rules` (`check_drift`) and, with `log`,
    each change warned once (`log_drift`). Reads files only: call it before the process group, on every rank (all read the
    same files, so all agree).

    Args:
        resume: `checkpoint.resume` (None, "auto" or a path).
        ckpt_dir: the job's checkpoint directory (`CheckpointConfig.directory`); None when the run directory
            is chosen at start, which only an explicit path can resume from.
        config: the resolved config as plain dicts (`albert_dist.config.to_container`).
        world_size: ranks of this job.
        rules: what changing each field means (`albert_dist.config.resume_rules()`).

    Raises:
        ValueError: "auto" without a fixed place to look (`run_dir` and `checkpoint.dir` both unset); None (a
            fresh start) with step directories already in `ckpt_dir`.
        ConfigDriftError: a field that cannot change on resume differs (see `check_drift`).
        CheckpointError, FileNotFoundError: as `choose_checkpoint`.
    """
    if resume == "auto" and ckpt_dir is None:
        raise ValueError("--resume auto needs a fixed place to look: set run_dir=... (or checkpoint.dir=...)")
    if resume is None and ckpt_dir is not None and step_dirs(Path(ckpt_dir)):
        # a fresh run would overwrite the earlier run's metrics.jsonl and final model and leave its checkpoints
        # beside its own (a later --resume auto could take one of them)
        raise ValueError(f"{ckpt_dir} already holds an earlier run's checkpoints ({step_dirs(Path(ckpt_dir))[0][1]} "
                         "newest): --resume auto continues that run; a new run needs another run_dir")
    point = choose_checkpoint(resume, ckpt_dir if ckpt_dir is not None else str(resume), log=log)
    if point is None:
        if resume == "auto" and log:  # a mistyped run_dir would otherwise restart silently
            logger.warning("--resume auto: no checkpoint in %s; starting from step 0", ckpt_dir)
        return LoadPlan()
    drift = check_drift(point, config, world_size, rules)
    if log:
        log_drift(point, drift)
    return LoadPlan(point, drift, point.needs_universal(world_size) or (drift.converts and point.zero_stage > 0))


@dataclass
class Resumed:
    """What `CheckpointManager.resume` hands the training loop: the engine and this rank's training loader at
    the checkpoint's step (or fresh ones at step 0), with the global RNGs already set for the next step."""

    engine: Any
    """The DeepSpeedEngine, its state loaded."""
    loader: Any
    """This rank's training loader, continuing the saved data streams (or starting them)."""
    step: int
    """Optimiser steps done."""
    point: Optional[VerifiedCheckpoint]
    """The checkpoint resumed from; None for a fresh start."""
    metrics_states: list
    """Every saved rank's open metric interval (`MetricAccumulator.restore`); [] for a fresh start."""


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Run a block without moving the global RNGs (python, numpy, torch, CUDA): set-up work after
    `CheckpointManager.resume` (a loader iterator's base seed, a matmul benchmark, the tracker) must leave the
    first step the RNG state the resume restored."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)
