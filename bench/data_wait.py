"""Data wait under gradient accumulation: GA 1 vs GA 16 at equal global batch, the loader's old depth vs a step's.

The trainer takes all GA micro-batches of a step before its first forward (the loss is normalised by the step's
label counts, albert_dist/engine/loss.py). A loader that keeps ``num_workers x 2`` = 4 batches in flight
(torch's default ``prefetch_factor``, what `build_train_loader` used before ``micro_batches_per_step``) stops
making batches once those 4 are ready, so at GA 16 the next step waits while the workers make the other 12; at
GA 1 the 4 in flight are 4 whole steps. Sized for the step (``num_workers x prefetch_factor >= GA``,
`albert_dist.data.loader.prefetch_factor_for`), the workers make the next step's micro-batches while this one
computes.

What is measured is the queueing, not the CPU: torchdata's ``StatefulDataLoader`` (as `build_train_loader`
configures it: 2 workers, the prefetch factor of each cell) over a stream whose worker spends ``SAMPLE_S`` per
sequence (a sleep, then a collated batch of real shapes, S=512, through the workers' shared memory), and the
trainer's loop shape: take GA batches (timed: the data wait), then the step's compute (a sleep: a GPU step leaves
the host idle). Sleeps make the figures independent of the load of a shared machine, which would otherwise slow
the workers and not the "device"; the real pipeline's rate is `bench/data_pipeline.py`'s. The step computes
``HEADROOM`` times as long as the workers need for its sequences (a loader that keeps up, but not by much: the
regime where depth decides). Global batch 32 sequences per step: GA 1 x 32 and GA 16 x 2. Three cells: GA 1 (4
in flight either way), GA 16 at the old depth 4, GA 16 at depth 16. The figure per cell is torchtitan's
data-loading share: the sum of waits / wall time over the measured steps, after warm-up steps that fill the queue.

    python bench/data_wait.py [--repeats 3] [--steps 15]

``run(repeats=..., steps=...)`` returns per-repeat lists for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import time

import torch

from _common import fmt_stats

SEQ = 512
GLOBAL = 32  # sequences per step (one rank)
WORKERS = 2
SAMPLE_S = 0.025  # a worker's time per sequence
HEADROOM = 1.5  # step compute time / the workers' time for the step's sequences (both workers busy)
WARMUP_STEPS = 3
CELLS = {"ga1": (1, 1), "ga16_old_depth": (16, 1), "ga16_step_depth": (16, 16)}
"""Cell -> (gradient accumulation steps, micro_batches_per_step given to the loader: 1 = torch's default depth)."""


class SlowStream(torch.utils.data.IterableDataset):
    """Micro-batches of `micro` sequences of SEQ positions (the training loader's five tensors), each after
    `micro` x SAMPLE_S seconds of "work"."""

    def __init__(self, micro: int):
        self.micro = micro

    def __iter__(self):
        ids = torch.ones(self.micro, SEQ, dtype=torch.int64)
        while True:
            time.sleep(self.micro * SAMPLE_S)
            yield {"input_ids": ids.clone(), "attention_mask": ids.clone(), "token_type_ids": ids.clone(),
                   "mlm_labels": ids.clone(), "sop_labels": torch.zeros(self.micro, dtype=torch.int64)}


def _cell(ga: int, depth_for: int, steps: int) -> dict:
    """The trainer's loop shape over `steps` measured steps: data-wait share, seconds per step, batches in flight."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from albert_dist.data.loader import prefetch_factor_for

    loader = StatefulDataLoader(SlowStream(GLOBAL // ga), batch_size=None, num_workers=WORKERS,
                                persistent_workers=False, prefetch_factor=prefetch_factor_for(WORKERS, depth_for))
    compute_s = HEADROOM * GLOBAL * SAMPLE_S / WORKERS
    it = iter(loader)
    waited, start = 0.0, time.perf_counter()
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            waited, start = 0.0, time.perf_counter()
        t0 = time.perf_counter()
        for _ in range(ga):
            next(it)
        waited += time.perf_counter() - t0
        time.sleep(compute_s)  # the device's step; the host is free
    wall = time.perf_counter() - start
    del it  # shuts the workers down
    return {"share": waited / wall, "step_s": wall / steps, "in_flight": loader.num_workers * loader.prefetch_factor}


def run(repeats: int = 3, steps: int = 15) -> dict:
    """Per repeat: each cell's data-wait share and step time, and the ratios (step time GA 16 / GA 1 at each
    depth; at GA 16, old depth / step depth)."""
    torch.set_num_threads(1)
    cells: dict = {name: {"share": [], "step_s": []} for name in CELLS}
    for _ in range(repeats):
        for name, (ga, depth_for) in CELLS.items():
            cell = _cell(ga, depth_for, steps)
            cells[name]["share"].append(cell["share"])
            cells[name]["step_s"].append(cell["step_s"])
            cells[name]["in_flight"] = cell["in_flight"]

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(cells[a]["step_s"], cells[b]["step_s"])]

    return {**cells, "compute_s": HEADROOM * GLOBAL * SAMPLE_S / WORKERS,
            "ratio_step_ga16_over_ga1_old_depth": ratio("ga16_old_depth", "ga1"),
            "ratio_step_ga16_over_ga1_step_depth": ratio("ga16_step_depth", "ga1"),
            "ratio_step_old_over_step_depth_ga16": ratio("ga16_old_depth", "ga16_step_depth"),
            "seq_len": SEQ, "global_batch": GLOBAL, "workers": WORKERS, "sample_s": SAMPLE_S, "headroom": HEADROOM,
            "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    res = run(args.repeats, args.steps)
    print(f"data wait, {GLOBAL} sequences of {SEQ} per step, {WORKERS} workers at {SAMPLE_S * 1e3:g} ms per sequence, "
          f"step compute {res['compute_s'] * 1e3:.0f} ms ({HEADROOM}x the workers' time), {args.steps} steps x "
          f"{args.repeats} repeats (min / median / max)")
    for name, (ga, _) in CELLS.items():
        cell = res[name]
        print(f"  {name:16s} GA {ga:2d} x micro {GLOBAL // ga:2d}, {cell['in_flight']:2d} in flight: data-wait share "
              f"{fmt_stats(cell['share'])}, step {fmt_stats(cell['step_s'], 1e-3, 1)} ms")
    print(f"  step time GA 16 / GA 1, old depth:  {fmt_stats(res['ratio_step_ga16_over_ga1_old_depth'])}")
    print(f"  step time GA 16 / GA 1, step depth: {fmt_stats(res['ratio_step_ga16_over_ga1_step_depth'])}")
    print(f"  step time at GA 16, old depth / step depth: {fmt_stats(res['ratio_step_old_over_step_depth_ga16'])}")


if __name__ == "__main__":
    main()
