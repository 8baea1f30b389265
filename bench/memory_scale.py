"""Memory per rank at the ALBERT presets: model states as DeepSpeed allocated them, against DeepSpeed's own
estimators and ours (`albert_dist.engine.memory`), and activation memory with and without checkpointing.

**Model states** (one cell = preset x ZeRO stage x precision x ranks; 1, 2 and 4 gloo ranks on CPU): the
model, optimiser (AdamW) and DeepSpeed config are built as the trainer builds them, one optimiser step runs on
a (1, 16) micro-batch, and every tensor the engine holds is walked at five points (after `deepspeed.initialize`,
in the forward pass of the MLM head (ZeRO-3's gathered parameters are live there), at each gradient-bucket
reduction in the backward pass, at the entry of the client optimiser's `step` and after `engine.step`): the
module's parameters and their `.grad`/`ds_tensor`, everything reachable through the ZeRO optimiser's attributes
(fp32 partitions, flat buffers, gradient partitions, reduction buckets, ZeRO-3's persistent parameters) and the
client optimiser's state (Adam moments). Each storage is counted once (by its address) and filed, by the name
it was reached through, under parameters, gradients, optimizer (fp32 master partition + Adam moments) or
buffers (gradient-reduction buckets); a class's figure is its largest value over the five points. Meta
tensors take no memory and are skipped. Reported per rank: the largest rank's figure.

The comparisons:

* ``ratio_vs_deepspeed``: parameters + gradients + optimizer / DeepSpeed's estimate for the stage
  (`estimate_zero2_model_states_mem_needs` for ZeRO 1 and 2, DeepSpeed has no ZeRO-1 estimator;
  `estimate_zero3_model_states_mem_needs` for ZeRO-3; the numbers its `*_all_live(model)` prints, without
  offload). DeepSpeed assumes 16-bit parameters and gradients with fp32 master weights and Adam
  (``2 + 18/N`` bytes per parameter at ZeRO-2; ``4 x largest layer + 18/N`` at ZeRO-3): the bf16 cells are
  the like-with-like comparison (target [0.8, 1.25]); fp32 cells hold 4-byte parameters and gradients and no
  separate fp32 gradient copy, so their ratio is reported with the expected one (`ours`'s formula).
* ``ratio_vs_ours``: the same bytes / `albert_dist.engine.memory.model_state_bytes` (target [0.8, 1.25], every
  cell). Buffers are compared separately (``buffers_vs_ours``): DeepSpeed allocates a gradient-reduction bucket
  of ``reduce_bucket_size`` elements (default 5e8: 2 GB fp32) whatever the model size.
* ``zero3_ratio_4_over_1``: ZeRO-3 model states per rank at 4 ranks / at 1 rank (target <= 0.3).

**Activations** (one process, no DeepSpeed): bytes allocated by a forward pass and still held when it
returns (the tensors saved for backward; torch's profiler with ``profile_memory=True`` tracks CPU allocations)
and the peak of forward + backward above the state before forward (parameter gradients pre-allocated by a
warm-up pass, so the peak holds activations and their gradients only), at sequence 128 and 512, micro-batch 1,
with and without `model.gradient_checkpointing`. Measured at two depths (the preset's and 1 executed block) so
that per block = (A(L) - A(1)) / (L - 1) and the rest (embeddings, heads) = A(1) - per block; compared with
`albert_dist.engine.memory.activation_bytes` (target [0.8, 1.25]). Presets above albert-large are measured at
depths 2 and 1 (their per-block figure; the formula's prediction at the full depth is printed).

    python bench/memory_scale.py                 # the suite's size: albert-base, 1/2/4 ranks, all stages, both
                                                 # precisions; activations of albert-base (~2-3 min on 2 cores)
    python bench/memory_scale.py --full          # + albert-large and albert-xlarge, albert-xxlarge at ZeRO-3
    python bench/memory_scale.py --presets albert-large --stages 3 --worlds 1 4 --precisions bf16

`run(...)` returns the dict for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import queue as queue_mod
import re
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.memory_scale")

SEQ_STATES = 16  # sequence length of the model-state step: states do not depend on it
PRESETS_FULL = ("albert-base", "albert-large", "albert-xlarge")
#: xxlarge (223M parameters) only at ZeRO-3 in --full: ZeRO-1/2 hold full fp32 copies on every rank.
XXLARGE_CELLS = {"preset": "albert-xxlarge", "stages": (3,)}
CLASSES = ("params", "grads", "optimizer", "buffers", "gathered", "other")
RATIO_RANGE = (0.8, 1.25)


# ------------------------------------------------------------------------------------------- tensor walk
_BUCKET_BUFFER = re.compile(r"(ipg|bucket)[^.]*\.buffer(\[\d+\])?$|ipg_buffer(\[\d+\])?$")


def _classify(path: str) -> str:
    """The class of a tensor from the attribute path it was reached through."""
    p = path.lower()
    if p.startswith("inner.state"):
        return "optimizer"  # the client optimiser's state: Adam exp_avg / exp_avg_sq (and step scalars)
    if _BUCKET_BUFFER.search(p):
        return "buffers"  # a gradient-reduction bucket itself (its `params` lists are parameters)
    if "inflight_param_registry" in p or "param_coordinator" in p:
        return "gathered"  # ZeRO-3's all-gathers in flight (their flat output buffers) and the prefetch queue
    if p.endswith(".grad") or p.endswith(".grad_accum") or "grad" in p:
        return "grads"
    if "fp32" in p:
        return "optimizer"  # fp32 master partitions (single_partition_of_fp32_groups, fp32_partitioned_...)
    if "param" in p or "bit16" in p or "fp16" in p or "bf16" in p:
        return "params"
    return "other"


def _walk(obj: Any, path: str, out: list, seen: dict, depth: int = 0) -> None:
    """Append (path, tensor) for every tensor reachable from `obj` through lists, tuples, dicts and the
    attributes of DeepSpeed's own helper objects (buckets, the parameter-offload coordinator); nn.Modules,
    process groups and everything else are not entered."""
    if depth > 8 or obj is None:
        return
    if torch.is_tensor(obj):
        out.append((path, obj))
        for attr in ("grad", "grad_accum", "ds_tensor"):
            if attr == "grad" and not obj.is_leaf:
                continue  # only leaves carry .grad (reading it on a view warns)
            t = getattr(obj, attr, None)
            if torch.is_tensor(t):
                out.append((f"{path}.{attr}", t))
        return
    if id(obj) in seen:
        return
    seen[id(obj)] = obj  # holds the object: a freed temporary's id could be reused by the next one
    if isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k if isinstance(k, (str, int)) else type(k).__name__}]", out, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out, seen, depth + 1)
    elif (type(obj).__module__.startswith("deepspeed") and not isinstance(obj, torch.nn.Module)
          and hasattr(obj, "__dict__")):
        for k, v in vars(obj).items():
            _walk(v, f"{path}.{k}", out, seen, depth + 1)


#: When one storage is reached under several names, the class it is filed under (first in this order wins):
#: gradient views into a bucket are the bucket; a partition that is also a `.grad` is a gradient.
PRIORITY = ("optimizer", "buffers", "grads", "params", "gathered", "other")


def state_bytes(engine, listing: list | None = None) -> dict[str, int]:
    """Bytes per class (`CLASSES`) of every storage the engine holds now, each storage counted once.

    `listing`, when given, receives (class, bytes, [paths]) per storage (for debugging the classification).
    """
    zero_opt = engine.optimizer
    inner = getattr(zero_opt, "optimizer", zero_opt)
    found: list[tuple[str, torch.Tensor, str]] = []
    seen: dict = {}
    walked: list = []
    _walk(dict(inner.state), "inner.state", walked, seen)
    _walk({k: v for k, v in vars(zero_opt).items() if k != "optimizer"}, "opt", walked, seen)
    # A ZeRO-3 parameter's own storage is the whole tensor only while gathered (ZeRO-3's persistent ones
    # always are); its partition is `ds_tensor`.
    found += [(path, t, "gathered" if hasattr(t, "ds_tensor") and not getattr(t, "ds_persist", False)
               else _classify(path)) for path, t in walked]
    for name, p in engine.module.named_parameters():
        zero3 = hasattr(p, "ds_tensor")
        # ZeRO-3: p.data is the whole parameter only while gathered (persistent ones always are)
        found.append((f"module.{name}", p.data, "gathered" if zero3 and not getattr(p, "ds_persist", False)
                      else "params"))
        if p.grad is not None:
            found.append((f"module.{name}.grad", p.grad, "grads"))
        if zero3 and torch.is_tensor(p.ds_tensor):
            found.append((f"module.{name}.ds_tensor", p.ds_tensor, "params"))
    storages: dict = {}
    for path, t, cls in found:
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        entry = storages.setdefault((str(t.device), storage.data_ptr()), [storage.nbytes(), set(), []])
        entry[1].add(cls)
        entry[2].append(path)
    totals = dict.fromkeys(CLASSES, 0)
    for nbytes, classes, paths in storages.values():
        cls = next(c for c in PRIORITY if c in classes)
        totals[cls] += nbytes
        if listing is not None:
            listing.append((cls, nbytes, paths[:4]))
    return totals


class Snapshots:
    """Bytes per class at every snapshot taken (`take`)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.points: list[dict[str, int]] = []

    def take(self) -> None:
        listing: list = []
        self.points.append(state_bytes(self.engine, listing))
        if os.environ.get("MEMORY_SCALE_DEBUG") and os.environ.get("RANK", "0") == "0":
            print(f"snapshot {len(self.points)}: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in self.points[-1].items()))
            for cls, nbytes, paths in sorted(listing, key=lambda x: -x[1])[:12]:
                print(f"    {cls:9s} {nbytes / 2**20:9.1f} MiB  {paths[:3]}")

    def summary(self) -> dict[str, Any]:
        """Per class its largest value (`by_class`); the largest simultaneous parameters + gradients +
        optimizer (`states_peak_bytes`) and all classes (`total_peak_bytes`) over the snapshots."""
        return {"by_class": {c: max(p[c] for p in self.points) for c in CLASSES},
                "states_peak_bytes": max(p["params"] + p["grads"] + p["optimizer"] for p in self.points),
                "total_peak_bytes": max(sum(p.values()) for p in self.points), "snapshots": len(self.points)}

    def wrap(self, obj: Any, name: str) -> None:
        """Snapshot at the entry of `obj.name(...)` (instance attribute; missing methods are skipped)."""
        fn = getattr(obj, name, None)
        if fn is None:
            return

        def wrapped(*args, **kwargs):
            self.take()
            return fn(*args, **kwargs)

        setattr(obj, name, wrapped)


# ------------------------------------------------------------------------------------------- model states
def _cfg(preset: str, stage: int, precision: str, extra: Iterable[str] = ()):
    from albert_dist.config import load_config

    return load_config(None, [f"model.preset={preset}", f"engine.zero_stage={stage}", f"engine.precision={precision}",
                              "engine.train_micro_batch_size_per_gpu=1", "engine.gradient_accumulation_steps=1",
                              "optimizer.type=adamw", "max_steps=10", *extra])


def _batch(vocab: int, seq: int, batch: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """(B, S) int64 inputs with ~15 % MLM labels (at least one), (B,) SOP labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, 1] = ids[:, 1]
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                token_type_ids=(torch.arange(seq)[None, :] >= seq // 2).long().expand(batch, seq).contiguous(),
                mlm_labels=labels, sop_labels=torch.randint(0, 2, (batch,), generator=g))


def _deepspeed_estimates(model, world: int) -> dict[str, Any]:
    """DeepSpeed's estimates (bytes per GPU, no offload) for `world` GPUs on one node, and the table its
    `*_all_live(model)` functions print (same numbers: they call these functions with `model_to_params`)."""
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    total = stage_1_and_2.model_to_params(model)
    total3, largest = stage3.model_to_params(model)
    _, z2 = stage_1_and_2.estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=world, cpu_offload=False)
    _, z3, largest_mem = stage3.estimate_zero3_model_states_mem_needs(total3, largest, num_gpus_per_node=world,
                                                                      cpu_offload=False, cpu_offload_params=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=world)
        stage3.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=world)
    return {"total_params": total, "largest_layer_params": largest, "zero2_bytes": z2, "zero3_bytes": z3,
            "zero3_largest_layer_bytes": largest_mem, "printed": printed.getvalue()}


def _measure_cell(preset: str, stage: int, precision: str, world: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    import deepspeed

    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining

    cfg = _cfg(preset, stage, precision, extra)
    torch.manual_seed(0)
    model = AlbertForPreTraining(cfg.model)
    ds_est = _deepspeed_estimates(model, world)
    optimizer, after_initialize = build_optimizer(model, cfg.optimizer)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config=build_deepspeed_config(cfg.engine, world))
    after_initialize(engine)
    snaps = Snapshots(engine)
    snaps.take()  # after initialize
    # ZeRO-3 gathers the parameters a module uses around its forward; the MLM head runs last, with the shared
    # block and the tied embedding still gathered (reuse distance) - the forward's high-water mark.
    hook = engine.module.predictions.register_forward_pre_hook(lambda *_, take=snaps.take: take())
    for name in ("reduce_ipg_grads", "independent_gradient_partition_epilogue"):
        snaps.wrap(engine.optimizer, name)  # ZeRO-1/2 buckets live only inside the backward pass
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    snaps.wrap(inner, "step")
    batch = _batch(cfg.model.vocab_size, SEQ_STATES, seed=int(os.environ.get("RANK", "0")))
    # Two steps: torch's AdamW creates its moments inside the first step, so only the second one's
    # optimiser entry sees gradients and moments together (the states' high-water mark).
    t0 = time.perf_counter()
    for _ in range(2):
        engine.backward(engine(**batch).loss)
        engine.step()
        snaps.take()  # after the step
    step_s = (time.perf_counter() - t0) / 2
    hook.remove()
    summary = snaps.summary()
    engine.destroy()
    del engine, model, optimizer, inner, snaps
    _release_memory()
    return {**summary, "step_s": step_s, "deepspeed": ds_est}


def _release_memory() -> None:
    """Free what the last cell held and hand glibc's freed pages back to the OS (ranks run up to 18 cells in
    a row on a machine whose memory others share)."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _states_worker(rank: int, world: int, port: int, cells: list, extra: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    try:
        from deepspeed.utils import logger as ds_logger

        from albert_dist.distributed.group import init_distributed

        init_distributed(timeout_s=600)
        ds_logger.setLevel(logging.WARNING)
        torch.set_printoptions(threshold=4, edgeitems=1)  # ZeRO-3 formats every parameter's repr eagerly
        out = {}
        for preset, stage, precision in cells:
            out[f"{preset}|{stage}|{precision}"] = _measure_cell(preset, stage, precision, world, tuple(extra))
            torch.distributed.barrier()
        results.put(("ok", rank, out))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise


def _spawn(target: Callable, world: int, args: tuple, timeout_s: float) -> dict[int, Any]:
    """Run `target(rank, world, port, *args, queue)` on `world` spawned ranks; {rank: payload}."""
    from albert_dist.distributed.env import free_port

    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world:
            try:
                kind, rank, payload = results.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench/memory_scale.py: {world}-rank run did not finish in {timeout_s:.0f} s")
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("bench/memory_scale.py: a rank died (out of memory?)")
                continue
            if kind == "error":
                raise RuntimeError(f"bench/memory_scale.py: rank {rank} failed:\n{payload}")
            got[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return got


def measure_states(cells: list[tuple[str, int, str]], world: int, timeout_s: float,
                   extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Model-state bytes of `cells` [(preset, stage, precision)] on `world` ranks (each config with the dotted
    overrides `extra` too): per cell the per-rank maximum of every class, every rank's figures, DeepSpeed's
    estimates and our estimate."""

    per_rank = _spawn(_states_worker, world, (cells, tuple(extra)), timeout_s)
    out = {}
    for key in per_rank[0]:
        preset, stage, precision = key.split("|")
        cfg = _cfg(preset, int(stage), precision, extra)
        cells_by_rank = [per_rank[r][key] for r in sorted(per_rank)]
        worst = {c: max(x["by_class"][c] for x in cells_by_rank) for c in CLASSES}
        states = max(x["states_peak_bytes"] for x in cells_by_rank)
        ds = cells_by_rank[0]["deepspeed"]
        ds_bytes = ds["zero3_bytes"] if int(stage) == 3 else ds["zero2_bytes"]
        out[key] = {
            "preset": preset, "stage": int(stage), "precision": precision, "world_size": world,
            "parameters": ds["total_params"], "largest_layer_params": ds["largest_layer_params"],
            "per_rank_max": worst, "model_states_bytes": states,
            "total_peak_bytes": max(x["total_peak_bytes"] for x in cells_by_rank),
            "per_rank": [{k: x[k] for k in ("by_class", "states_peak_bytes", "total_peak_bytes")}
                         for x in cells_by_rank],
            "deepspeed_estimate_bytes": ds_bytes, "deepspeed_printed": ds["printed"],
            "ratio_vs_deepspeed": states / ds_bytes,
            "step_s": max(x["step_s"] for x in cells_by_rank), "overrides": list(extra),
        }
        _estimate_states(out[key], cfg)
    return out


def _estimate_states(cell: dict[str, Any], cfg) -> None:
    """Our estimate (albert_dist.engine.memory) of a measured model-state cell and the ratios against it,
    written into `cell`; `--merge` redoes it so merged runs are judged by the current estimator."""
    from albert_dist.engine import memory

    ours = memory.model_state_bytes(cfg.model, cfg.engine, cell["world_size"])
    worst = cell["per_rank_max"]
    cell["ours"] = ours.as_dict()
    cell["ratio_vs_ours"] = cell["model_states_bytes"] / ours.model_states_bytes
    cell["buffers_vs_ours"] = (worst["buffers"] / ours.buffers_bytes) if ours.buffers_bytes else None
    cell["gathered_vs_ours"] = (worst["gathered"] / ours.gathered_bytes) if ours.gathered_bytes else None


# ------------------------------------------------------------------------------------------- activations
def _allocated_timeline(fn: Callable[[], Any]) -> list[int]:
    """Run `fn` under torch's profiler with memory tracking; the running total of CPU bytes allocated
    during it, after every allocation/free (relative to its start)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        events = json.loads(Path(trace).read_text())["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                 key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
    total, out = 0, []
    for e in mem:  # the running sum of Bytes is "Total Allocated" since the profiler started
        total += e["args"]["Bytes"]
        out.append(total)
    return out


def _activation_pass(model, batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """Bytes held after forward (saved activations) and the peak of forward + backward, both relative to
    the state before the forward pass. Parameter gradients exist already (warm-up), so backward only
    accumulates into them."""
    holder: dict[str, Any] = {}

    def forward():
        holder["loss"] = model(**batch).loss

    fwd = _allocated_timeline(forward)
    retained = fwd[-1] if fwd else 0
    fwd_peak = max(fwd, default=0)

    def backward():
        holder.pop("loss").backward()

    bwd = _allocated_timeline(backward)
    bwd_peak = retained + max(bwd, default=0)
    return {"retained_bytes": retained, "peak_bytes": max(fwd_peak, bwd_peak), "forward_peak_bytes": fwd_peak}


def measure_activations(preset: str, variants: Iterable[tuple[int, bool, str, int]],
                        depths: tuple[int, int] | None = None) -> dict[str, Any]:
    """Activation bytes of `preset` on CPU per variant (sequence length, checkpointing, precision,
    micro-batch) at two depths, against `albert_dist.engine.memory.activation_bytes` at the measured depth
    (with the batch's own number of MLM predictions) and its prediction at the preset's depth."""
    from albert_dist.model import AlbertForPreTraining

    base = _cfg(preset, 0, "fp32")
    full_depth = base.model.num_hidden_layers * base.model.inner_group_num
    lo, hi = depths or (1, full_depth)
    out: dict[str, Any] = {"preset": preset, "depths": [lo, hi], "full_depth": full_depth, "cells": {}}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for seq, ckpt, precision, micro_batch in variants:
        flags = [f"model.gradient_checkpointing={str(ckpt).lower()}", f"data.max_seq_length={seq}"]
        figs = {}
        for depth in (lo, hi):
            cfg = _cfg(preset, 0, "fp32", [f"model.num_hidden_layers={depth}", "model.inner_group_num=1", *flags])
            torch.manual_seed(0)
            model = AlbertForPreTraining(cfg.model).to(dtypes[precision]).train()
            batch = _batch(cfg.model.vocab_size, seq, micro_batch)
            masked = (batch["mlm_labels"] != -100).sum().item() / micro_batch
            model(**batch).loss.backward()  # warm-up: parameter .grad allocated
            t0 = time.perf_counter()
            figs[depth] = _activation_pass(model, batch)
            figs[depth]["seconds"] = time.perf_counter() - t0
            del model
            gc.collect()
        cell: dict[str, Any] = {"seq": seq, "checkpointing": ckpt, "precision": precision, "micro_batch": micro_batch,
                                "masked_per_sequence": masked, "measured": {str(d): v for d, v in figs.items()}}
        for what in ("retained_bytes", "peak_bytes"):
            cell[f"{what}_per_block"] = (figs[hi][what] - figs[lo][what]) / (hi - lo)
        _estimate_activations(cell, preset, hi)
        key = f"S{seq}|{'ckpt' if ckpt else 'no_ckpt'}|{precision}|B{micro_batch}"
        out["cells"][key] = cell
    return out


def _estimate_activations(cell: dict[str, Any], preset: str, depth: int) -> None:
    """Our activation estimate of a measured cell at its measured `depth` and the preset's own depth, and
    the ratios, written into `cell` (redone by `--merge`)."""
    from albert_dist.engine import memory

    seq, precision, micro_batch, masked = cell["seq"], cell["precision"], cell["micro_batch"], cell["masked_per_sequence"]
    flags = [f"model.gradient_checkpointing={str(cell['checkpointing']).lower()}", f"data.max_seq_length={seq}"]
    at_depth = _cfg(preset, 0, "fp32", [f"model.num_hidden_layers={depth}", "model.inner_group_num=1", *flags]).model
    est_hi = memory.activation_bytes(at_depth, micro_batch, seq, precision, masked=round(masked))
    est_full = memory.activation_bytes(_cfg(preset, 0, "fp32", flags).model, micro_batch, seq, precision,
                                       masked=round(masked))
    measured = cell["measured"][str(depth)]
    cell["estimate_measured_depth"] = est_hi.as_dict()
    cell["estimate_full_depth"] = est_full.as_dict()
    cell["ratio_retained_vs_ours"] = measured["retained_bytes"] / est_hi.retained_bytes
    cell["ratio_peak_vs_ours"] = measured["peak_bytes"] / est_hi.peak_bytes


# ------------------------------------------------------------------------------------------- the run
def run(presets: tuple[str, ...] = ("albert-base",), stages: tuple[int, ...] = (1, 2, 3),
        worlds: tuple[int, ...] = (1, 2, 4), precisions: tuple[str, ...] = ("fp32", "bf16"),
        activation_presets: tuple[str, ...] = ("albert-base",), seqs: tuple[int, ...] = (128, 512),
        extra_cells: tuple[dict, ...] = (), activation_extra: tuple[tuple, ...] = (),
        overrides: tuple[str, ...] = (), timeout_s: float = 1800.0) -> dict[str, Any]:
    """Model-state cells for presets x stages x precisions on each world size (plus `extra_cells`: dicts
    with preset, stages), and activations of `activation_presets`. Returns the figures, the checks against
    the targets (`checks`) and a flat `summary` of ratios for the suite. Raises RuntimeError when a rank
    fails or a world size's run exceeds `timeout_s`."""
    t0 = time.monotonic()
    cells = [(p, s, q) for p in presets for s in stages for q in precisions]
    for extra in extra_cells:
        cells += [(extra["preset"], s, q) for s in extra["stages"] for q in extra.get("precisions", precisions)]
    states: dict[str, Any] = {}
    for world in worlds:
        log.info("model states on %d rank(s): %d cells", world, len(cells))
        for key, v in measure_states(cells, world, timeout_s, tuple(overrides)).items():
            states[f"{key}|{world}"] = v
    acts = {}
    for preset in activation_presets:
        big = preset in ("albert-xlarge", "albert-xxlarge")
        variants = [(seq, ckpt, "fp32", 1) for seq in seqs for ckpt in (False, True)]
        variants += [tuple(v[1:]) for v in activation_extra if v[0] == preset]
        log.info("activations of %s: %d variants", preset, len(variants))
        acts[preset] = measure_activations(preset, variants, depths=(1, 2) if big else None)
    out: dict[str, Any] = {"states": states, "activations": acts, "seconds": time.monotonic() - t0}
    out["checks"] = _checks(states, acts)
    out["headline"] = out["checks"]["headline"]
    return out


def _checks(states: dict[str, Any], acts: dict[str, Any]) -> dict[str, Any]:
    """Every ratio against its target, per cell, and the headline figures (min/max over the cells)."""
    lo, hi = RATIO_RANGE
    vs_ours = {k: v["ratio_vs_ours"] for k, v in states.items()}
    like = {k: v["ratio_vs_deepspeed"] for k, v in states.items() if v["precision"] == "bf16" and v["stage"] in (2, 3)}
    zero3 = {}
    for k, v in states.items():
        if v["stage"] == 3 and v["world_size"] == 4:
            one = states.get(k.rsplit("|", 1)[0] + "|1")
            if one:
                zero3[k.rsplit("|", 1)[0]] = v["model_states_bytes"] / one["model_states_bytes"]
    act = {f"{p}|{c}|{w}": cell[f"ratio_{w}_vs_ours"] for p, a in acts.items() for c, cell in a["cells"].items()
           for w in ("retained", "peak")}
    out: dict[str, Any] = {
        "ratio_vs_ours": vs_ours, "ratio_vs_ours_ok": all(lo <= r <= hi for r in vs_ours.values()),
        "ratio_vs_deepspeed_bf16": like, "ratio_vs_deepspeed_bf16_ok": all(lo <= r <= hi for r in like.values()),
        "zero3_ratio_4_over_1": zero3, "zero3_ratio_ok": all(r <= 0.3 for r in zero3.values()),
        "activations_vs_ours": act, "activations_ok": all(lo <= r <= hi for r in act.values()),
    }
    headline = {}
    for name, values in (("states_vs_ours", vs_ours), ("states_vs_deepspeed_bf16", like), ("activations_vs_ours", act)):
        if values:
            headline[f"{name}_min"], headline[f"{name}_max"] = min(values.values()), max(values.values())
    if zero3:
        headline["zero3_states_4_over_1_ranks_max"] = max(zero3.values())
    out["headline"] = headline
    return out


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one (later runs' cells replace earlier ones of the same key), our estimates
    and the checks redone with the current code (the measurements are kept as they are)."""
    states: dict[str, Any] = {}
    acts: dict[str, Any] = {}
    for r in results:
        states.update(r["states"])
        for preset, a in r["activations"].items():
            acts.setdefault(preset, {**a, "cells": {}})["cells"].update(a["cells"])
    for v in states.values():
        _estimate_states(v, _cfg(v["preset"], v["stage"], v["precision"], tuple(v.get("overrides", ()))))
    for preset, a in acts.items():
        for cell in a["cells"].values():
            _estimate_activations(cell, preset, a["depths"][1])
    out: dict[str, Any] = {"states": states, "activations": acts, "seconds": sum(r["seconds"] for r in results)}
    out["checks"] = _checks(states, acts)
    out["headline"] = out["checks"]["headline"]
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _state_order(key: str) -> tuple:
    preset, stage, precision, world = key.split("|")
    return PRESET_ORDER.get(preset, 9), int(stage), precision, int(world)


PRESET_ORDER = {"albert-tiny": 0, "albert-base": 1, "albert-large": 2, "albert-xlarge": 3, "albert-xxlarge": 4}


def report(res: dict[str, Any]) -> str:
    """The figures as Markdown tables (what docs/scale-memory.md quotes)."""
    lines = ["| preset | ZeRO | precision | ranks | parameters | gradients | optimizer | model states (peak) | "
             "DeepSpeed's estimate | measured / DeepSpeed | ours | measured / ours | buckets | ZeRO-3 gathered |",
             "|" + "---|" * 14]
    for k in sorted(res["states"], key=_state_order):
        v = res["states"][k]
        m = v["per_rank_max"]
        lines.append(f"| {v['preset']} | {v['stage']} | {v['precision']} | {v['world_size']} | {_gib(m['params'])} | "
                     f"{_gib(m['grads'])} | {_gib(m['optimizer'])} | {_gib(v['model_states_bytes'])} | "
                     f"{_gib(v['deepspeed_estimate_bytes'])} | {v['ratio_vs_deepspeed']:.2f} | "
                     f"{_gib(v['ours']['model_states_bytes'])} | {v['ratio_vs_ours']:.2f} | {_gib(m['buffers'])} | "
                     f"{_gib(m['gathered']) if m['gathered'] else '—'} |")
    lines += ["", "| preset (measured depth) | sequence | checkpointing | precision | micro-batch | saved after "
              "forward | peak forward+backward | per block (saved) | ours (saved / peak) | measured / ours (saved, "
              "peak) | ours at the preset's depth (peak) |", "|" + "---|" * 11]
    for preset, a in sorted(res["activations"].items(), key=lambda kv: PRESET_ORDER.get(kv[0], 9)):
        for cell in a["cells"].values():
            m = cell["measured"][str(a["depths"][1])]
            est = cell["estimate_measured_depth"]
            lines.append(f"| {preset} ({a['depths'][1]}) | {cell['seq']} | {'yes' if cell['checkpointing'] else 'no'} | "
                         f"{cell['precision']} | {cell['micro_batch']} | {_gib(m['retained_bytes'])} | "
                         f"{_gib(m['peak_bytes'])} | {_gib(cell['retained_bytes_per_block'])} | "
                         f"{_gib(est['retained_bytes'])} / {_gib(est['peak_bytes'])} | "
                         f"{cell['ratio_retained_vs_ours']:.2f}, {cell['ratio_peak_vs_ours']:.2f} | "
                         f"{_gib(cell['estimate_full_depth']['peak_bytes'])} |")
    c = res["checks"]
    lines += ["", f"targets: measured / ours in [{RATIO_RANGE[0]}, {RATIO_RANGE[1]}]: {c['ratio_vs_ours_ok']}; "
              f"bf16 ZeRO-2/3 measured / DeepSpeed: {c['ratio_vs_deepspeed_bf16_ok']}; ZeRO-3 4 ranks / 1 rank <= 0.3: "
              f"{c['zero3_ratio_ok']} ({', '.join(f'{k} {v:.3f}' for k, v in c['zero3_ratio_4_over_1'].items())}); "
              f"activations measured / ours: {c['activations_ok']}"]
    return "\n".join(lines)


#: --full: the presets' model-state cells (all stages, fp32 and bf16, 1/2/4 ranks), albert-xxlarge at ZeRO-3,
#: activations of every preset and for albert-base also bf16 and micro-batch 4.
FULL_ACTIVATION_EXTRA = (("albert-base", 512, False, "bf16", 1), ("albert-base", 512, True, "bf16", 1),
                         ("albert-base", 128, False, "fp32", 4), ("albert-base", 512, True, "fp32", 4))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="albert-base, -large, -xlarge (+ xxlarge at ZeRO-3)")
    p.add_argument("--presets", nargs="+")
    p.add_argument("--stages", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--worlds", nargs="*", type=int, default=[1, 2, 4])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--activation-presets", nargs="*")
    p.add_argument("--seqs", nargs="+", type=int, default=[128, 512])
    p.add_argument("--no-xxlarge", action="store_true", help="with --full: leave albert-xxlarge out")
    p.add_argument("--overrides", nargs="*", default=[], metavar="key=value",
                   help="dotted overrides for every model-state cell, e.g. "
                        "engine.zero_optimization.reduce_bucket_size=50000000 (ours is computed with them too)")
    p.add_argument("--json", help="write the result dict to this file")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="measure nothing: merge the results of earlier runs (cells run one at a time when memory is "
                        "short), recompute the checks, print the tables")
    a = p.parse_args(argv)
    if a.merge:
        res = merge([json.loads(Path(f).read_text()) for f in a.merge])
        print(report(res))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    presets = a.presets or (list(PRESETS_FULL) if a.full else ["albert-base"])
    acts = a.activation_presets if a.activation_presets is not None else (
        presets + (["albert-xxlarge"] if a.full and not a.no_xxlarge else []))
    extra = (XXLARGE_CELLS,) if a.full and not a.no_xxlarge else ()
    res = run(presets=tuple(presets), stages=tuple(a.stages), worlds=tuple(a.worlds), precisions=tuple(a.precisions),
              activation_presets=tuple(acts), seqs=tuple(a.seqs), extra_cells=extra,
              activation_extra=FULL_ACTIVATION_EXTRA if a.full else (), overrides=tuple(a.overrides))
    print(report(res))
    print(f"{res['seconds']:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
