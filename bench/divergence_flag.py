"""The per-step cost of the divergence flag (`albert_dist.engine.divergence.DivergenceMonitor.add_step`): host time
per step and the kernels it launches, with the spike window full (the most work: 128 steps of history).

It reads nothing from the device (tests/unit/test_divergence_detector.py makes every host read raise inside it, and
tests/distributed/test_host_syncs.py counts none in the real loop's steps), so on a GPU its cost is the launch of
its small kernels, queued behind the step's own; on a CPU the kernels run inline and this is their whole cost.

    python bench/divergence_flag.py [--steps 2000] [--micro-steps 2]

Prints microseconds per `add_step` (median of 5 repeats) and the top-level ATen calls one call makes
(torch.profiler), each at most one kernel launch on a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

from albert_dist.engine.divergence import DivergenceConfig, DivergenceMonitor


def outputs(micro_steps: int, device: torch.device) -> list:
    """A step's micro-step outputs as the model returns them (fp32 loss sums, int64 counts)."""
    return [types.SimpleNamespace(mlm_loss_sum=torch.tensor(70.0, device=device),
                                  mlm_count=torch.tensor(10, device=device),
                                  sop_loss_sum=torch.tensor(5.5, device=device),
                                  sop_count=torch.tensor(8, device=device)) for _ in range(micro_steps)]


def time_add_step(steps: int, micro_steps: int, device: torch.device) -> float:
    """Seconds per `add_step` over `steps` calls after the window filled."""
    mon = DivergenceMonitor(DivergenceConfig(), device)
    outs = outputs(micro_steps, device)
    for step in range(1, 129):
        mon.add_step(step, outs, 0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for step in range(129, 129 + steps):
        mon.add_step(step, outs, 0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def ops_per_step(micro_steps: int, device: torch.device) -> int:
    mon = DivergenceMonitor(DivergenceConfig(), device)
    outs = outputs(micro_steps, device)
    for step in range(1, 129):
        mon.add_step(step, outs, 0)
    with torch.profiler.profile() as prof:
        mon.add_step(129, outs, 0)
    # top-level ATen calls (an aten::to's own copy is not counted again): what a GPU launches, at most one kernel each
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--micro-steps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        times = [time_add_step(args.steps, args.micro_steps, device) for _ in range(5)]
        print(f"{device.type}: add_step {statistics.median(times) * 1e6:.0f} us per step (median of 5, min "
              f"{min(times) * 1e6:.0f}, max {max(times) * 1e6:.0f}; {args.micro_steps} micro-steps, window 128 full); "
              f"{ops_per_step(args.micro_steps, device)} top-level ATen calls per step")


if __name__ == "__main__":
    main()
