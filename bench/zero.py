"""DeepSpeed ZeRO on a fully shared 12-layer ALBERT, 2 gloo ranks on CPU: communication, memory, step time.

The model, optimiser and DeepSpeed config are built exactly as the trainer builds them
(`albert_dist.config.load_config` + `albert_dist.engine.deepspeed_config.build_deepspeed_config`,
`albert_dist.engine.optim.build_optimizer`, `albert_dist.model.AlbertForPreTraining`): 12 layers, 1 group,
1 inner block, `sharing="all"`, so one block's parameters run 12 times per forward pass. One step = forward +
`engine.backward` + `engine.step` on one micro-batch (gradient accumulation 1) of random pretraining inputs.

Figures (min / median / max over repeats where there are repeats):

* ``ratio_allgather_over_param_bytes``: bytes all-gathered by one ZeRO-3 step / bytes of the unique parameters
  (target <= 2.0: every parameter gathered once for forward and once for backward; gathering per reuse would
  give 2 x 12 = 24 for the shared block). Measured by wrapping torch.distributed's ``all_gather_into_tensor``,
  ``_all_gather_base`` and ``all_gather`` (both in ``torch.distributed`` and ``distributed_c10d``) before
  DeepSpeed binds them, counting the gathered (output) bytes while a step runs. Steady-state steps only: the
  first step of a ZeRO-3 engine records the module trace and releases every parameter after each use
  (``first_step_ratio_allgather``), whatever the settings. ``stage3_param_persistence_threshold`` is 0 so that
  every parameter is partitioned (DeepSpeed's default 1e5 keeps the small ones resident and gathers nothing
  for them); ``variants`` repeats the measurement for other ZeRO-3 settings (see `VARIANTS`).
* ``ratio_optim_state_zero1`` / ``ratio_optim_state_zero2``: optimiser-state bytes per rank (AdamW moments plus
  the fp32 master partition) with 2 ranks / with 1 rank (target <= 0.55; 0.5 plus padding is ideal).
* ``ratio_step_zero{1,2,3}_over_zero0``: wall seconds per step of ZeRO 1/2/3 over ZeRO 0 (slower rank,
  barrier to barrier), the four engines stepping in rotating order inside each repeat so that drift of a
  shared machine hits all of them.

    python bench/zero.py [--repeats 5] [--hidden 128] [--seq 64] [--micro-batch 2]

`run(repeats=...)` returns the dict for the suite runner (bench/run_all.py).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import ExitStack
from typing import Any, Callable
from unittest import mock

import torch
from _common import spawn_local_ranks, stats, synthetic_batch

WORLD = 2
VOCAB = 2000
#: ZeRO-3 settings compared for the all-gather volume: name -> extra `engine.zero_optimization.*` overrides.
#: "project_default" is what the project's config generates (DeepSpeed's defaults: max_reuse_distance and
#: max_live_parameters 1e9 elements, prefetch bucket 5e7) with every parameter partitioned.
VARIANTS: dict[str, list[str]] = {
    "project_default": [],
    # No reuse look-ahead: a parameter may be released right after each use ...
    "max_reuse_distance_0": ["engine.zero_optimization.stage3_max_reuse_distance=0"],
    # ... but the prefetcher (bucket 5e7 elements > this model) has already fetched it for its later uses,
    # and DeepSpeed does not release a parameter prefetched for a later step; so switch prefetching off too.
    "max_reuse_distance_0_no_prefetch": ["engine.zero_optimization.stage3_max_reuse_distance=0",
                                         "engine.zero_optimization.stage3_prefetch_bucket_size=0"],
}


def _overrides(hidden: int, micro_batch: int, stage: int, extra: list[str]) -> list[str]:
    """The recipe of this benchmark as dotted overrides of the project's config."""
    return [
        # Vocabulary 2000, E 64: the shared block holds about half of the unique parameters, as in ALBERT-base
        # (7.1 M of 11.7 M), so the all-gather ratio is not dominated by the embedding tables.
        f"model.vocab_size={VOCAB}", "model.embedding_size=64", f"model.hidden_size={hidden}",
        "model.num_hidden_layers=12", "model.num_hidden_groups=1", "model.inner_group_num=1", "model.sharing=all",
        f"model.num_attention_heads={max(1, hidden // 64)}", f"model.intermediate_size={4 * hidden}",
        "model.max_position_embeddings=512", "optimizer.type=adamw", "optimizer.lr=1e-4", "max_steps=1000",
        f"engine.zero_stage={stage}", f"engine.train_micro_batch_size_per_gpu={micro_batch}",
        "engine.gradient_accumulation_steps=1",
        "engine.zero_optimization.stage3_param_persistence_threshold=0", *extra,
    ]


class AllGatherCounter:
    """Counts the output bytes of torch.distributed all-gathers while `enabled` is True.

    `patches()` returns `mock.patch.object` context managers for ``all_gather_into_tensor``,
    ``_all_gather_base`` and ``all_gather`` in ``torch.distributed`` and ``torch.distributed.distributed_c10d``;
    they must be entered before ``deepspeed.init_distributed``, which binds ``all_gather_into_tensor`` once.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.bytes = 0
        self.calls = 0

    def _count(self, fn: Callable, kind: str) -> Callable:
        def wrapper(*args, **kwargs):
            if self.enabled:
                if kind == "list":  # all_gather(tensor_list, tensor, ...)
                    out = kwargs.get("tensor_list", args[0] if args else None)
                    self.bytes += sum(t.numel() * t.element_size() for t in out)
                else:  # all_gather_into_tensor / _all_gather_base(output_tensor, input_tensor, ...)
                    out = kwargs.get("output_tensor", args[0] if args else None)
                    self.bytes += out.numel() * out.element_size()
                self.calls += 1
            return fn(*args, **kwargs)

        return wrapper

    def patches(self) -> list:
        import torch.distributed as tdist
        import torch.distributed.distributed_c10d as c10d

        out = []
        for module in (tdist, c10d):
            for name, kind in (("all_gather_into_tensor", "flat"), ("_all_gather_base", "flat"),
                               ("all_gather", "list")):
                if hasattr(module, name):
                    out.append(mock.patch.object(module, name, self._count(getattr(module, name), kind)))
        return out

    def take(self) -> tuple[int, int]:
        """(bytes, calls) since the last take."""
        result = (self.bytes, self.calls)
        self.bytes, self.calls = 0, 0
        return result


def _optim_state_bytes(engine) -> dict[str, int]:
    """Bytes this rank holds for the optimiser: the client optimiser's state tensors (AdamW exp_avg,
    exp_avg_sq) and ZeRO-1/2's fp32 master partition (`single_partition_of_fp32_groups`)."""
    inner = engine.optimizer.optimizer
    moments = sum(t.numel() * t.element_size() for state in inner.state.values() for t in state.values()
                  if torch.is_tensor(t) and t.dim() > 0)
    master = sum(t.numel() * t.element_size() for t in getattr(engine.optimizer, "single_partition_of_fp32_groups", []))
    return {"moments": moments, "master": master, "total": moments + master}


def _worker(rank: int, world: int, args: dict, out: str) -> None:
    counter = AllGatherCounter()
    with ExitStack() as stack:
        for patch in counter.patches():
            stack.enter_context(patch)
        result = _measure(rank, world, args, counter)
    if rank == 0:
        torch.save(result, out)


def _measure(rank: int, world: int, args: dict, counter: AllGatherCounter) -> dict[str, Any]:
    import logging

    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import logger as ds_logger

    from albert_dist.config import load_config
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.distributed.group import init_distributed
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.sharing import block_parameter_counts

    init_distributed(timeout_s=300)
    ds_logger.setLevel(logging.WARNING)
    # DeepSpeed's ZeRO-3 optimiser formats its constructor's locals (every parameter's repr) eagerly.
    torch.set_printoptions(threshold=4, edgeitems=1)

    def build(stage: int, extra: list[str]):
        cfg = load_config(None, _overrides(args["hidden"], args["micro_batch"], stage, extra))
        torch.manual_seed(0)
        model = AlbertForPreTraining(cfg.model)
        unique_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        engine, *_ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, cfg.optimizer).optimizer,
                                          config=build_deepspeed_config(cfg.engine, world))
        return engine, unique_bytes, cfg

    batch = synthetic_batch(VOCAB, args["micro_batch"], args["seq"], predictions=max(1, round(0.15 * args["seq"])),
                            seed=rank)

    def step(engine) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        engine.backward(engine(**batch).loss)
        engine.step()
        dist.barrier()
        wall = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        return wall.item()

    out: dict[str, Any] = {}
    if world == 1:  # only the optimiser-state reference
        for stage in (1, 2):
            engine, _, _ = build(stage, [])
            step(engine)
            out[f"optim_state_zero{stage}"] = _optim_state_bytes(engine)
            engine.destroy()
        return out

    # Step time of ZeRO 0-3, engines alive together and stepped in rotating order.
    engines = {}
    for stage in (0, 1, 2, 3):
        engines[stage], unique_bytes, cfg = build(stage, [])
    out["unique_param_bytes"] = unique_bytes
    attn, ffn = block_parameter_counts(cfg.model)
    block_numel = attn + ffn
    out["block_numel"] = block_numel
    for stage, engine in engines.items():  # warm-up; ZeRO-3's first step records its trace
        counter.enabled = stage == 3
        step(engine)
        counter.enabled = False
        if stage == 3:
            out["first_step_allgather_bytes"], out["first_step_allgather_calls"] = counter.take()
    for stage in (1, 2):
        out[f"optim_state_zero{stage}"] = _optim_state_bytes(engines[stage])
    times: dict[int, list[float]] = {s: [] for s in engines}
    gathered: list[int] = []
    calls: list[int] = []
    for r in range(args["repeats"]):
        order = [(r + i) % 4 for i in range(4)]
        for stage in order:
            counter.enabled = stage == 3
            times[stage].append(step(engines[stage]))
            counter.enabled = False
            if stage == 3:
                b, c = counter.take()
                gathered.append(b)
                calls.append(c)
    out["step_s"] = {f"zero{s}": v for s, v in times.items()}
    out["allgather_bytes_per_step"] = gathered
    out["allgather_calls_per_step"] = calls
    for engine in engines.values():
        engine.destroy()
    engines.clear()

    # Other ZeRO-3 settings: all-gather bytes of the first step and of two steady-state steps.
    variants = {}
    for name, extra in VARIANTS.items():
        if name == "project_default":
            continue
        engine, _, _ = build(3, extra)
        per_step = []
        for _ in range(3):
            counter.enabled = True
            step(engine)
            counter.enabled = False
            per_step.append(counter.take())
        engine.destroy()
        variants[name] = {"first_step_bytes": per_step[0][0], "steady_bytes": [b for b, _ in per_step[1:]],
                          "steady_calls": [c for _, c in per_step[1:]]}
    out["variants"] = variants
    dist.barrier()
    return out


def _spawn(world: int, args: dict, timeout_s: float) -> dict[str, Any]:
    """Run `_worker` on `world` ranks; returns rank 0's measurements. Raises RuntimeError on a failure/timeout."""
    with tempfile.TemporaryDirectory(prefix="bench-zero-") as tmp:
        out = os.path.join(tmp, "rank0.pt")
        try:
            spawn_local_ranks(_worker, world, world, args, out, timeout_s=timeout_s)
        except Exception as exc:  # a rank's traceback, or the timeout
            raise RuntimeError(f"bench/zero.py: {world}-rank run failed: {exc}") from exc
        return torch.load(out, weights_only=False)


def run(repeats: int = 5, hidden: int = 128, seq: int = 64, micro_batch: int = 2,
        timeout_s: float = 600.0) -> dict[str, Any]:
    """Measure the figures of the module docstring; returns per-repeat lists, ratios and their summaries.

    Keys: ``ratio_allgather_over_param_bytes`` (per repeat), ``first_step_ratio_allgather``,
    ``variants.<name>.ratio_allgather_over_param_bytes``, ``ratio_optim_state_zero1`` / ``_zero2``,
    ``ratio_step_zero{1,2,3}_over_zero0`` (per repeat), ``step_s.zero{0..3}`` (per repeat), the raw byte
    counts, the sizes used and ``summary`` ({key: min / median / max / n}). Raises `ValueError` for
    repeats, hidden, seq or micro_batch < 1 and `RuntimeError` if a rank fails or the run exceeds `timeout_s`.
    """
    for name, value in (("repeats", repeats), ("hidden", hidden), ("seq", seq), ("micro_batch", micro_batch)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    args = {"repeats": repeats, "hidden": hidden, "seq": seq, "micro_batch": micro_batch}
    t0 = time.monotonic()
    one = _spawn(1, args, timeout_s)  # only byte counts: its timing does not matter
    two = _spawn(WORLD, args, max(30.0, timeout_s - (time.monotonic() - t0)))
    unique = two["unique_param_bytes"]
    out: dict[str, Any] = {
        "sizes": {**args, "world_size": WORLD, "num_hidden_layers": 12, "sharing": "all",
                  "unique_param_bytes": unique, "block_numel": two["block_numel"]},
        "ratio_allgather_over_param_bytes": [b / unique for b in two["allgather_bytes_per_step"]],
        "allgather_bytes_per_step": two["allgather_bytes_per_step"],
        "allgather_calls_per_step": two["allgather_calls_per_step"],
        "first_step_ratio_allgather": two["first_step_allgather_bytes"] / unique,
        "variants": {
            name: {"first_step_ratio_allgather": v["first_step_bytes"] / unique,
                   "ratio_allgather_over_param_bytes": [b / unique for b in v["steady_bytes"]],
                   "allgather_calls_per_step": v["steady_calls"]}
            for name, v in two["variants"].items()},
        "optim_state_bytes": {f"zero{s}": {"world_2": two[f"optim_state_zero{s}"], "world_1": one[f"optim_state_zero{s}"]}
                              for s in (1, 2)},
        "step_s": two["step_s"],
    }
    for s in (1, 2):
        out[f"ratio_optim_state_zero{s}"] = (two[f"optim_state_zero{s}"]["total"] / one[f"optim_state_zero{s}"]["total"])
    for s in (1, 2, 3):
        out[f"ratio_step_zero{s}_over_zero0"] = [a / b for a, b in zip(two["step_s"][f"zero{s}"], two["step_s"]["zero0"])]
    out["summary"] = {k: stats(out[k]) for k in ("ratio_allgather_over_param_bytes", "ratio_step_zero1_over_zero0",
                                                 "ratio_step_zero2_over_zero0", "ratio_step_zero3_over_zero0")}
    out["seconds"] = time.monotonic() - t0
    return out


def _fmt(s: dict[str, float]) -> str:
    return f"min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--json", help="also write the result dict to this file")
    a = parser.parse_args(argv)
    res = run(repeats=a.repeats, hidden=a.hidden, seq=a.seq, micro_batch=a.micro_batch)
    print(f"fully shared 12-layer ALBERT (hidden {a.hidden}), {WORLD} ranks, unique parameters "
          f"{res['sizes']['unique_param_bytes'] / 2**20:.2f} MiB")
    print(f"ZeRO-3 all-gather bytes per step / unique parameter bytes: "
          f"{_fmt(res['summary']['ratio_allgather_over_param_bytes'])}   (target <= 2.0; per reuse: 24)")
    print(f"  first step (trace recording): {res['first_step_ratio_allgather']:.2f}")
    for name, v in res["variants"].items():
        print(f"  {name}: steady {', '.join(f'{x:.2f}' for x in v['ratio_allgather_over_param_bytes'])}, "
              f"first step {v['first_step_ratio_allgather']:.2f}")
    for s in (1, 2):
        o = res["optim_state_bytes"][f"zero{s}"]
        print(f"ZeRO-{s} optimiser-state bytes per rank, 2 ranks / 1 rank: {res[f'ratio_optim_state_zero{s}']:.3f} "
              f"({o['world_2']['total']} / {o['world_1']['total']})   (target <= 0.55)")
    for s in (1, 2, 3):
        print(f"step time ZeRO-{s} / ZeRO-0: {_fmt(res['summary'][f'ratio_step_zero{s}_over_zero0'])}")
    print(f"step time ZeRO-0: {_fmt(stats(res['step_s']['zero0']))} s   ({res['seconds']:.0f} s in all)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
