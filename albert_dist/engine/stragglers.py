"""Stragglers: each rank's own busy time per step and its data wait, gathered on the host once per log interval;
rank 0 logs the max, the median and the slowest rank, and warns about a rank slow for several intervals in a row.

In synchronous data-parallel training every rank's wall time per step is the same: a fast rank waits for the slow
one in the step's collectives. What differs is each rank's *busy* time, the part of the step it did not spend
waiting for the others. It is measured per step, without a collective or a device sync, as

    step time = data wait (host wall clock of the batch fetch, no collective in it: `Trainer._fetch_step`)
              + the compute phase's busy time (forward, backward, optimiser step: `optimizer_step`),

where the compute phase's busy time is, by device:

- CPU (gloo): the trainer thread's *runnable* time, on-CPU time (``time.thread_time``) plus the time it sat on the
  run queue wanting a CPU (``run_delay`` of ``/proc/thread-self/schedstat``, Linux schedstats). A rank blocked in a
  gloo collective sleeps (0% CPU, not runnable): that time is left out. A rank slowed by a slower or throttled core,
  by memory contention, or by other processes on its cores (time it waits on the run queue) is seen. Not seen: a
  process stopped by SIGSTOP (a stopped task is neither running nor queued; only a stop inside the data fetch
  lands in the data wait), and a wait that spins instead of sleeping (a busy-polling transport such as
  DeepSpeed's shared-memory all-reduce, which the trainer does not use for training). Without schedstats (not
  Linux, or a kernel without CONFIG_SCHED_INFO) the on-CPU time alone: contention with other processes unseen.
  With several torch threads, the trainer thread's figure stands for the parallel regions it joins.
- CUDA: the device time of the forward passes, from a pair of CUDA events around each training-mode forward
  (hooks on the engine's module), read at the log interval, after the interval's metrics have synchronised the
  device (no sync per step). The host's own figures mean little there: it runs ahead of the device and then
  waits, spinning or sleeping, at the step's syncs, and the backward and optimiser step hold the ZeRO collectives
  (the compute stream waits for them: the peers' time). The forward under ZeRO 0-2 holds none, so ranks compare
  like with like; it is about a third of the step's compute (backward ~2x), so the step time is then the data
  wait plus a partial compute figure. Under ZeRO-3 the forward holds parameter all-gathers: waits again.

Per rank the interval's figure is the mean per step (seconds). Rank 0 gathers [step time, data wait] from every
rank with one `torch.distributed.gather` of a 2-element float64 host tensor over the gloo side group the stop flag
uses (`albert_dist.distributed.collectives.host_group`); the host names are gathered once, at construction. The
cost (two clock reads per step, one gather per interval) is measured by bench/stragglers.py.

The rule (`SlowRankRule`): a rank whose step time is over `SLOW_FACTOR` x the median of every rank's for
`SLOW_INTERVALS` log intervals in a row is named in one warning with its host (again after it was under the bar,
and every further `SLOW_INTERVALS` intervals it stays over it). With 2 ranks the median is their mean, so the bar
is the other rank's time x 1.67. Megatron-LM's straggler detector reports min/max over ranks with the rank each
interval; NVIDIA's resiliency extension scores ranks against each other; the factor and the count are ours.
"""
from __future__ import annotations

import logging
import os
import socket
import statistics
import threading
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from albert_dist.distributed.collectives import is_multi_rank
from albert_dist.engine import metric_names as names

logger = logging.getLogger(__name__)

#: A rank is slow in an interval when its step time is over this many times the median over ranks.
SLOW_FACTOR = 1.25
#: Log intervals in a row a rank must be slow before the warning names it.
SLOW_INTERVALS = 3


def summarize(step_s: Sequence[float], data_wait_s: Sequence[float]) -> dict[str, float]:
    """The interval's straggler metrics from every rank's figures, index = global rank (seconds per step):
    `perf/step_time_s_max`, `perf/step_time_s_median`, `perf/slowest_rank` (the rank with the largest step time, the
    lowest such rank on a tie) and the same three for the data wait. The median of an even count is the mean of the
    middle two (`statistics.median`). Raises `ValueError` for empty or unequal-length inputs."""
    if not step_s or len(step_s) != len(data_wait_s):
        raise ValueError(f"straggler figures need one step time and one data wait per rank, got {len(step_s)} and "
                         f"{len(data_wait_s)}")
    record = {}
    for values, max_name, median_name, rank_name in (
            (step_s, names.PERF_STEP_TIME_S_MAX, names.PERF_STEP_TIME_S_MEDIAN, names.PERF_SLOWEST_RANK),
            (data_wait_s, names.PERF_DATA_WAIT_S_MAX, names.PERF_DATA_WAIT_S_MEDIAN, names.PERF_DATA_WAIT_SLOWEST_RANK)):
        slowest = max(range(len(values)), key=lambda r: (values[r], -r))
        record[max_name] = float(values[slowest])
        record[median_name] = float(statistics.median(values))
        record[rank_name] = float(slowest)
    return record


class SlowRankRule:
    """Counts, per rank, the log intervals in a row in which its step time was over `factor` x the median over
    ranks; `update` returns the ranks whose count just reached `intervals` (or a further multiple of it)."""

    def __init__(self, factor: float = SLOW_FACTOR, intervals: int = SLOW_INTERVALS):
        if not factor > 1.0:
            raise ValueError(f"factor must be > 1, got {factor!r}")
        if intervals < 1:
            raise ValueError(f"intervals must be >= 1, got {intervals!r}")
        self.factor, self.intervals = float(factor), int(intervals)
        self.streak: list[int] = []

    def update(self, step_s: Sequence[float]) -> list[int]:
        """One interval's step times (index = rank, seconds per step): the ranks to name now, ascending."""
        if len(self.streak) != len(step_s):
            self.streak = [0] * len(step_s)
        bar = self.factor * statistics.median(step_s)
        named = []
        for rank, value in enumerate(step_s):
            self.streak[rank] = self.streak[rank] + 1 if value > bar else 0
            if self.streak[rank] and self.streak[rank] % self.intervals == 0:
                named.append(rank)
        return named


class BusyClock:
    """Seconds the calling thread was runnable since an arbitrary origin: on-CPU time (``time.thread_time``) plus
    the run-queue wait ``run_delay`` of ``/proc/self/task/<tid>/schedstat`` (ns; Linux schedstats), or the on-CPU
    time alone when that file cannot be read (`has_run_delay` False). The file is opened for the thread that reads
    the clock (again when another thread reads it, or after `close`)."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._tid: Optional[int] = None
        self.has_run_delay = self._open()

    def _open(self) -> bool:
        self.close()
        self._tid = threading.get_native_id()
        try:
            self._fd = os.open(f"/proc/self/task/{self._tid}/schedstat", os.O_RDONLY)
            self._run_delay_ns()
        except (OSError, ValueError, IndexError):
            self.close()
            self._tid = threading.get_native_id()  # no file for this thread: the on-CPU time alone
        return self._fd is not None

    def _run_delay_ns(self) -> int:
        # "<on-cpu ns> <run-queue wait ns> <timeslices>"; pread at 0 makes the kernel write it afresh
        return int(os.pread(self._fd, 128, 0).split()[1])

    def __call__(self) -> float:
        if self._tid != threading.get_native_id():
            self.has_run_delay = self._open()
        if self._fd is None:
            return time.thread_time()
        return time.thread_time() + self._run_delay_ns() * 1e-9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._tid = None


class _ForwardEvents:
    """CUDA events around every training-mode forward of a module (hooks), summed at `read` (ms -> s)."""

    def __init__(self, module: torch.nn.Module):
        self._pairs: list[tuple[Any, Any]] = []
        self._open: Any = None
        self._handles = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _pre(self, module, args) -> None:
        if module.training:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()

    def _post(self, module, args, output) -> None:
        if module.training and self._open is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs.append((self._open, end))
            self._open = None

    def read(self) -> float:
        """Device seconds of the forwards since the last read (waits for the last one's end event)."""
        if not self._pairs:
            return 0.0
        self._pairs[-1][1].synchronize()
        seconds = sum(start.elapsed_time(end) for start, end in self._pairs) / 1e3
        self._pairs = []
        return seconds

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class StragglerMonitor:
    """The loop's straggler figures (module docstring): `start_compute()` before a step's forward, `end_step()`
    after its optimiser step, `interval()` at each log step (collective). Construction is collective when a process
    group is up (every rank's host name, over `group`): the trainer makes it in `setup()`.

    Args:
        rank, world_size: this rank and the number of ranks.
        group: the gloo group of the host collectives (`host_group()`: None is the default group).
        device: the training device; CUDA takes the forward passes' device time from `module`'s hooks.
        module: the model (required on CUDA).
        clock: the compute phase's busy clock in seconds (default `BusyClock()`; tests pass their own).
    """

    def __init__(self, rank: int, world_size: int, group: Any = None, device: Optional[torch.device] = None,
                 module: Optional[torch.nn.Module] = None, clock: Optional[Callable[[], float]] = None):
        self.rank, self.world_size, self.group = rank, world_size, group
        self._events = None
        self._busy_clock: Optional[BusyClock] = None
        if clock is None and device is not None and device.type == "cuda":
            if module is None:
                raise ValueError("StragglerMonitor on CUDA needs the model (module) for its forward events")
            self._events = _ForwardEvents(module)
        elif clock is None:
            clock = self._busy_clock = BusyClock()
        self._clock = clock
        self.rule = SlowRankRule()
        self.hosts = self._gather_hosts()
        self._reset()
        self._started: Optional[float] = None

    def _gather_hosts(self) -> list[str]:
        host = socket.gethostname()
        if not is_multi_rank():
            return [host]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, host, group=self.group)
        return [str(h) for h in out]

    def _reset(self) -> None:
        self._compute_s, self._wait_s, self._steps = 0.0, 0.0, 0

    def start_compute(self) -> None:
        """Mark the start of a step's compute phase (after its batches are on hand)."""
        if self._clock is not None:
            self._started = self._clock()

    def end_step(self, data_wait_s: float) -> None:
        """Close the step: its compute phase ends now; `data_wait_s` is its batch fetch's host wall time."""
        if self._clock is not None and self._started is not None:
            self._compute_s += self._clock() - self._started
        self._started = None
        self._wait_s += float(data_wait_s)
        self._steps += 1

    def local(self) -> tuple[float, float]:
        """This rank's open interval: (step time, data wait), seconds per step (0 before any step)."""
        compute = self._compute_s + (self._events.read() if self._events is not None else 0.0)
        steps = max(self._steps, 1)
        return (self._wait_s + compute) / steps, self._wait_s / steps

    def interval(self, step: int) -> dict[str, float]:
        """Close the interval (collective over `group` when a process group is up: every rank calls it at the same
        step): rank 0 returns `summarize` of every rank's figures and logs the warning of `SlowRankRule`; the
        other ranks return {}."""
        mine = torch.tensor(self.local(), dtype=torch.float64)
        self._reset()
        if is_multi_rank():
            gathered = [torch.zeros_like(mine) for _ in range(self.world_size)] if self.rank == 0 else None
            dist.gather(mine, gathered, dst=0, group=self.group)
        else:
            gathered = [mine]
        if self.rank != 0:
            return {}
        step_s = [float(g[0]) for g in gathered]
        wait_s = [float(g[1]) for g in gathered]
        record = summarize(step_s, wait_s)
        median = record[names.PERF_STEP_TIME_S_MEDIAN]
        for slow in self.rule.update(step_s):
            logger.warning("straggler: rank %d on host %s took %.3g s per step, %.2fx the median %.3g s over %d "
                           "ranks, for %d log intervals in a row (up to step %d)", slow, self.hosts[slow],
                           step_s[slow], step_s[slow] / median if median > 0 else float("inf"), median,
                           self.world_size, self.rule.streak[slow], step)
        return record

    def close(self) -> None:
        """Release the schedstat file and the CUDA hooks. Idempotent."""
        if self._busy_clock is not None:
            self._busy_clock.close()
        if self._events is not None:
            self._events.close()


__all__ = ["BusyClock", "SLOW_FACTOR", "SLOW_INTERVALS", "SlowRankRule", "StragglerMonitor", "summarize"]
