"""Training metrics: accumulation across micro-steps and ranks, MFU (against two peaks), peak memory.

The loop adds every micro-step's outputs to a `MetricAccumulator` as tensors on the device (no `.item()`, so
no host sync per micro-step); at a log step one `all_reduce` of a single vector sums them over ranks and the
record is computed on the host. The trainer names the quantities (`albert_dist.engine.metric_names`) and
hands them to its tracker (`albert_dist.tracking.base.Tracker`).
"""
from __future__ import annotations

import logging
import os
import resource
import time
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from albert_dist.distributed.collectives import is_multi_rank
from albert_dist.engine import metric_names as names
from albert_dist.engine.peaks import datasheet_peak

logger = logging.getLogger(__name__)

#: Environment variable with a device's datasheet peak dense TFLOP/s, read when engine.peak_tflops_per_device is unset.
PEAK_TFLOPS_ENV = "ALBERT_DIST_PEAK_TFLOPS"

#: The accumulator's vector, slot by name: sums added every micro-step (on the device), counts kept on the host
#: (shapes are known without a sync), and per-step values that are already global (equal on every rank).
_MICRO_FIELDS = ("mlm_loss_sum", "sop_loss_sum", "micro_steps", "mlm_correct", "mlm_count", "sop_correct",
                 "sop_count", "tokens", "mlm_dropped")
_HOST_FIELDS = ("samples", "positions")
_GLOBAL_FIELDS = ("grad_norm", "steps")
_FIELDS = _MICRO_FIELDS + _HOST_FIELDS + _GLOBAL_FIELDS
_SLOT = {name: i for i, name in enumerate(_FIELDS)}


class MetricAccumulator:
    """Sums of per-micro-step losses and counts on one rank, kept on `device` until `reduce` is called."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Start a new interval."""
        self._sums = torch.zeros(len(_FIELDS), dtype=torch.float64, device=self.device)
        self._samples = 0  # host-side: shapes are known without a sync
        self._positions = 0
        self._data_wait_s = 0.0  # host-side; not in the vector, whose layout checkpoints hold
        self._start = time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (evaluation, checkpointing) out of the interval's throughput."""
        self._start += seconds

    def add_micro_step(self, output: Any, attention_mask: Optional[torch.Tensor],
                       shape: Optional[tuple[int, int]] = None) -> None:
        """Add one micro-step: `output` a `PreTrainingOutput` (fp32 scalar loss sums, int64 counts) and the
        (B, S) int64 `attention_mask` of its batch (1 = real token), or None for a batch without padding (the
        model's maskless form, `albert_dist.data.pretraining.drop_full_mask`), whose (B, S) is then `shape`.
        Raises `ValueError` when both are None."""
        if attention_mask is not None:
            shape, tokens = tuple(attention_mask.shape), attention_mask.sum()
        elif shape is None:
            raise ValueError("add_micro_step needs the batch's (B, S) shape when attention_mask is None")
        else:  # every position is a token; a fill on the device, not a host-to-device copy
            tokens = torch.full((), shape[0] * shape[1], dtype=torch.float64, device=self.device)
        values = {
            "mlm_loss_sum": output.mlm_loss_sum.detach(), "sop_loss_sum": output.sop_loss_sum.detach(),
            "micro_steps": torch.ones((), device=self.device), "mlm_correct": output.mlm_correct,
            "mlm_count": output.mlm_count, "sop_correct": output.sop_correct, "sop_count": output.sop_count,
            "tokens": tokens, "mlm_dropped": output.mlm_dropped,
        }
        self._sums[:len(_MICRO_FIELDS)] += torch.stack([values[f].double() for f in _MICRO_FIELDS]).to(self.device)
        self._samples += shape[0]
        self._positions += shape[0] * shape[1]

    def add_data_wait(self, seconds: float) -> None:
        """Add the host seconds a step waited for its micro-batches (the loader and the copies' issue)."""
        self._data_wait_s += seconds

    def add_step(self, grad_norm: Any) -> None:
        """Add one optimiser step and its global gradient norm (a tensor on any device, a float, or None when
        unavailable); a tensor is added on the device, without a host sync."""
        if grad_norm is not None:
            self._sums[_SLOT["grad_norm"]] += torch.as_tensor(grad_norm, dtype=torch.float64).to(self.device)
        self._sums[_SLOT["steps"]] += 1

    def local_state(self) -> dict[str, Any]:
        """This rank's open interval, for a checkpoint (`TrainState.metrics_states`; no collective, no reset):
        {"sums": the vector's values in `_FIELDS` order with the host counts, "seconds": its training time so
        far}. A checkpoint written between two log steps holds the steps since the last log step, so the
        resumed job's first record covers the same steps as an uninterrupted job's (`restore`)."""
        sums = self._sums.tolist()
        sums[_SLOT["samples"]], sums[_SLOT["positions"]] = float(self._samples), float(self._positions)
        return {"sums": sums, "seconds": time.perf_counter() - self._start, "data_wait_s": self._data_wait_s}

    def restore(self, saved: list[dict[str, Any]], rank: int, world_size: int) -> None:
        """Continue the interval a checkpoint saved: `saved[r]` is rank r's `local_state()` at the save.

        On as many ranks as wrote it, each rank takes its own (the records are then bit-identical to an
        uninterrupted job's: same sums in the same order). On another number of ranks, rank 0 takes every saved
        rank's per-rank sums added up and every rank the global fields (equal on every saved rank), so `reduce`
        still sums to the interval's totals. Empty `saved` (a checkpoint from before this existed): nothing.
        Raises `ValueError` when a saved vector does not have this version's fields."""
        if not saved:
            return
        for state in saved:
            if len(state["sums"]) != len(_FIELDS):
                raise ValueError(f"saved metric interval has {len(state['sums'])} fields, expected {len(_FIELDS)}")
        if len(saved) == world_size:
            sums = [float(v) for v in saved[rank]["sums"]]
        else:
            per_rank = len(_MICRO_FIELDS) + len(_HOST_FIELDS)
            sums = [sum(float(s["sums"][i]) for s in saved) if rank == 0 else 0.0 for i in range(per_rank)]
            sums += [float(v) for v in saved[0]["sums"][per_rank:]]
        self._sums = torch.tensor(sums, dtype=torch.float64, device=self.device)
        self._samples, self._positions = int(sums[_SLOT["samples"]]), int(sums[_SLOT["positions"]])
        self._start = time.perf_counter() - float(saved[rank % len(saved)]["seconds"])
        self._data_wait_s = float(saved[rank % len(saved)].get("data_wait_s", 0.0))  # absent before it was saved

    def reduce(self) -> dict[str, float]:
        """Sum over ranks (collective when a process group is up) and return the interval's record:
        mlm_loss (cross-entropy per masked token of the interval, all ranks: the training loss's own
        normalisation, `albert_dist.engine.loss`), sop_loss (per labelled sequence), loss (their sum),
        mlm_accuracy, sop_accuracy (per masked token / labelled sequence), grad_norm
        (mean over the interval's steps), tokens_per_s (non-padding tokens), samples_per_s, positions_per_s
        (padded positions, what the FLOPs count), mlm_dropped (labelled positions no loss saw, all ranks:
        `PreTrainingOutput.mlm_dropped`; the trainer refuses any), data_wait_s (seconds per step waiting for
        data, `add_data_wait`, mean over ranks) and data_wait_share (that wait / the interval's time, as
        torchtitan's data-loading time and percentage). Resets the accumulator."""
        # the data wait rides last, after the global fields: divided by the world size like them, the mean over ranks
        sums = torch.cat([self._sums, self._sums.new_zeros(1)])
        sums[_SLOT["samples"]], sums[_SLOT["positions"]] = float(self._samples), float(self._positions)
        sums[-1] = self._data_wait_s
        if is_multi_rank():
            # one all-reduce for all slots; the global ones were equal on every rank, so their sum / world
            dist.all_reduce(sums)
            sums[_SLOT[_GLOBAL_FIELDS[0]]:] /= dist.get_world_size()
        s = dict(zip(_FIELDS + ("data_wait_s",), sums.tolist()))
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        mlm_loss = s["mlm_loss_sum"] / max(s["mlm_count"], 1.0)
        sop_loss = s["sop_loss_sum"] / max(s["sop_count"], 1.0)
        record = {
            "loss": mlm_loss + sop_loss, "mlm_loss": mlm_loss, "sop_loss": sop_loss,
            "mlm_accuracy": s["mlm_correct"] / max(s["mlm_count"], 1.0),
            "sop_accuracy": s["sop_correct"] / max(s["sop_count"], 1.0),
            "grad_norm": s["grad_norm"] / max(s["steps"], 1.0),
            "tokens_per_s": s["tokens"] / elapsed, "samples_per_s": s["samples"] / elapsed,
            "positions_per_s": s["positions"] / elapsed, "mlm_dropped": s["mlm_dropped"],
            "data_wait_s": s["data_wait_s"] / max(s["steps"], 1.0), "data_wait_share": s["data_wait_s"] / elapsed,
        }
        self.reset()
        return record


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: allocated accelerator memory on CUDA, else the peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure_peak_tflops(device: torch.device, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """Best achieved dense-matmul TFLOP/s on `device` in `dtype` (2 n^3 FLOPs per n x n matmul; the fastest of
    the matmuls run in `seconds`, so a busy machine does not lower it), a stand-in for the datasheet peak when
    none is configured; MFU against it reads as "fraction of the achievable matmul speed".

    Both `torch.matmul` and `F.linear` (x @ W^T, what `nn.Linear` runs) are timed, taking turns: on CPU they
    reach different kernels (measured on a 2-core AMD EPYC, fp32 n=512: 20 vs 45 GFLOP/s), and the peak must
    bound the layers' matmuls."""
    n = 512 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ops = (torch.matmul, torch.nn.functional.linear)
    for op in ops:  # warm-up
        op(a, b)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for op in ops:
            start = time.perf_counter()
            op(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best / 1e12


def measured_peak_tflops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """The achieved dense-matmul peak TFLOP/s on `device` for a run in `dtype` (`measure_peak_tflops`) and how
    it was measured.

    On CPU a low-precision run is measured in both `dtype` and fp32 and the faster is the peak: whether a
    bf16 matmul runs natively (AVX512-BF16, AMX) or through fp32 depends on the CPU and the kernel, and a
    bf16 peak from a slow kernel path made a bf16 run log mfu=7.70 (its layers ran faster than the measured
    "peak"). The faster of the two bounds what the model's matmuls can reach, so MFU stays in (0, 1].
    """
    if device.type == "cpu" and dtype != torch.float32:
        low, fp32 = measure_peak_tflops(device, dtype), measure_peak_tflops(device, torch.float32)
        name = str(dtype).removeprefix("torch.")
        return max(low, fp32), f"measured matmul, the faster of {name} ({low:.3g}) and float32 ({fp32:.3g}) on CPU"
    return measure_peak_tflops(device, dtype), f"measured {str(dtype).removeprefix('torch.')} matmul"


class Peaks(NamedTuple):
    """The two MFU denominators, TFLOP/s per device, each None when unknown, and where each came from."""
    datasheet: Optional[float]
    datasheet_source: str
    measured: Optional[float]
    measured_source: str


def resolve_peaks(configured: Optional[float], device: torch.device, dtype: torch.dtype) -> Peaks:
    """MFU's peaks for a run in `dtype` on `device`: the datasheet peak (`engine.peak_tflops_per_device`, else
    $ALBERT_DIST_PEAK_TFLOPS, else `albert_dist.engine.peaks.datasheet_peak` by the CUDA device's name) and the
    measured matmul peak (`measured_peak_tflops`). A CPU has no datasheet entry; there the measurement is
    skipped when a peak is given (the tests give one: it saves 0.3-0.6 s per trainer). Raises `ValueError`
    for a non-positive environment value."""
    datasheet, source = None, "no datasheet entry for this device"
    env = os.environ.get(PEAK_TFLOPS_ENV)
    if configured is not None:
        datasheet, source = float(configured), "engine.peak_tflops_per_device"
    elif env:
        try:
            datasheet = float(env)
        except ValueError:
            datasheet = -1.0
        if not datasheet > 0:
            raise ValueError(f"${PEAK_TFLOPS_ENV} must be a positive number of TFLOP/s, got {env!r}")
        source = f"${PEAK_TFLOPS_ENV}"
    elif device.type == "cuda":
        found = datasheet_peak(torch.cuda.get_device_name(device), dtype)
        if found is not None:
            datasheet, source = found
    if device.type == "cpu" and datasheet is not None:
        return Peaks(datasheet, source, None, "not measured (a peak is given)")
    return Peaks(datasheet, source, *measured_peak_tflops(device, dtype))


def shown_mfu(record: dict[str, float], device: torch.device) -> Optional[float]:
    """The MFU the console line prints (`albert_dist.job.console.train_line`) for a metrics record: against the
    datasheet peak (``perf/mfu``); on an accelerator without one, against its measured matmul peak
    (``perf/mfu_measured_peak``); on a CPU without one None, printed "mfu n/a". A matmul timed at start-up on a CPU
    that other work shares is no peak: the same 2-rank CPU job read 30-98% from one start to the next (issue 46);
    the record keeps ``perf/mfu_measured_peak`` for comparisons inside one run."""
    if names.PERF_MFU in record:
        return record[names.PERF_MFU]
    return None if device.type == "cpu" else record.get(names.PERF_MFU_MEASURED_PEAK)


def mfu(flops_per_position: float, positions_per_s: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: flops_per_position x positions/s (all ranks) / (world_size x peak x 1e12).

    `flops_per_position` is `albert_dist.model.flops.pretraining_flops_per_sequence` / S (what the model runs,
    forward + backward); positions are padded sequence positions, the compute actually run.
    """
    return flops_per_position * positions_per_s / (world_size * peak_tflops * 1e12)
