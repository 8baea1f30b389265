"""Loading a checkpoint into a DeepSpeed engine: universal conversion when the number of ranks or the ZeRO stage
changed, the optimiser repair after DeepSpeed's load, and the learning rate following the current config.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from albert_dist.engine.checkpoint.layout import META_FILE, CheckpointError, write_latest
from albert_dist.engine.checkpoint.choose import VerifiedCheckpoint
from albert_dist.engine.checkpoint.state import CLIENT_KEY
from albert_dist.distributed.collectives import barrier as _barrier, global_rank, world_size
from albert_dist.engine.optim import group_hyperparameters, repair_optimizer_after_load

logger = logging.getLogger(__name__)

#: Value of the `universal_checkpoint_info` module attribute: no tensor-parallel or pipeline slicing, so
#: DeepSpeed's converter merges each parameter from its ZeRO fragments only.
UNIVERSAL_CHECKPOINT_INFO = {"universal_checkpoint_version": 0.2}



def to_universal(point: VerifiedCheckpoint) -> str:
    """Convert `point` with DeepSpeed's ds_to_universal (rank 0; others wait at the barrier); returns the new tag.

    The conversion runs once: an existing `<tag>_universal` with its own `albert_dist.json` is reused. It is
    written to a temporary directory and renamed, so a crash mid-conversion leaves nothing half-made. Raises
    `CheckpointError` with the converter's output when it fails (e.g. a checkpoint of a module without
    `universal_checkpoint_info`).
    """
    tag = f"{point.tag}_universal"
    out = Path(point.ckpt_dir) / tag
    if global_rank() == 0 and not (out / META_FILE).is_file():
        tmp = Path(point.ckpt_dir) / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
               "--input_folder", str(point.path), "--output_folder", str(tmp),
               "--num_extract_workers", "1", "--num_merge_workers", "1"]
        logger.info("converting %s to a universal checkpoint: %s", point.tag, " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckpointError(f"checkpoint {point.path}: ds_to_universal failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        shutil.copy2(point.path / META_FILE, tmp / META_FILE)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        # The converter points `latest_universal` at its output folder, i.e. at the temporary name.
        write_latest(point.ckpt_dir, tag, name="latest_universal")
    _barrier()
    return tag


def load_checkpoint(engine, point: VerifiedCheckpoint, universal: Optional[bool] = None) -> dict[str, Any]:
    """Load `point` into `engine` on every rank (collective); returns the saved `client_state["albert_dist"]`.

    `universal` (default: `point.needs_universal`, another number of ranks) loads through DeepSpeed's universal
    checkpoint (`to_universal`, once); the engine must then have been built with `checkpoint.load_universal=true`
    in its DeepSpeed config (`CheckpointManager.resume` does it, also for a changed ZeRO stage). RNG states
    are not restored here. The optimiser's hyper-parameters are the *current config's* afterwards, whatever the
    checkpoint holds: every param group's weight_decay, betas, eps, ... (`albert_dist.engine.optim.
    repair_optimizer_after_load`, which also repairs DeepSpeed's ZeRO-3 universal load) and the schedule's peak
    lr (`_follow_config_schedule`); moments, step counters and parameters are the checkpoint's. Raises
    `CheckpointError` naming the checkpoint when DeepSpeed loads nothing or fails.
    """
    if universal is None:
        universal = point.needs_universal(world_size())
    tag = to_universal(point) if universal else point.tag
    hyperparameters = group_hyperparameters(engine.optimizer)  # the config's, before DeepSpeed overwrites them
    peak_lrs = _peak_lrs(engine)
    try:
        load_path, client_state = engine.load_checkpoint(point.ckpt_dir, tag=tag)
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"checkpoint {Path(point.ckpt_dir) / tag}: DeepSpeed cannot load it: "
                              f"{type(err).__name__}: {err}") from err
    if load_path is None or not client_state or CLIENT_KEY not in client_state:
        raise CheckpointError(f"DeepSpeed loaded no checkpoint from {point.ckpt_dir}/{tag}")
    # DeepSpeed 0.19.8's ZeRO-3 universal load gives every param group group 0's hyper-parameters and one shared
    # Adam step counter (runtime/zero/stage3.py::load_hp_checkpoint_state_from_checkpoint_dir_stage3).
    repair_optimizer_after_load(engine, hyperparameters)
    _follow_config_schedule(engine, peak_lrs)
    state = client_state[CLIENT_KEY]
    logger.info("resumed from %s/%s at step %d (saved by %d ranks, loaded on %d)", point.ckpt_dir, tag,
                state["step"], state["world_size"], world_size())
    return state


def _peak_lrs(engine) -> Optional[list[float]]:
    """Every param group's peak lr as the current config built the schedule (None: no LambdaLR schedule)."""
    sched = getattr(engine, "lr_scheduler", None)
    return list(sched.base_lrs) if isinstance(sched, torch.optim.lr_scheduler.LambdaLR) else None


def _follow_config_schedule(engine, peak_lrs: Optional[list[float]]) -> None:
    """After a load: the schedule's peak lrs back to the config's (`peak_lrs`; DeepSpeed restored the
    checkpoint's `base_lrs` and `initial_lr`, so a changed `optimizer.lr` would be ignored) and every group's lr
    set to `peak * lr_factor(step)` of the current schedule at the loaded step (its `lr_lambdas` are the current
    config's: a changed max_steps or warmup applies as well). Unchanged config: the interrupted run's lr exactly."""
    sched = getattr(engine, "lr_scheduler", None)
    if peak_lrs is None or not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
        return
    sched.base_lrs = list(peak_lrs)
    lrs = [base * fn(sched.last_epoch) for base, fn in zip(sched.base_lrs, sched.lr_lambdas)]
    for group, base, lr in zip(sched.optimizer.param_groups, sched.base_lrs, lrs):
        group["initial_lr"], group["lr"] = base, lr
    sched._last_lr = lrs  # what get_last_lr() reports, as LambdaLR.step() would set it
