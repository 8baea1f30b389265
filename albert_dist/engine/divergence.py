"""Divergence: a diverging run found from a flag the device accumulates every step, read on the host only at a log
step and before a checkpoint save; what the job then does is `divergence.policy` (stop, or roll back and skip the
data that led there).

Three signs, any one flags a step (`DivergenceMonitor.add_step`):

* a non-finite loss: this rank's step loss (MLM per masked token + SOP per labelled sequence over its micro-steps,
  the sums the metrics accumulate) is inf or NaN;
* a loss spike: that loss is more than ``spike_zscore`` standard deviations above the mean of the last
  ``spike_window_steps`` steps' losses, once the window holds at least half that many (OLMo-core's rule and
  defaults, 6 sigma over the last 128 steps, active from 64: allenai/OLMo-core
  src/olmo_core/optim/skip_step_optimizer.py, `SkipStepOptimizer.get_step_factor`; one-sided: a loss that falls
  fast is no divergence; the standard deviation is the unbiased one, as `torch.std_mean`'s there);
* a run of ``max_skipped_steps`` consecutive optimiser steps DeepSpeed skipped for inf/NaN gradients
  (`engine.skipped_steps`, a host int DeepSpeed keeps: read without a sync).

No host sync per step: the loss, the window, the z-score and the flags stay on the device (a few scalar kernels
per step, no `.item()`; tests/distributed/test_host_syncs.py counts the reads). `read` copies the flags to the host
once (the log step's metric reduce drains the device there anyway) and, on several ranks, agrees them with one
MAX all-reduce of a host tensor over the gloo group (`albert_dist.distributed.collectives.host_group`), so every
rank sees the same verdict at the same step. The trainer reads at every log step and before every checkpoint save,
so no checkpoint holds the weights of a flagged step (`albert_dist.apps.pretrain.trainer`).

Testing switch: ``ALBERT_INJECT_NONFINITE_STEP=N[,M...]`` (environment, every rank) makes the loss of step N
(1-based, the step the console logs as N) NaN before its backward pass, once per process (a rollback that trains
step N again trains it clean); `injected_steps` reads it. For tests and chaos runs only; unset in production.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence, get_args

from albert_dist.on_resume import QUIET, on_resume

if TYPE_CHECKING:
    import torch

Policy = Literal["stop", "rollback"]
#: `DivergenceConfig.policy` values.
POLICIES: tuple[str, ...] = get_args(Policy)
#: The testing switch (module docstring): steps whose loss is made NaN.
INJECT_ENV = "ALBERT_INJECT_NONFINITE_STEP"


@dataclass
class DivergenceConfig:
    """What counts as divergence and what the job does about it (the `divergence:` section of a recipe)."""

    policy: Policy = field(default="rollback", metadata=on_resume(QUIET))
    """"rollback": reload the newest healthy checkpoint, skip the data since it, go on (at most `max_rollbacks`
    times, then stop); "stop": exit 77 (EXIT_DIVERGED) at once. Either way no checkpoint of flagged weights."""
    max_rollbacks: int = field(default=3, metadata=on_resume(QUIET))
    """Rollbacks one job may do (policy rollback); the next divergence stops it with exit 77."""
    spike_window_steps: int = field(default=128, metadata=on_resume(QUIET))
    """Steps of loss history the spike test compares with (OLMo-core: 128); 0 turns the spike test off."""
    spike_zscore: float = field(default=6.0, metadata=on_resume(QUIET))
    """A step's loss this many standard deviations above the window's mean is a spike (OLMo-core: 6)."""
    max_skipped_steps: int = field(default=5, metadata=on_resume(QUIET))
    """This many consecutive steps skipped by DeepSpeed for inf/NaN gradients flag divergence; 0: off."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"divergence.policy must be one of {POLICIES}, got {self.policy!r}")
        if isinstance(self.max_rollbacks, bool) or self.max_rollbacks < 0:
            raise ValueError(f"divergence.max_rollbacks must be >= 0, got {self.max_rollbacks!r}")
        if self.spike_window_steps < 0 or self.spike_window_steps == 1:
            raise ValueError(f"divergence.spike_window_steps must be 0 (off) or >= 2, got {self.spike_window_steps!r}")
        if not (isinstance(self.spike_zscore, (int, float)) and math.isfinite(self.spike_zscore)
                and self.spike_zscore > 0):
            raise ValueError(f"divergence.spike_zscore must be a finite number > 0, got {self.spike_zscore!r}")
        if self.max_skipped_steps < 0:
            raise ValueError(f"divergence.max_skipped_steps must be >= 0 (0: off), got {self.max_skipped_steps!r}")

    @property
    def min_history(self) -> int:
        """Earlier steps the window must hold before the spike test runs: half the window, at least 2
        (OLMo-core's ``max(2, rolling_interval_length // 2)``)."""
        return max(2, self.spike_window_steps // 2)


def injected_steps(environ: Optional[dict] = None) -> frozenset[int]:
    """The steps ``ALBERT_INJECT_NONFINITE_STEP`` (in `environ`, default `os.environ`) names: comma-separated
    integers >= 1; empty when unset. Raises `ValueError` naming the variable and value otherwise."""
    value = (os.environ if environ is None else environ).get(INJECT_ENV, "").strip()
    if not value:
        return frozenset()
    try:
        steps = frozenset(int(v) for v in value.split(","))
    except ValueError:
        steps = frozenset({0})
    if not steps or min(steps) < 1:
        raise ValueError(f"${INJECT_ENV} must be step numbers >= 1, comma-separated, got {value!r}")
    return steps


@dataclass(frozen=True)
class Verdict:
    """What `DivergenceMonitor.read` found in the steps since the previous read, agreed by every rank."""

    first_step: int
    """The first flagged step (1-based, as logged)."""
    read_step: int
    """The step at which it was read (the last step trained on the flagged weights)."""
    nonfinite_steps: int
    """Steps with a non-finite loss (the most on any rank)."""
    spike_steps: int
    """Steps whose loss was a spike (the most on any rank)."""
    spike_zscore: float
    """The largest z-score of a flagged spike (0 when none)."""
    skipped_run: int
    """The longest run of consecutive skipped steps that flagged (0 when none)."""
    window_steps: int = 0
    """`DivergenceConfig.spike_window_steps`, for the message."""

    def reasons(self) -> str:
        """The signs, as a phrase: "a non-finite loss (2 steps), ..."."""
        out = []
        if self.nonfinite_steps:
            out.append(f"a non-finite loss ({self.nonfinite_steps} step{'s' if self.nonfinite_steps > 1 else ''})")
        if self.spike_steps:
            out.append(f"a loss spike ({self.spike_zscore:.3g} standard deviations above the mean of the last "
                       f"{self.window_steps} steps)")
        if self.skipped_run:
            out.append(f"{self.skipped_run} consecutive steps skipped by DeepSpeed for inf/NaN gradients")
        return ", ".join(out)


class TrainingDiverged(RuntimeError):
    """Training diverged and the policy stops the job (`EXIT_DIVERGED`): the message is the job's one line (the
    step, the signs, the newest healthy checkpoint). Raised on every rank alike."""

    def __init__(self, message: str, verdict: Verdict):
        super().__init__(message)
        self.verdict = verdict


# Slots of the device state vector
_NONFINITE, _SPIKE, _FIRST, _MAX_Z = range(4)


class DivergenceMonitor:
    """One rank's divergence flags, accumulated on `device` every step (`add_step`, no host sync) and read with
    `read` (one host copy; collective on several ranks).

    Args:
        cfg: the `DivergenceConfig`.
        device: where the losses are (the engine's device).
        skipped_steps: DeepSpeed's `engine.skipped_steps` now (restored from a checkpoint), the base of the
            skipped-run count.
    """

    def __init__(self, cfg: DivergenceConfig, device: Any, skipped_steps: int = 0):
        self.cfg = cfg
        self.device = device
        self.reset(skipped_steps)

    def reset(self, skipped_steps: int = 0) -> None:
        """Forget everything: the flags, the loss window (after a rollback the window restarts: the spike test
        is off again for `min_history` steps) and the skipped run."""
        import torch

        self._state = torch.zeros(4, dtype=torch.float64, device=self.device)
        self._window = torch.zeros(max(self.cfg.spike_window_steps, 1), dtype=torch.float64, device=self.device)
        self._filled = 0  # host ints: one entry per step, so no sync is needed to know them
        self._pos = 0
        self._skipped_prev = int(skipped_steps)
        self._run = 0  # consecutive skipped steps ending at the last step
        self._run_flag: Optional[tuple[int, int]] = None  # (first step of the run, its length) once it flagged
        self.unread = 0  # steps added since the last read

    @staticmethod
    def step_loss(outputs: Sequence[Any]) -> "torch.Tensor":
        """This rank's loss of one optimiser step from its micro-steps' `PreTrainingOutput`s: summed MLM
        cross-entropy / masked tokens + summed SOP cross-entropy / labelled sequences (a zero count counts 1),
        a float64 scalar on their device; no host sync."""
        import torch

        sums = torch.stack([torch.stack([o.mlm_loss_sum.double(), o.mlm_count.double(), o.sop_loss_sum.double(),
                                         o.sop_count.double()]) for o in outputs]).sum(0)
        return sums[0] / sums[1].clamp(min=1) + sums[2] / sums[3].clamp(min=1)

    def add_step(self, step: int, outputs: Sequence[Any], skipped_steps: int) -> None:
        """Add optimiser step `step` (1-based): its micro-steps' outputs (device tensors) and DeepSpeed's
        `engine.skipped_steps` after it (a host int). Device ops only, no host read."""
        loss = self.step_loss(outputs)
        self.add_loss(step, loss)
        skipped = int(skipped_steps)
        self._run = self._run + (skipped - self._skipped_prev) if skipped > self._skipped_prev else 0
        self._skipped_prev = skipped
        limit = self.cfg.max_skipped_steps
        if limit and self._run >= limit and self._run_flag is None:
            self._run_flag = (step - self._run + 1, self._run)
        elif self._run_flag is not None and self._run > self._run_flag[1]:
            self._run_flag = (self._run_flag[0], self._run)

    def add_loss(self, step: int, loss: "torch.Tensor") -> None:
        """The device half of `add_step`: flag `loss` (a scalar tensor on the device) as non-finite or a spike
        against the window, then put it into the window."""
        import torch

        loss = loss.to(torch.float64)
        nonfinite = ~torch.isfinite(loss)
        flagged = nonfinite
        z = torch.zeros((), dtype=torch.float64, device=loss.device)
        if self.cfg.spike_window_steps and self._filled >= self.cfg.min_history:
            std, mean = torch.std_mean(self._window[:self._filled])
            rise = loss - mean
            spike = (rise > self.cfg.spike_zscore * std) & ~nonfinite
            z = torch.where(spike, rise / std, z)
            flagged = flagged | spike
            self._state[_SPIKE] += spike.to(torch.float64)
            self._state[_MAX_Z] = torch.maximum(self._state[_MAX_Z], z)
        self._state[_NONFINITE] += nonfinite.to(torch.float64)
        first = self._state[_FIRST]
        self._state[_FIRST] = torch.where(flagged & (first == 0), torch.full_like(first, float(step)), first)
        if self.cfg.spike_window_steps:
            self._window[self._pos] = loss
            self._pos = (self._pos + 1) % self.cfg.spike_window_steps
            self._filled = min(self._filled + 1, self.cfg.spike_window_steps)
        self.unread += 1

    def window_state(self) -> list[float]:
        """The loss window, oldest first (a host read: for a checkpoint, whose save drains the device anyway)."""
        n, w = self._filled, self.cfg.spike_window_steps
        if not n:
            return []
        values = self._window.tolist()
        return values[:n] if n < w else values[self._pos:] + values[:self._pos]

    def restore_window(self, values: Sequence[float]) -> None:
        """Continue the loss window a checkpoint saved (`window_state`; the newest `spike_window_steps` of them),
        so the spike test works from the first step after a resume or a rollback, as without the restart."""
        import torch

        w = self.cfg.spike_window_steps
        keep = [float(v) for v in values][-w:] if w else []
        if keep:
            self._window[:len(keep)] = torch.tensor(keep, dtype=torch.float64).to(self.device)
        self._filled, self._pos = len(keep), len(keep) % max(w, 1)

    def read(self, step: int, group: Any = None) -> Optional[Verdict]:
        """The flags of the steps since the last read, agreed over the ranks, or None when none flagged; `step`
        is the current step. One host copy of the device state; collective on several ranks (every rank must
        read at the same step): one MAX all-reduce of a host float64 tensor over `group` (the gloo host group;
        None: the default group). Clears the flags (a verdict is handled: stop or roll back and `reset`)."""
        import torch
        import torch.distributed as dist

        from albert_dist.distributed.collectives import is_multi_rank

        nonfinite, spike, first, max_z = self._state.tolist()  # the one host read
        run_first, run = self._run_flag if self._run_flag is not None else (0, 0)
        firsts = [s for s in (first, run_first) if s > 0]
        # earliest first step through MAX: -step (0 when none flagged on this rank)
        agreed = torch.tensor([nonfinite, spike, max_z, run, -min(firsts) if firsts else -math.inf],
                              dtype=torch.float64)
        if is_multi_rank():
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        nonfinite, spike, max_z, run, neg_first = agreed.tolist()
        self._state.zero_()
        self._run_flag = None
        self.unread = 0
        if neg_first == -math.inf:
            return None
        return Verdict(first_step=int(-neg_first), read_step=int(step), nonfinite_steps=int(nonfinite),
                       spike_steps=int(spike), spike_zscore=float(max_z), skipped_run=int(run),
                       window_steps=self.cfg.spike_window_steps)


def stream_batches(loader_state: Any) -> Optional[int]:
    """Micro-batches a rank's training stream has yielded, read from its loader's `state_dict()`: the sum of the
    ``batches`` counters of every `albert_dist.data.loader.PretrainingStream` state inside it (one per loader
    worker; several for a loader resharded from other ranks' streams). None when it holds none (a loader whose
    iteration has not started, or another format). The exact-resume data cursor, in units the logs can name."""
    found: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "fingerprint" in node and isinstance(node.get("batches"), int):
                found.append(node["batches"])
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(loader_state)
    return sum(found) if found else None


def saved_window(metrics_states: Sequence[dict], rank: int) -> list[float]:
    """The loss window rank `rank` saved with a checkpoint (its `TrainState.metrics_states` entry, key
    ``"loss_window"``: `DivergenceMonitor.window_state`), or saved by rank ``rank % saved ranks`` when the number of
    ranks changed; [] when there is none (a fresh start, a checkpoint from before this existed)."""
    if not metrics_states:
        return []
    return list(metrics_states[rank % len(metrics_states)].get(WINDOW_KEY) or [])


#: The key of a rank's loss window in the open metric interval a checkpoint saves (`saved_window`).
WINDOW_KEY = "loss_window"

__all__ = ["DivergenceConfig", "DivergenceMonitor", "INJECT_ENV", "POLICIES", "TrainingDiverged", "Verdict",
           "WINDOW_KEY", "injected_steps", "saved_window", "stream_batches"]
