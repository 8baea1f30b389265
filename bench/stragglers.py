"""What the straggler figures cost a training step (albert_dist/engine/stragglers.py): tests/fixtures/ranks.py's tiny
2-rank job (gloo, CPU) with the monitor on and off, alternated, at a gather every step (log_interval_steps=1, the
worst case) and every 10 (the default).

    python bench/stragglers.py [--repeats 3] [--steps 60] [--out bench/results/stragglers.json]

Two figures per job, both from rank 0 and rank 1 of the same run:

- the monitor's own time: every call the loop makes to it (two busy-clock reads per step, the gather and the
  warning rule per log interval) timed with ``time.perf_counter`` inside the ranks, per step, over the median
  wall time of a step (the time between successive ends of steps, the first `WARMUP_STEPS` left out). This is
  the cost; the larger of the two ranks is reported. Its wall time holds the gather's wait for the other rank
  to arrive (on a loaded machine, a rank descheduled for a time slice), a skew the next collective would wait
  out otherwise; its CPU time (``time.thread_time``) is printed beside it.
- the median step wall time with the monitor on over off, jobs alternated: the same cost seen from outside, with
  the machine's noise (on 2 shared cores it is several % either way, more than the cost itself).

Not part of `make bench` (no ``run``): each job starts 2 ranks (forked from tests/fixtures/forkserver.py). The
tiny model's step (~40-100 ms on a CPU) is the short end: a real step is longer, the monitor's time the same.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

#: steps at the start of a job left out of its step times (the first step builds the loader's queue, etc.)
WARMUP_STEPS = 5
LOG_INTERVALS = (1, 10)


def _worker(mode: str, out: str, config: str, overrides: list[str]) -> int:
    """One rank: the real Trainer, its StragglerMonitor timed ("on") or replaced by a no-op ("off")."""
    import pytest
    import torch

    import deepspeed.ops

    from albert_dist.apps.pretrain import trainer as trainer_module
    from albert_dist.config import load_config
    from albert_dist.distributed.env import discover
    from albert_dist.engine.stragglers import StragglerMonitor
    from albert_dist.job.console import configure_logging
    from albert_dist.apps.pretrain.preflight import plan_job

    torch.set_num_threads(1)
    ends: list[float] = []
    spent = [0.0, 0.0]  # the monitor's calls: wall seconds, this thread's CPU seconds

    class Timed(StragglerMonitor):
        def _timed(self, method, *args):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(self, *args)
            finally:
                spent[0] += time.perf_counter() - start
                spent[1] += time.thread_time() - cpu

        def start_compute(self):
            return self._timed(StragglerMonitor.start_compute)

        def end_step(self, data_wait_s):
            self._timed(StragglerMonitor.end_step, data_wait_s)
            ends.append(time.perf_counter())

        def interval(self, step):
            return self._timed(StragglerMonitor.interval, step)

    class Off:
        def __init__(self, *args, **kwargs):
            pass

        def start_compute(self):
            pass

        def end_step(self, data_wait_s):
            ends.append(time.perf_counter())

        def interval(self, step):
            return {}

        def close(self):
            pass

    env = discover()
    configure_logging(env.rank)
    with pytest.MonkeyPatch.context() as mp:
        # as tests/distributed/ckpt_worker.py: plain gloo collectives, not DeepSpeed's JIT-built shared-memory op
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
        mp.setattr(trainer_module, "StragglerMonitor", Timed if mode == "on" else Off)
        cfg = load_config(config, overrides)
        trainer = trainer_module.Trainer(plan_job(cfg, env))
        try:
            trainer.setup()
            code = trainer.train()
        finally:
            trainer.close("FINISHED")
    steps = [b - a for a, b in zip(ends[WARMUP_STEPS:], ends[WARMUP_STEPS + 1:])]
    Path(f"{out}.rank{env.rank}.json").write_text(json.dumps(
        {"mode": mode, "step_wall_s": statistics.median(steps), "monitor_s_per_step": spent[0] / len(ends),
         "monitor_cpu_s_per_step": spent[1] / len(ends),
         "steps": len(ends)}))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # the worker's (fixtures.ranks.Job passes it)
    args, rest = parser.parse_known_args(argv)
    if args.worker:
        return _worker(*args.worker, args.config, rest)

    from fixtures.ranks import CONFIG, run_ok

    root = Path(tempfile.mkdtemp(prefix="stragglers-"))
    config = root / "tiny.yaml"
    config.write_text(CONFIG)
    load = os.getloadavg()
    started = time.perf_counter()
    cells: dict = {}
    for interval in LOG_INTERVALS:
        cell = cells[f"log_interval_{interval}"] = {"on": [], "off": [], "cost_share": [], "cpu_cost_share": [],
                                                    "on_over_off": []}
        for i in range(args.repeats):
            walls = {}
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                run = root / f"run-{interval}-{i}-{mode}"
                out = root / f"figures-{interval}-{i}-{mode}"
                run_ok(2, config, run, [], [f"max_steps={args.steps}", f"log_interval_steps={interval}",
                                            "checkpoint.save_interval_steps=0"],
                       command=[sys.executable, str(Path(__file__).resolve()), "--worker", mode, str(out)])
                ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
                walls[mode] = statistics.median(r["step_wall_s"] for r in ranks)
                cell[mode].append(walls[mode])
                if mode == "on":
                    cell["cost_share"].append(max(r["monitor_s_per_step"] / r["step_wall_s"] for r in ranks))
                    cell["cpu_cost_share"].append(max(r["monitor_cpu_s_per_step"] / r["step_wall_s"] for r in ranks))
            cell["on_over_off"].append(walls["on"] / walls["off"])
    shutil.rmtree(root, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {"commit": commit.strip(), "command": "python bench/stragglers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "steps": args.steps, "repeats": args.repeats, "warmup_steps": WARMUP_STEPS,
              "load_average_at_start": [round(x, 2) for x in load],
              "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "cells": cells,
              "seconds": round(time.perf_counter() - started, 1)}
    print(f"straggler monitor, tiny 2-rank job, {args.steps} steps, {args.repeats} alternated pairs of jobs; load "
          f"{result['load_average_at_start'][0]} at the start, {result['load_average_at_end'][0]} at the end")
    for name, cell in cells.items():
        share, cpu = cell["cost_share"], cell["cpu_cost_share"]
        print(f"  {name}: monitor's own time / step wall time: median {statistics.median(share):.3%}, max "
              f"{max(share):.3%} (its CPU time: median {statistics.median(cpu):.3%}); step wall on / off: {' '.join(f'{x:.3f}' for x in cell['on_over_off'])} "
              f"(step {statistics.median(cell['off']) * 1e3:.1f} ms off, {statistics.median(cell['on']) * 1e3:.1f} "
              f"ms on)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
