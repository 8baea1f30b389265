"""`CheckpointManager`: the one place that decides about a job's checkpoints (resume, save, retention)."""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from albert_dist.engine.checkpoint.choose import VerifiedCheckpoint, newest_verified
from albert_dist.engine.checkpoint.layout import read_latest, step_dirs, step_of, tag_for, write_latest
from albert_dist.engine.checkpoint.load import load_checkpoint
from albert_dist.engine.checkpoint.resume import LoadPlan, Resumed
from albert_dist.engine.checkpoint.retention import prune
from albert_dist.engine.checkpoint.save import CheckpointSaveError, save_checkpoint
from albert_dist.engine.checkpoint.state import TrainState, seed_all, seed_for, set_rng_state
from albert_dist.engine.checkpoint.reshard import LoaderFactory, build_resumed_loader
from albert_dist.distributed.collectives import barrier

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Resumes, saves and prunes the checkpoints of one job (see the package docstring).

    Args:
        cfg: the `CheckpointConfig` (interval, keep_last, on_save_error).
        ckpt_dir: where this job saves (and "auto" looks).
        rank, world_size: this process in the job.
        config: the resolved TrainConfig as plain dicts (`albert_dist.config.to_container`), stored with every
            checkpoint and compared with the checkpoint's on resume.
        config_hash: `albert_dist.config.config_hash` of it.
        seed: `TrainConfig.seed` (dropout seeds when RNG states cannot be restored).
        plan: the job's `LoadPlan`, made before the process group (`plan_load`); a fresh start by default.

    Use: `resume(build_engine, build_loader)` once (collective) -> `maybe_save(...)` at every step the loop's
    cadence (`albert_dist.apps.pretrain.trainer.every`) saves.
    """

    def __init__(self, cfg: Any, ckpt_dir: str | Path, *, rank: int, world_size: int, config: dict,
                 config_hash: str, seed: int, plan: Optional[LoadPlan] = None):
        self.cfg = cfg
        self.ckpt_dir = Path(ckpt_dir)
        self.rank, self.world_size = rank, world_size
        self.config, self.config_hash, self.seed = config, config_hash, seed
        self.plan = plan or LoadPlan()
        self.last_saved: Optional[int] = None
        # Divergence (albert_dist.engine.divergence): the weights saved at step N are first measured by the loss of
        # step N+1, so a checkpoint is healthy once a read past its step found nothing (`confirm`).
        self.healthy: Optional[str] = None  # the newest such tag: retention always keeps it
        self._unconfirmed: list[int] = []  # steps this job saved since
        self.load_s = 0.0  # seconds `resume` spent loading the checkpoint and the saved data streams (goodput)

    def resume(self, build_engine: Callable[[dict], Any], build_loader: LoaderFactory,
               fetch: Optional[Callable[[Path], LoadPlan]] = None) -> Resumed:
        """The job's one resume call (collective): build the engine, load the planned checkpoint into it,
        continue the data streams and set the RNGs; a fresh start when the plan holds no checkpoint.

        Args:
            build_engine: `overrides -> DeepSpeedEngine`; merges `overrides` into the DeepSpeed config
                (`{"checkpoint": {"load_universal": True}}` when the checkpoint must be re-partitioned: another
                number of ranks or ZeRO stage) and initialises the engine.
            build_loader: `(rank, world_size) -> loader` of that rank's stream (`albert_dist.engine.checkpoint.reshard`
                calls it for the old ranks' streams on another number of ranks).
            fetch: `fetch(ckpt_dir) -> LoadPlan` (collective), run first, puts a checkpoint into `ckpt_dir` (an
                MLflow run's newest complete one, `--resume-from`) and plans its resume (`plan_load("auto",
                ckpt_dir, ...)`), which replaces the manager's plan.

        The loader continues the saved streams unless the drift says they restart. The global RNGs are set
        last: this rank's saved states on the same number of ranks, else seeded from (seed, rank, step)
        (`seed_for`; an old rank's RNG stream cannot be split or merged). Set-up after this call that draws
        from them belongs in `rng_kept()`.

        Raises:
            ConfigDriftError, CheckpointError, FileNotFoundError: from `fetch`'s `plan_load`.
            CheckpointError: DeepSpeed cannot load the checkpoint (`load_checkpoint`).
        """
        if fetch is not None:
            self.plan = fetch(self.ckpt_dir)
        point = self.plan.point
        if point is not None and self.rank == 0:
            # Retention at resume: a lowered checkpoint.keep_last frees its space before the first save.
            prune(self.ckpt_dir, self.cfg.keep_last, protect=point.tag if self._resumed_here(point) else None)
        engine = build_engine({"checkpoint": {"load_universal": True}} if self.plan.universal else {})
        if point is None:
            loader = build_loader(self.rank, self.world_size)
            seed_all(seed_for(self.seed, self.rank, 0))
            return Resumed(engine, loader, 0, None, [])
        started = time.perf_counter()
        state = TrainState()
        state.load_state_dict(load_checkpoint(engine, point, universal=self.plan.universal))
        if not point.config and state.config_hash != self.config_hash and self.rank == 0:  # no snapshot to compare
            logger.warning("config differs from the checkpoint's (hash %s -> %s); continuing with the new one",
                           state.config_hash, self.config_hash)
        self.last_saved = state.step
        if self._resumed_here(point):
            self.healthy = point.tag  # measured healthy by the job that wrote it, or at least its newest
        saved = None if self.plan.drift.streams_restart else state.data_states
        loader = build_resumed_loader(build_loader, saved, self.world_size, self.rank)
        self.load_s = time.perf_counter() - started
        if state.world_size == self.world_size:
            set_rng_state(state.rng_states[self.rank])
        else:
            seed_all(seed_for(self.seed, self.rank, state.step))
        return Resumed(engine, loader, state.step, point, state.metrics_states)

    def confirm(self, read_step: int) -> None:
        """A divergence read at `read_step` found nothing: every checkpoint this job saved before that step is
        healthy (the loss of the step after it was read); the newest becomes `healthy`."""
        done = [s for s in self._unconfirmed if s < read_step]
        if done:
            self.healthy = tag_for(max(done))
            self._unconfirmed = [s for s in self._unconfirmed if s >= read_step]

    def quarantine(self, first_step: int) -> list[str]:
        """Divergence first flagged at step `first_step`: the checkpoints of steps >= first_step - 1 hold weights
        that led there (the weights of step N are first measured by step N+1's loss), so rank 0 renames them
        `<tag>_diverged` (no resume, retention or `latest` takes them; kept to look at) and points `latest` at the
        newest step directory left (collective: every rank waits). Returns the renamed tags."""
        renamed: list[str] = []
        if self.rank == 0:
            for step, tag in step_dirs(self.ckpt_dir):
                if step >= first_step - 1:
                    target = self.ckpt_dir / f"{tag}_diverged"
                    if target.exists():
                        shutil.rmtree(target, ignore_errors=True)
                    os.replace(self.ckpt_dir / tag, target)
                    renamed.append(tag)
            left = step_dirs(self.ckpt_dir)
            if renamed and left and read_latest(self.ckpt_dir) != left[0][1]:
                write_latest(self.ckpt_dir, left[0][1])
            if renamed:
                logger.warning("checkpoint(s) %s hold weights of the diverging steps: renamed to <tag>_diverged",
                               ", ".join(renamed))
        self._unconfirmed = [s for s in self._unconfirmed if s < first_step - 1]
        if self.healthy is not None and step_of(self.healthy) >= first_step - 1:
            self.healthy = None
        barrier()
        return renamed

    def roll_back(self, engine) -> Optional[tuple[VerifiedCheckpoint, TrainState]]:
        """Load the newest verified checkpoint of this job's directory into `engine` (collective), the RNGs as a
        resume sets them; the data loader is the caller's to keep (a rollback skips the data since the checkpoint:
        `albert_dist.engine.divergence`). Returns (the checkpoint, its `TrainState`), or None when there is none.
        Every checkpoint this job wrote was read healthy before its save (`albert_dist.apps.pretrain.trainer`), so the newest
        verified one is the newest healthy one. Raises `CheckpointError` as `load_checkpoint`."""
        point = newest_verified(self.ckpt_dir, log=self.rank == 0)
        if point is None:
            return None
        state = TrainState()
        state.load_state_dict(load_checkpoint(engine, point))
        if state.world_size == self.world_size:
            set_rng_state(state.rng_states[self.rank])
        else:
            seed_all(seed_for(self.seed, self.rank, state.step))
        return point, state

    def _resumed_here(self, point) -> bool:
        return Path(point.ckpt_dir).resolve() == self.ckpt_dir.resolve()

    def maybe_save(self, engine, step: int, data_state: Callable[[], Any], last: bool = False,
                   stop: bool = False, metrics_state: Optional[Callable[[], Any]] = None,
                   stop_cause: Optional[str] = None) -> Optional[str]:
        """Save step `step` unless it is saved already (collective; the caller's cadence chose the step); returns
        the tag or None.

        `data_state` (and `metrics_state`, the open metric interval's `MetricAccumulator.local_state`) is
        called only when saving (a loader's state_dict is not free). `stop`: this is a stop
        signal's checkpoint (`albert_dist.json` records why each checkpoint was written: "interval", "final" or
        "stop"; launch/pretrain_local.sh reads it; `stop_cause`, "signal", "store" or "input" (a file gone), says what stopped it). A failed
        save raises
        `CheckpointSaveError`, unless `checkpoint.on_save_error` is "continue" and this is an interval save: then
        it is logged (one line) and the next interval tries again. A `last` save (the final step, a stop) always
        raises: there is no next interval, and a stop must not exit as if a checkpoint had been written.
        """
        if self.last_saved == step:
            return None
        # The checkpoint resumed from (in this directory) is protected until this job has saved one of its own.
        point = self.plan.point
        protect = (point.tag if point is not None and self.last_saved == point.step and self._resumed_here(point)
                   else None)
        try:
            tag = save_checkpoint(engine, self.ckpt_dir, step, data_state(), self.config_hash, self.cfg.keep_last,
                                  config=self.config, protect=protect,
                                  reason="stop" if stop else "final" if last else "interval",
                                  metrics_state=None if metrics_state is None else metrics_state(),
                                  stop_cause=stop_cause if stop else None,
                                  # the final checkpoint is the run's result (its final model is exported from it):
                                  # no step measures it, and keep_last applies as it says
                                  healthy=None if last and not stop else self.healthy)
        except CheckpointSaveError as err:
            if last or self.cfg.on_save_error != "continue":
                raise
            if self.rank == 0:
                logger.error("%s; training continues (checkpoint.on_save_error=continue)", err)
            return None
        self.last_saved = step
        self._unconfirmed.append(step)
        return tag
