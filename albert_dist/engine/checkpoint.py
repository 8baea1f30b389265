"""Checkpoints through the DeepSpeed engine, with the training state DeepSpeed does not know about.

Layout of `<checkpoint dir>` (default `<run_dir>/checkpoints`)::

    step_<N>/                 one DeepSpeed checkpoint (engine.save_checkpoint(tag="step_<N>")), + albert_dist.json
    step_<N>_universal/       the same converted by DeepSpeed's ds_to_universal, made when resuming elsewhere
    latest                    the tag of the newest *complete* checkpoint (DeepSpeed's format: the tag, no newline)

Save protocol (`save_checkpoint`), on every rank, because every rank writes its own ZeRO partition and a call
on rank 0 alone hangs: (1) every rank's data-loader state and RNG states are gathered into `client_state`;
(2) `engine.save_checkpoint(..., save_latest=False)`; (3) rank 0 writes `albert_dist.json`; (4) barrier: every
rank has finished writing; (5) rank 0 moves `latest` atomically (write a temporary file, fsync, `os.replace`);
(6) rank 0 deletes all but the newest `keep_last` checkpoints; (7) barrier. A crash anywhere before (5) leaves
`latest` on the previous checkpoint, which stays loadable (DeepSpeed itself writes `latest` from rank 0
without waiting for the other ranks, so its own pointer is not used).

`client_state["albert_dist"]` = {"step", "world_size", "zero_stage", "config_hash", "data_states": [one per
rank], "rng_states": [one per rank]}.

Resume on another number of ranks (`plan_resume` sees the saved world size differ): rank 0 converts the
checkpoint with DeepSpeed's universal-checkpoint tool (`deepspeed.checkpoint.ds_to_universal`), and the engine
is built with `checkpoint.load_universal=true`, which re-partitions parameters and optimiser moments for the
new world size. The converter needs the module to carry a `universal_checkpoint_info` attribute when the engine
is built (`UNIVERSAL_CHECKPOINT_INFO` below; the trainer sets it). The data streams continue by the rule of
`albert_dist.engine.reshard`; dropout RNGs are re-seeded from (seed, rank, step), since the old ranks' RNG
streams cannot be split or merged.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

LATEST = "latest"
META_FILE = "albert_dist.json"
CLIENT_KEY = "albert_dist"
_TAG_RE = re.compile(r"^step_(\d+)$")

#: Value of the `universal_checkpoint_info` module attribute: no tensor-parallel or pipeline slicing, so
#: DeepSpeed's converter merges each parameter from its ZeRO fragments only.
UNIVERSAL_CHECKPOINT_INFO = {"universal_checkpoint_version": 0.2}


def tag_for(step: int) -> str:
    """Checkpoint tag of optimiser step `step`: "step_<step>"."""
    return f"step_{step}"


def step_of(tag: str) -> Optional[int]:
    """Inverse of `tag_for`; None for any other name (universal copies, temporary files)."""
    match = _TAG_RE.match(tag)
    return int(match.group(1)) if match else None


def read_latest(ckpt_dir: str | Path) -> Optional[str]:
    """The tag in `<ckpt_dir>/latest`, or None if there is none (no complete checkpoint yet)."""
    path = Path(ckpt_dir) / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag or None


def write_latest(ckpt_dir: str | Path, tag: str, name: str = LATEST) -> None:
    """Point `<ckpt_dir>/<name>` at `tag` atomically: a reader sees the old or the new tag, never a partial one."""
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir / f".{name}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(tag)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt_dir / name)
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint to resume from, as read from its `albert_dist.json` (no process group needed)."""

    ckpt_dir: str
    """Directory holding the tag directory (what engine.load_checkpoint takes as load_dir)."""
    tag: str
    """Tag directory name, "step_<N>"."""
    step: int
    """Optimiser steps done when it was saved."""
    world_size: int
    """Number of ranks that wrote it."""
    zero_stage: int
    """ZeRO stage it was written with."""

    def needs_universal(self, world_size: int) -> bool:
        """True when loading on `world_size` ranks needs DeepSpeed's universal checkpoint (re-partitioning)."""
        return self.world_size != world_size and self.zero_stage > 0


def plan_resume(resume: Optional[str], ckpt_dir: str | Path) -> Optional[ResumePoint]:
    """Where to resume from: None (fresh start) or a `ResumePoint`.

    `resume` None -> None; "auto" -> the checkpoint `<ckpt_dir>/latest` names, None if there is none;
    otherwise a path to a tag directory (`.../step_<N>`) or to a checkpoint directory with a `latest` file.
    Raises `FileNotFoundError` when an explicit path has no complete checkpoint and `ValueError` when its
    metadata is unreadable. Every rank calls it and reads the same files, so all agree.
    """
    if resume is None:
        return None
    if resume == "auto":
        base, tag = Path(ckpt_dir), read_latest(ckpt_dir)
        if tag is None:
            return None
    else:
        path = Path(resume)
        if (path / LATEST).is_file():
            base, tag = path, read_latest(path)
        elif (path / META_FILE).is_file():
            base, tag = path.parent, path.name
        else:
            raise FileNotFoundError(f"checkpoint.resume={resume!r}: neither a checkpoint directory with a "
                                    f"'{LATEST}' file nor a complete checkpoint ({META_FILE} missing)")
    meta_path = base / tag / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
        return ResumePoint(str(base), tag, int(meta["step"]), int(meta["world_size"]), int(meta["zero_stage"]))
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"checkpoint {base / tag} is not loadable: cannot read {meta_path}: {err}") from err


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python `random`, numpy, torch CPU and (if present) the current CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _all_gather_object(obj: Any) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_checkpoint(engine, ckpt_dir: str | Path, step: int, data_state: Any, config_hash: str,
                    keep_last: int) -> str:
    """Save step `step` on every rank (collective; see the module docstring for the protocol); returns the tag.

    `data_state` is this rank's `loader.state_dict()`. Raises whatever DeepSpeed or the file system raises;
    `latest` then still names the previous complete checkpoint.
    """
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for(step)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    per_rank = _all_gather_object({"data": data_state, "rng": rng_state()})
    zero_stage = int(engine.zero_optimization_stage())
    client_state = {CLIENT_KEY: {
        "step": step, "world_size": world_size, "zero_stage": zero_stage, "config_hash": config_hash,
        "data_states": [s["data"] for s in per_rank], "rng_states": [s["rng"] for s in per_rank],
    }}
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    if _rank() == 0:
        meta = {"step": step, "world_size": world_size, "zero_stage": zero_stage, "config_hash": config_hash}
        (ckpt_dir / tag / META_FILE).write_text(json.dumps(meta))
    _barrier()  # every rank's files are on disk before the pointer moves
    if _rank() == 0:
        write_latest(ckpt_dir, tag)
        prune(ckpt_dir, keep_last)
    _barrier()
    return tag


def prune(ckpt_dir: str | Path, keep_last: int) -> list[str]:
    """Delete all checkpoints but the newest `keep_last` complete ones (rank 0 only); returns the removed names.

    Tag directories newer than `latest` (left by a save that crashed) and universal copies of removed steps
    are removed too; `latest` itself is always kept.
    """
    ckpt_dir = Path(ckpt_dir)
    latest = read_latest(ckpt_dir)
    latest_step = step_of(latest) if latest else None
    if latest_step is None:
        return []
    steps = sorted(s for s in (step_of(p.name) for p in ckpt_dir.iterdir() if p.is_dir()) if s is not None)
    complete = [s for s in steps if s <= latest_step]
    keep = set(complete[-keep_last:]) | {latest_step}
    removed = []
    for entry in ckpt_dir.iterdir():
        name = entry.name
        base = name[: -len("_universal")] if name.endswith("_universal") else name
        step = step_of(base)
        if step is None or not entry.is_dir() or step in keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(name)
    return removed


def to_universal(point: ResumePoint) -> str:
    """Convert `point` with DeepSpeed's ds_to_universal (rank 0; others wait at the barrier); returns the new tag.

    The conversion runs once: an existing `<tag>_universal` with its own `albert_dist.json` is reused. It is
    written to a temporary directory and renamed, so a crash mid-conversion leaves nothing half-made. Raises
    `RuntimeError` with the converter's output when it fails (e.g. a checkpoint of a module without
    `universal_checkpoint_info`).
    """
    tag = f"{point.tag}_universal"
    out = Path(point.ckpt_dir) / tag
    if _rank() == 0 and not (out / META_FILE).is_file():
        tmp = Path(point.ckpt_dir) / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
               "--input_folder", str(Path(point.ckpt_dir) / point.tag), "--output_folder", str(tmp),
               "--num_extract_workers", "1", "--num_merge_workers", "1"]
        logger.info("converting %s to a universal checkpoint: %s", point.tag, " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ds_to_universal failed on {point.ckpt_dir}/{point.tag} "
                               f"(exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        shutil.copy2(Path(point.ckpt_dir) / point.tag / META_FILE, tmp / META_FILE)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        # The converter points `latest_universal` at its output folder, i.e. at the temporary name.
        write_latest(point.ckpt_dir, tag, name="latest_universal")
    _barrier()
    return tag


def load_checkpoint(engine, point: ResumePoint) -> dict[str, Any]:
    """Load `point` into `engine` on every rank (collective); returns the saved `client_state["albert_dist"]`.

    When the world size differs (`point.needs_universal`), the engine must have been built with
    `checkpoint.load_universal=true` in its DeepSpeed config (the trainer does this from `plan_resume`).
    RNG states are not restored here: the caller does it last (`set_rng_state(state["rng_states"][rank])`),
    after anything that draws from the global RNGs while setting up (a DataLoader draws its workers' base
    seed when its iterator is created). Raises `RuntimeError` when DeepSpeed loads nothing.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    tag = to_universal(point) if point.needs_universal(world_size) else point.tag
    load_path, client_state = engine.load_checkpoint(point.ckpt_dir, tag=tag)
    if load_path is None or not client_state or CLIENT_KEY not in client_state:
        raise RuntimeError(f"DeepSpeed loaded no checkpoint from {point.ckpt_dir}/{tag}")
    state = client_state[CLIENT_KEY]
    logger.info("resumed from %s/%s at step %d (saved by %d ranks, loaded on %d)", point.ckpt_dir, tag,
                state["step"], state["world_size"], world_size)
    return state
