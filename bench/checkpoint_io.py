"""Checkpoint save/load time through the DeepSpeed engine vs a plain torch.save/torch.load of the same state.

For each model preset (configs/model/albert-tiny.yaml, albert-base.yaml), one process, ZeRO-2, fp32, CPU:

* ours: ``albert_dist.engine.checkpoint.save_checkpoint`` (the trainer's path: every rank's data/RNG state
  gathered into ``client_state``, ``engine.save_checkpoint``, metadata, barrier, atomic ``latest``) and
  ``load_checkpoint`` (``engine.load_checkpoint``: module weights, ZeRO fp32 partitions, Adam moments, client
  state);
* peer: ``torch.save({"model": model.state_dict(), "optimizer": AdamW.state_dict(), "client_state": ...})`` of
  an identical model and optimiser after the same step, and ``torch.load`` + both ``load_state_dict`` calls.

Both write to the same local directory; every repeat writes a new tag / file, and the loads read what was
just written (page cache warm for both). The ratio is ours / peer per repeat (lower is better; no target in
issue 8: the figure shows what DeepSpeed's layout costs, e.g. ZeRO's separate fp32 master copy). Bytes on disk
are reported for both.

    python bench/checkpoint_io.py [--repeats 3] [--presets albert-tiny albert-base]

``run(repeats=..., presets=...)`` returns the figures as a dict for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import fmt_stats, synthetic_batch

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "configs" / "model"
BATCH, SEQ = 2, 64
log = logging.getLogger("bench.checkpoint_io")


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _bench_preset(preset: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """Time ``repeats`` saves and loads of one preset both ways; returns per-repeat lists and sizes."""
    import deepspeed

    from albert_dist.config import TrainConfig, config_hash
    from albert_dist.engine.checkpoint.load import UNIVERSAL_CHECKPOINT_INFO, load_checkpoint
    from albert_dist.engine.checkpoint.choose import choose_checkpoint
    from albert_dist.engine.checkpoint.save import save_checkpoint
    from albert_dist.engine.checkpoint.state import rng_state
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining

    torch.manual_seed(0)
    cfg = TrainConfig(model=load_model_config(MODEL_DIR / f"{preset}.yaml"))
    cfg.engine.train_micro_batch_size_per_gpu, cfg.engine.zero_stage = BATCH, 2
    model = AlbertForPreTraining(cfg.model)
    plain = copy.deepcopy(model)
    model.universal_checkpoint_info = UNIVERSAL_CHECKPOINT_INFO  # as the trainer builds it
    engine, *_ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, cfg.optimizer).optimizer,
                                      config=build_deepspeed_config(cfg.engine, world_size=1))
    plain_opt = build_optimizer(plain, cfg.optimizer).optimizer
    batch = synthetic_batch(cfg.model.vocab_size, BATCH, SEQ, predictions=8)
    # One real step each, so both hold Adam moments (and DeepSpeed its fp32 partitions) as in training.
    engine.backward(engine(**batch).loss)
    engine.step()
    plain(**batch).loss.backward()
    plain_opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    digest = config_hash(cfg)
    # The loader state the trainer would save: a small nested dict (the real one is of the same order).
    data_state = {"epoch": 0, "examples_yielded": 12345, "shard_offsets": list(range(16))}

    out: dict[str, Any] = {"parameters": n_params, "deepspeed_save_s": [], "deepspeed_load_s": [],
                           "torch_save_s": [], "torch_load_s": [], "ratio_save": [], "ratio_load": []}
    ds_dir, pt_dir = workdir / f"{preset}-deepspeed", workdir / f"{preset}-torch"
    ds_dir.mkdir()
    pt_dir.mkdir()
    for i in range(repeats):
        step = i + 1
        t0 = time.perf_counter()
        tag = save_checkpoint(engine, ds_dir, step, data_state, digest, keep_last=repeats + 1)
        ds_save = time.perf_counter() - t0

        pt_path = pt_dir / f"step_{step}.pt"
        t0 = time.perf_counter()
        torch.save({"model": plain.state_dict(), "optimizer": plain_opt.state_dict(),
                    "client_state": {"step": step, "data_state": data_state, "rng": rng_state(),
                                     "config_hash": digest}}, pt_path)
        pt_save = time.perf_counter() - t0

        point = choose_checkpoint(str(ds_dir / tag), ds_dir)
        t0 = time.perf_counter()
        state = load_checkpoint(engine, point)
        ds_load = time.perf_counter() - t0
        if state["step"] != step:
            raise RuntimeError(f"DeepSpeed checkpoint {tag} loaded step {state['step']}, expected {step}")

        t0 = time.perf_counter()
        blob = torch.load(pt_path, weights_only=False)  # RNG states are plain python/numpy objects
        plain.load_state_dict(blob["model"])
        plain_opt.load_state_dict(blob["optimizer"])
        pt_load = time.perf_counter() - t0

        for key, value in (("deepspeed_save_s", ds_save), ("torch_save_s", pt_save),
                           ("deepspeed_load_s", ds_load), ("torch_load_s", pt_load)):
            out[key].append(value)
        out["ratio_save"].append(ds_save / pt_save)
        out["ratio_load"].append(ds_load / pt_load)
        if i == 0:
            out["deepspeed_bytes"] = _dir_bytes(ds_dir / tag)
            out["torch_bytes"] = pt_path.stat().st_size
            out["ratio_bytes"] = out["deepspeed_bytes"] / out["torch_bytes"]
    engine.destroy()
    return out


def run(repeats: int = 3, presets: tuple[str, ...] = ("albert-tiny", "albert-base")) -> dict[str, Any]:
    """Checkpoint I/O figures per preset: ``{preset: {deepspeed_save_s: [..], torch_save_s: [..], ratio_save:
    [..], *_load_s, ratio_load, deepspeed_bytes, torch_bytes, ratio_bytes, parameters}}`` (seconds per repeat).

    Runs in this process: starts a 1-rank gloo/nccl process group on a free port (``init_distributed``)
    unless one exists. Raises ``ValueError`` for repeats < 1 or an unknown preset.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    missing = [p for p in presets if not (MODEL_DIR / f"{p}.yaml").is_file()]
    if missing:
        raise ValueError(f"unknown model presets {missing}; see {MODEL_DIR}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from albert_dist.distributed.group import init_distributed

    init_distributed(timeout_s=300)
    result: dict[str, Any] = {"zero_stage": 2, "precision": "fp32", "world_size": 1}
    # Same file system as the runs directory would be; not /dev/shm, which would hide the I/O.
    workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=os.environ.get("BENCH_TMPDIR")))
    try:
        for preset in presets:
            result[preset] = _bench_preset(preset, repeats, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--presets", nargs="+", default=["albert-tiny", "albert-base"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    r = run(repeats=args.repeats, presets=tuple(args.presets))
    for preset in args.presets:
        p = r[preset]
        print(f"{preset} ({p['parameters'] / 1e6:.1f}M params), ZeRO-2 fp32, 1 rank, {args.repeats} repeats "
              f"(min / median / max):")
        for what in ("save", "load"):
            ds, pt, ratio = p[f"deepspeed_{what}_s"], p[f"torch_{what}_s"], p[f"ratio_{what}"]
            print(f"  {what}: deepspeed {fmt_stats(ds)} s   torch {fmt_stats(pt)} s   ratio {fmt_stats(ratio)}")
        print(f"  bytes: deepspeed {p['deepspeed_bytes'] / 2**20:.1f} MiB  torch {p['torch_bytes'] / 2**20:.1f} MiB"
              f"  ratio {p['ratio_bytes']:.2f}")


if __name__ == "__main__":
    main()
