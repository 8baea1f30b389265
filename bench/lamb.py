"""Step time of LAMB (albert_dist.engine.lamb, exact under ZeRO) vs AdamW under DeepSpeed ZeRO-2, 2 ranks.

Both optimisers are built exactly as the trainer builds them (`albert_dist.engine.optim.build_optimizer`:
ALBERT parameter groups, torch AdamW vs `Lamb` + `attach_zero_partition_map`) for the same model and
DeepSpeed ZeRO-2 config, in the same 2-rank gloo process group (CPU, 1 thread per rank). The two engines
alternate (AB, BA, AB, ...), `steps` optimiser steps per block, so that drift of a shared machine hits both.
One step = forward + backward + `engine.step()` on one micro-batch (B=micro_batch, S=seq) of random
pretraining inputs; the optimiser part (`engine.step()`: gradient partition flattening, clipping, the
client optimiser, the parameter all-gather) is also timed on its own.

Figures per repeat (one repeat = one block of each), min / median / max over repeats:
* ``lamb_step_s``, ``adamw_step_s``: process CPU seconds per step (mean over ranks), and
  ``ratio_lamb_over_adamw`` = their ratio (target <= 1.15, issue 7). CPU time, as in bench/model_step.py:
  on a shared machine other processes stretch the wall time of whichever block they overlap, while a
  single-threaded rank's CPU time stays close to its cost. It leaves out time spent waiting in collectives,
  which LAMB changes only by one all-reduce of 2 x (parameter count) floats per group and step.
* ``lamb_wall_step_s``, ``adamw_wall_step_s``, ``wall_ratio_lamb_over_adamw``: wall seconds per step (the
  slower rank's, barrier to barrier).
* ``lamb_optimizer_s``, ``adamw_optimizer_s``, ``ratio_optimizer_step``: CPU seconds of `engine.step()`
  alone (gradient partition flattening, clipping, the client optimiser, the parameter all-gather), i.e. the
  part LAMB changes.

    python bench/lamb.py [--repeats 3] [--model albert-base] [--micro-batch 1] [--seq 128] [--steps 1] [--offload]

`--offload` adds `zero_optimization.offload_optimizer: {device: cpu}` (the project's `engine.offload_optimizer`):
the client optimiser (torch AdamW or LAMB) then steps DeepSpeed's fp32 partitions in host memory.

The default micro-batch (1 x 128 tokens) keeps the suite within its time limit on 2 CPU cores; it is also the
least favourable case for LAMB, whose extra cost is per parameter and not per token.

`run(repeats=...)` returns the dict for the suite runner (bench/run_all.py).
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import spawn_local_ranks, stats, synthetic_batch

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
log = logging.getLogger("bench.lamb")


def _worker(rank: int, args: dict, out: str) -> None:
    import deepspeed
    import torch.distributed as dist

    from albert_dist.engine.config import OptimConfig
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(name)s %(message)s")
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=300))
    config = load_model_config(ROOT / "configs" / "model" / f"{args['model']}.yaml")
    ds_config = {
        "train_micro_batch_size_per_gpu": args["micro_batch"], "gradient_accumulation_steps": 1,
        "train_batch_size": args["micro_batch"] * WORLD, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2, **({"offload_optimizer": {"device": "cpu", "pin_memory": False}}
                                             if args["offload"] else {})},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False, "steps_per_print": 2**31 - 1,
    }
    engines = {}
    for name in ("lamb", "adamw"):
        torch.manual_seed(0)
        model = AlbertForPreTraining(config)
        optimizer, after_initialize = build_optimizer(model, OptimConfig(type=name, lr=1.76e-3, weight_decay=0.01,
                                                                         eps=1e-6))
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        after_initialize(engine)  # LAMB: attach_zero_partition_map
        engines[name] = engine
    batch = synthetic_batch(config.vocab_size, args["micro_batch"], args["seq"], predictions=20, seed=rank)
    if rank == 0:
        log.info("engines built (%s, ZeRO-2); timing %d repeats", args["model"], args["repeats"])

    def block(name: str, steps: int) -> tuple[float, float, float]:
        """(wall s, CPU s, engine.step() CPU s) per step of `steps` steps of engine `name`."""
        engine = engines[name]
        dist.barrier()
        w0, c0, opt_s = time.perf_counter(), time.process_time(), 0.0
        for _ in range(steps):
            loss = engine(**batch).loss
            engine.backward(loss)
            s0 = time.process_time()
            engine.step()
            opt_s += time.process_time() - s0
        dist.barrier()
        stats = torch.tensor([time.perf_counter() - w0, time.process_time() - c0, opt_s], dtype=torch.float64)
        walls = stats.clone()
        dist.all_reduce(walls, op=dist.ReduceOp.MAX)   # the step ends when the slower rank is done
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        return walls[0].item() / steps, stats[1].item() / WORLD / steps, stats[2].item() / WORLD / steps

    for name in ("lamb", "adamw"):  # warm-up: allocator, first-step state init
        block(name, 1)
    rows: dict[str, list[float]] = {k: [] for k in ("lamb_step_s", "adamw_step_s", "lamb_wall_step_s",
                                                    "adamw_wall_step_s", "lamb_optimizer_s", "adamw_optimizer_s")}
    for r in range(args["repeats"]):
        # AB then BA: over repeats each optimiser runs first equally often.
        for name in (("lamb", "adamw") if r % 2 == 0 else ("adamw", "lamb")):
            wall, cpu, opt = block(name, args["steps"])
            rows[f"{name}_wall_step_s"].append(wall)
            rows[f"{name}_step_s"].append(cpu)
            rows[f"{name}_optimizer_s"].append(opt)
            if rank == 0:
                log.info("repeat %d %s: %.3f CPU-s, %.3f wall-s per step", r, name, cpu, wall)
    for engine in engines.values():
        engine.destroy()
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def run(repeats: int = 3, model: str = "albert-base", micro_batch: int = 1, seq: int = 128,
        steps: int = 1, offload: bool = False) -> dict[str, Any]:
    """Time LAMB vs AdamW under ZeRO-2 on 2 gloo ranks; returns per-repeat lists, their ratios and summaries.

    Keys: the per-repeat lists named in the module docstring, ``ratio_lamb_over_adamw``,
    ``wall_ratio_lamb_over_adamw``, ``ratio_optimizer_step`` (per-repeat lists), ``summary`` ({key: min /
    median / max / n}) and the sizes used. Raises `ValueError` for repeats/steps/micro_batch/seq < 1.
    """
    for key, value in dict(repeats=repeats, steps=steps, micro_batch=micro_batch, seq=seq).items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value!r}")
    args = dict(repeats=repeats, model=model, micro_batch=micro_batch, seq=seq, steps=steps, offload=offload)
    with tempfile.TemporaryDirectory(prefix="bench-lamb-") as tmp:
        out = os.path.join(tmp, "rows.pt")
        spawn_local_ranks(_worker, WORLD, args, out)
        rows = torch.load(out)
    result: dict[str, Any] = dict(rows)
    result["ratio_lamb_over_adamw"] = [a / b for a, b in zip(rows["lamb_step_s"], rows["adamw_step_s"])]
    result["wall_ratio_lamb_over_adamw"] = [a / b for a, b in zip(rows["lamb_wall_step_s"],
                                                                  rows["adamw_wall_step_s"])]
    result["ratio_optimizer_step"] = [a / b for a, b in zip(rows["lamb_optimizer_s"], rows["adamw_optimizer_s"])]
    result["summary"] = {k: stats(v) for k, v in result.items() if isinstance(v, list)}
    result.update(model=model, micro_batch=micro_batch, seq=seq, steps_per_block=steps, world_size=WORLD,
                  zero_stage=2, offload_optimizer="cpu" if offload else "none")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one block per optimiser (each gives one ratio)")
    parser.add_argument("--model", default="albert-base", help="preset in configs/model")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1, help="optimiser steps per timed block")
    parser.add_argument("--offload", action="store_true",
                        help="ZeRO-Offload: optimiser states and the client optimiser's step on the CPU")
    a = parser.parse_args()
    r = run(repeats=a.repeats, model=a.model, micro_batch=a.micro_batch, seq=a.seq, steps=a.steps, offload=a.offload)
    s = r["summary"]
    print(f"{a.model}, ZeRO-2{' + CPU offload' if a.offload else ''}, {WORLD} gloo ranks x 1 thread, "
          f"B={a.micro_batch} S={a.seq}, {a.repeats} repeats")
    for key, label in (("step_s", "step CPU s"), ("wall_step_s", "step wall s"),
                       ("optimizer_s", "engine.step() CPU s")):
        for name in ("lamb", "adamw"):
            x = s[f"{name}_{key}"]
            print(f"  {name:<6} {label:<20} min {x['min']:.4f}  median {x['median']:.4f}  max {x['max']:.4f}")
    for key, label in (("ratio_lamb_over_adamw", "LAMB / AdamW step (CPU), target <= 1.15"),
                       ("wall_ratio_lamb_over_adamw", "LAMB / AdamW step (wall)"),
                       ("ratio_optimizer_step", "LAMB / AdamW engine.step() (CPU)")):
        x = s[key]
        print(f"  {label:<42} min {x['min']:.3f}  median {x['median']:.3f}  max {x['max']:.3f}")


if __name__ == "__main__":
    main()
