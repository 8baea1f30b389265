"""`CheckpointManager`: the one place that decides about a job's checkpoints (plan, load, save, retention),
and the loop's cadence rule `every`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

from albert_dist.engine.checkpoint.drift import Drift, check_drift, log_drift
from albert_dist.engine.checkpoint.load import load_checkpoint, _realign_lr
from albert_dist.engine.checkpoint.plan import ResumePoint, plan_resume
from albert_dist.engine.checkpoint.save import CheckpointSaveError, save_checkpoint
from albert_dist.engine.checkpoint.state import TrainState, seed_all, seed_for, set_rng_state
from albert_dist.engine.reshard import build_resumed_loader

logger = logging.getLogger(__name__)



def every(step: int, n: int, last: bool = False) -> bool:
    """The loop's one cadence rule: periodic work (log, eval, save) runs at step `step` when `last` (the final
    step, or a stop) or when `n` > 0 divides `step`. `n` = 0 means only at the last step."""
    return last or (n > 0 and step % n == 0)


class CheckpointManager:
    """Plans, loads, saves and prunes the checkpoints of one job (see the module docstring).

    Args:
        cfg: the `CheckpointConfig` (interval, keep_last, resume, on_save_error).
        ckpt_dir: where this job saves (and "auto" looks).
        rank, world_size: this process in the job.
        config: the resolved TrainConfig as plain dicts (`albert_dist.config.to_container`), stored with every
            checkpoint and compared with the checkpoint's on resume.
        config_hash: `albert_dist.config.config_hash` of it.
        seed: `TrainConfig.seed` (dropout seeds when RNG states cannot be restored).

    Use: `plan()` (before the engine: no collectives unless `fetch` is given) -> `deepspeed_overrides()` into the
    DeepSpeed config -> `load(engine, make_loader)` -> ... -> `restore_rng()` last -> `maybe_save(...)` every step.
    """

    def __init__(self, cfg: Any, ckpt_dir: str | Path, *, rank: int, world_size: int, config: dict,
                 config_hash: str, seed: int):
        self.cfg = cfg
        self.ckpt_dir = Path(ckpt_dir)
        self.rank, self.world_size = rank, world_size
        self.config, self.config_hash, self.seed = config, config_hash, seed
        self.point: Optional[ResumePoint] = None
        self.state: Optional[TrainState] = None
        self.drift = Drift({})
        self.last_saved: Optional[int] = None
        self._planned = False

    def plan(self, fetch: Optional[Callable[[Path], Any]] = None, *, planned: bool = False,
             point: Optional[ResumePoint] = None) -> Optional[ResumePoint]:
        """Decide where to resume from (None: fresh start) and check the config against it.

        `fetch(ckpt_dir)` (collective, e.g. downloading an MLflow run's newest complete checkpoint into
        `ckpt_dir`) runs first and turns the resume into "auto". With `planned`, `point` is a plan already made
        (by the app, before the process group) and is taken as is. Raises `ConfigDriftError`, `CheckpointError`,
        `FileNotFoundError` as `plan_resume` and `check_drift`.
        """
        resume = self.cfg.resume
        if fetch is not None:
            fetch(self.ckpt_dir)
            resume, planned = "auto", False
        if not planned:
            point = plan_resume(resume, self.ckpt_dir, log=self.rank == 0)
            if resume == "auto" and point is None and self.rank == 0:  # a mistyped run_dir would restart silently
                logger.warning("--resume auto: no checkpoint in %s; starting from step 0", self.ckpt_dir)
        if point is not None:
            self.drift = check_drift(point, self.config, self.world_size)
            if self.rank == 0:
                log_drift(point, self.drift)
        self.point, self._planned = point, True
        return point

    def deepspeed_overrides(self) -> dict[str, Any]:
        """Entries to merge into the DeepSpeed config: `checkpoint.load_universal` when resuming elsewhere."""
        if self.point is not None and self.point.needs_universal(self.world_size):
            return {"checkpoint": {"load_universal": True}}
        return {}

    def load(self, engine, make_loader: Callable[[int, int], Any]):
        """Load the planned checkpoint into `engine` (collective) and return this rank's training loader,
        continuing the saved data streams (`albert_dist.engine.reshard`), or fresh ones when there is nothing
        to resume or the data config changed. Returns (step, loader). RNGs: call `restore_rng()` last."""
        if self.point is None:
            self.last_saved = None
            return 0, make_loader(self.rank, self.world_size)
        state = TrainState()
        state.load_state_dict(load_checkpoint(engine, self.point))
        self.state = state
        if state.config_hash != self.config_hash and not self.drift.changes and self.rank == 0:
            logger.warning("config differs from the checkpoint's (hash %s -> %s); continuing with the new one",
                           state.config_hash, self.config_hash)
        _realign_lr(engine)
        self.last_saved = state.step
        saved = None if self.drift.streams_restart else state.data_states
        return state.step, build_resumed_loader(make_loader, saved, self.world_size, self.rank)

    def restore_rng(self) -> None:
        """Restore this rank's saved RNG states (same world size), else seed from (seed, rank, step). Call it
        after everything that draws from the global RNGs while setting up."""
        state = self.state
        if state is None:
            seed_all(seed_for(self.seed, self.rank, 0))
        elif state.world_size == self.world_size:
            set_rng_state(state.rng_states[self.rank])
        else:  # an old rank's RNG stream cannot be split or merged
            seed_all(seed_for(self.seed, self.rank, state.step))

    def maybe_save(self, engine, step: int, data_state: Callable[[], Any], last: bool = False) -> Optional[str]:
        """Save step `step` when the cadence says so (`every(step, save_interval_steps, last)`) and it is not
        saved yet (collective); returns the tag or None.

        `data_state` is called only when saving (a loader's state_dict is not free). A failed save raises
        `CheckpointSaveError`, unless `checkpoint.on_save_error` is "continue" and this is an interval save: then
        it is logged (one line) and the next interval tries again. A `last` save (the final step, a stop) always
        raises: there is no next interval, and a stop must not exit as if a checkpoint had been written.
        """
        if self.last_saved == step or not every(step, self.cfg.save_interval_steps, last):
            return None
        try:
            tag = save_checkpoint(engine, self.ckpt_dir, step, data_state(), self.config_hash, self.cfg.keep_last,
                                  config=self.config, protect=self.point.tag if self.point else None)
        except CheckpointSaveError as err:
            if last or self.cfg.on_save_error != "continue":
                raise
            if self.rank == 0:
                logger.error("%s; training continues (checkpoint.on_save_error=continue)", err)
            return None
        self.last_saved = step
        return tag
