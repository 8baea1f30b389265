"""Runner of the gradient-correctness matrix: one spawned gloo process group runs every cell in turn.

A cell is (sharing, ZeRO stage, gradient accumulation steps, activation checkpointing, precision). In each cell
every rank builds the same `AlbertForPreTraining`, the project's optimiser (`albert_dist.engine.optim`) and the
project's DeepSpeed config (`albert_dist.engine.deepspeed_config.build_deepspeed_config`), runs the GA
micro-steps of one optimiser step the way DeepSpeed wants them (forward, `engine.backward`, `engine.step` after
every micro-step; the update happens at the boundary), reads

* the full gradient of every parameter after the last micro-step's backward and before its `engine.step`
  (`deepspeed.utils.safe_get_full_grad`: `param.grad` at ZeRO-0, the all-reduced fp32 partitions at ZeRO-1/2,
  the all-gathered fp32 partition at ZeRO-3) - the value DeepSpeed will clip and apply, i.e. the mean over the
  GA x world micro-batches of each micro-batch's loss gradient (DeepSpeed divides the loss by GA and averages
  over ranks);
* the parameters after the step (gathered with `GatheredParameters` under ZeRO-3; at ZeRO >= 1 also the fp32
  master copy through `safe_get_full_fp32_param`);

and compares them with two single-process references computed from the same initial weights on the same global
batch (GA x world micro-batches):

(a) gradients: `albert_dist.model.unroll.unroll` turns the model into an unshared one computing the same
    function; the reference gradient of a shared parameter is the sum of its copies' gradients of
    mean_m loss_m (m over the micro-batches);
(b) parameters: a plain PyTorch loop on the shared model (autograd, `clip_grad_norm_`, the same optimiser).

Errors are scale-free: ``max |x - ref| / max |ref|`` per tensor (with a floor, see `scaled_errors`), the worst
tensor reported. Results travel
back to the test process through a queue, one message per (rank, cell), so a crash names its cell.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import queue as queue_mod
import time
import traceback
from contextlib import ExitStack
from typing import Any
from unittest import mock

import torch

from albert_dist.distributed.env import free_port
from albert_dist.distributed.local_ranks import local_rank_env

WORLD_SIZE = 2
MICRO_BATCH = 2
SEQ_LEN = 12
SEED = 1234
#: Tiny widths; 7 layers / 3 groups / 2 inner blocks -> group sizes 3, 2, 2 and 14 executed blocks.
MODEL_OVERRIDES = [
    "model.vocab_size=61", "model.embedding_size=8", "model.hidden_size=16", "model.num_hidden_layers=7",
    "model.num_hidden_groups=3", "model.inner_group_num=2", "model.num_attention_heads=2",
    "model.intermediate_size=24", "model.max_position_embeddings=16", "model.hidden_dropout_prob=0.0",
    "model.attention_probs_dropout_prob=0.0",
]
#: eps=1: Adam's first update is lr * g / (|g| + eps) (bias-corrected moments equal g and g^2), which for
#: |g| << 1 is ~ lr * g. With the usual eps=1e-6 it would be ~ lr * sign(g) and the parameter check could not
#: see a wrongly scaled gradient. Clipping at 0.5 (below the measured initial gradient norm, asserted by the
#: test) so the global-norm computation over partitioned, shared parameters is exercised too.
OPTIM_OVERRIDES = ["optimizer.type=adamw", "optimizer.lr=1.0", "optimizer.eps=1.0", "optimizer.weight_decay=0.01",
                   "optimizer.warmup_steps=0", "engine.gradient_clipping=0.5", "max_steps=1"]

#: Slots per row of the static MLM gather in the cells that use it: more than any row of `global_batch` holds.
STATIC_SLOTS = 9
SHARINGS = ("all", "attention", "ffn", "none")
STAGES = (0, 1, 2, 3)
GAS = (1, 3)
CHECKPOINTING = (False, True)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One matrix cell; `control="reentrant"` swaps the model's checkpointing to the reentrant variant."""

    sharing: str
    zero_stage: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    precision: str = "fp32"
    control: str = ""
    world_size: int = WORLD_SIZE
    offload: bool = False
    """CPU offload of the optimiser (ZeRO >= 1) and, at ZeRO-3, of the parameters."""
    steps: int = 1
    """Optimiser steps; the parameters are compared after each (gradients after the first)."""
    optimizer: str = "adamw"
    """`optimizer.type`: "adamw" or "lamb" (`albert_dist.engine.lamb`)."""
    compile: str = ""
    """`engine.compile_scope` of a compiled cell ("block" or "model"); "" = eager."""
    static_head: bool = False
    """The model's static MLM gather (`max_predictions_per_seq` = the longest row of the cell's batches), as the
    trainer builds it; compiled cells need it."""

    @property
    def id(self) -> str:
        ckpt = "ckpt" if self.gradient_checkpointing else "nockpt"
        base = f"{self.precision}-{self.sharing}-zero{self.zero_stage}-ga{self.gradient_accumulation_steps}-{ckpt}"
        if self.world_size != WORLD_SIZE:
            base += f"-w{self.world_size}"
        if self.offload:
            base += f"-offload-{self.steps}steps"
        if self.optimizer != "adamw":
            base += f"-{self.optimizer}"
        if self.compile:
            base += f"-compiled-{self.compile}"
        elif self.static_head:
            base += "-static"
        if self.steps != 1 and not self.offload:
            base += f"-{self.steps}steps"
        return f"{base}-{self.control}" if self.control else base


def fp32_cells() -> list[Cell]:
    """The 64 fp32 cells: sharing x ZeRO stage x gradient accumulation x activation checkpointing."""
    return [Cell(s, z, ga, ck) for s in SHARINGS for z in STAGES for ga in GAS for ck in CHECKPOINTING]


def bf16_cells() -> list[Cell]:
    """The 64 bf16 cells; ZeRO-0 accumulates in bf16 (`engine.grad_accum_dtype=bf16`: DeepSpeed keeps fp32
    accumulation inside its ZeRO optimisers), ZeRO 1-3 in fp32."""
    return [Cell(s, z, ga, ck, "bf16") for s in SHARINGS for z in STAGES for ga in GAS for ck in CHECKPOINTING]


def wide_cells(world_size: int = 4) -> list[Cell]:
    """The `world_size`-rank subset: sharing "all" x ZeRO 0-3 x GA 3, no checkpointing, fp32 and bf16."""
    return [Cell("all", z, 3, False, p, world_size=world_size) for p in ("fp32", "bf16") for z in STAGES]


def offload_cells() -> list[Cell]:
    """CPU offload, fp32, sharing "all": ZeRO-2 x GA 1/4 and ZeRO-3 (optimiser + parameters) x GA 3 with AdamW,
    ZeRO-2 x GA 4 and ZeRO-3 x GA 3 with LAMB, each checked after steps 1 and 2 (a public DeepSpeed offload bug
    hit only the first step)."""
    adamw = [Cell("all", 2, ga, False, offload=True, steps=2) for ga in (1, 4)] + \
        [Cell("all", 3, 3, False, offload=True, steps=2)]
    lamb = [Cell("all", 2, 4, False, offload=True, steps=2, optimizer="lamb"),
            Cell("all", 3, 3, False, offload=True, steps=2, optimizer="lamb")]
    return adamw + lamb


def compile_cells(scope: str, sharings=("all", "none"), stages=STAGES, gas=GAS) -> list[Cell]:
    """fp32 cells compiled with `engine.compile_scope=scope`, two steps (the second under
    ``error_on_recompile``), each preceded by its eager twin (same cell, static head, not compiled), whose
    gradients and parameters the compiled cell is also compared with."""
    cells = []
    for s in sharings:
        for z in stages:
            for ga in gas:
                cells.append(Cell(s, z, ga, False, steps=2, static_head=True))
                cells.append(Cell(s, z, ga, False, steps=2, static_head=True, compile=scope))
    return cells


def warm_compile_caches(cells: list[Cell], timeout_s: float = 1200.0) -> None:
    """Compile the ZeRO 0-2 graphs the compiled `cells` will need (the plain model of each (scope, sharing), the
    same config, static slots, batch shapes and thread count), so that the spawned ranks load them from
    inductor's on-disk caches instead of both compiling them on the same two cores. One spawned process per
    (scope, sharing), all at once: a compile is mostly one busy core, so two run in the time of one. ZeRO-3's
    graphs (cut by DeepSpeed's hooks) cannot be made without DeepSpeed and are compiled by the ranks.

    Raises:
        RuntimeError: a compile failed or took more than `timeout_s` (its traceback is on stderr).
    """
    ctx = torch.multiprocessing.get_context("spawn")
    families = sorted({(c.compile, c.sharing) for c in cells if c.compile and c.zero_stage < 3})
    procs = [ctx.Process(target=_compile_family, args=family, daemon=True) for family in families]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    failed = [(family, p.exitcode) for family, p in zip(families, procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.terminate()
    if failed:
        raise RuntimeError(f"warming the compile caches failed (scope, sharing; exit code): {failed}")


def _compile_family(scope: str, sharing: str) -> None:
    """In a spawned process: compile the plain model of (`scope`, `sharing`) and run one step through it."""
    from albert_dist.engine.compile import compile_model
    from albert_dist.model import AlbertForPreTraining

    torch.set_num_threads(1)
    cfg = train_config(Cell(sharing, 0, 1, False)).model
    model = AlbertForPreTraining(cfg, max_predictions_per_seq=STATIC_SLOTS)
    compile_model(model, scope)
    model(**global_batch(cfg, 1, seed=SEED)[0]).loss.backward()


def control_cells() -> list[Cell]:
    """Cells that must fail: reentrant activation checkpointing under ZeRO-2 (DeepSpeed's hook sees a shared
    parameter's gradient once per checkpointed segment)."""
    return [Cell("all", 2, 1, True, control="reentrant")]


def train_config(cell: Cell):
    """The project's `TrainConfig` for `cell`, through the strict loader (as a recipe + overrides would be)."""
    from albert_dist.config import load_config

    overrides = MODEL_OVERRIDES + OPTIM_OVERRIDES + [f"optimizer.type={cell.optimizer}"] + [
        f"model.sharing={cell.sharing}",
        f"model.gradient_checkpointing={str(cell.gradient_checkpointing).lower()}",
        f"engine.zero_stage={cell.zero_stage}",
        f"engine.train_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"engine.gradient_accumulation_steps={cell.gradient_accumulation_steps}",
        f"engine.precision={cell.precision}",
        f"engine.grad_accum_dtype={'bf16' if cell.precision == 'bf16' and cell.zero_stage == 0 else 'fp32'}",
        # DeepSpeed leaves parameters below 1e5 elements unpartitioned under ZeRO-3; 0 partitions every one.
        "engine.zero_optimization.stage3_param_persistence_threshold=0",
        f"engine.offload_optimizer.device={'cpu' if cell.offload else 'none'}",
        f"engine.offload_param.device={'cpu' if cell.offload and cell.zero_stage == 3 else 'none'}",
        f"seed={SEED}",
    ]
    if cell.compile:
        overrides += ["engine.compile=true", f"engine.compile_scope={cell.compile}"]
    return load_config(None, overrides)


def global_batch(model_cfg, n_micro: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """`n_micro` micro-batches of MICRO_BATCH x SEQ_LEN random pretraining inputs (the loader's dict format).

    Padding at the end of some rows, ~30 % of real positions labelled for MLM (so micro-batches have different
    label counts and the per-micro-batch mean matters), one SOP label ignored (-100).
    """
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_micro):
        ids = torch.randint(0, model_cfg.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=g)
        lengths = torch.randint(SEQ_LEN // 2, SEQ_LEN + 1, (MICRO_BATCH,), generator=g)
        mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
        types = (torch.arange(SEQ_LEN)[None, :] >= (lengths[:, None] // 2)).long() * mask
        labelled = (torch.rand(MICRO_BATCH, SEQ_LEN, generator=g) < 0.3) & mask.bool()
        labelled[:, 1] = True  # at least one MLM label per row
        mlm = torch.where(labelled, torch.randint(0, model_cfg.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=g),
                          torch.full((MICRO_BATCH, SEQ_LEN), -100))
        sop = torch.randint(0, 2, (MICRO_BATCH,), generator=g)
        sop[0] = -100 if len(batches) % 2 else sop[0]
        batches.append({"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types,
                        "mlm_labels": mlm, "sop_labels": sop})
    return batches


def initial_state(model_cfg) -> dict[str, torch.Tensor]:
    """Initial weights for `model_cfg` (seeded, identical on every rank and in the references)."""
    from albert_dist.model import AlbertForPreTraining

    torch.manual_seed(SEED)
    model = AlbertForPreTraining(model_cfg)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(cfg, batches, precision: str = "fp32", world_size: int = WORLD_SIZE,
              second_batches: list | None = None) -> dict[str, Any]:
    """Single-process references for a cell's config: (a) unrolled gradients, (b) one plain optimiser step.

    With ``second_batches`` (fp32 only) the plain loop takes a second step on them: ``params`` are then the
    parameters after step 2 and ``step1_params`` those after step 1.

    Returns ``grads`` (sum over copies), ``first_copy_grads``  (only the first copy: a deliberately wrong
    reference for the control), ``n_copies``, ``init`` and ``params`` (after the step), ``grad_norm``.

    With ``precision="bf16"`` the references mirror DeepSpeed's bf16 arithmetic instead of fp32 (otherwise
    the bf16 rounding of 14 blocks of forward and backward, ~1.5 % here, would be what the comparison
    measures), starting from the bf16-rounded initial weights as DeepSpeed does: (a) the unrolled model in
    bf16, each micro-batch's gradient (of loss / number of micro-batches) accumulated in fp32 and the copies
    summed in fp32; (b) the fp32 master weights stepped (clipping, AdamW) with those gradients. Also
    ``plain_grads`` / ``plain_params``: plain PyTorch bf16 on the *shared* model with DeepSpeed's scaling
    (loss / GA per micro-batch, fp32 sums over micro-batches and the `world_size` ranks), i.e. the same
    arithmetic DeepSpeed does with fp32 accumulation, where autograd sums a shared parameter's copies in bf16.
    """
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.unroll import unroll

    model_cfg = dataclasses.replace(cfg.model, gradient_checkpointing=False)
    init = initial_state(cfg.model)

    # (a) the unrolled, unshared model: loss = mean over micro-batches of each micro-batch's mean loss.
    shared = AlbertForPreTraining(model_cfg)
    shared.load_state_dict(init)
    unrolled, copies = unroll(shared)
    unrolled_params = dict(unrolled.named_parameters())
    if precision == "bf16":
        unrolled.to(torch.bfloat16)
        acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in unrolled_params.items()}
        for b in batches:
            unrolled.zero_grad()
            (unrolled(**b).loss / len(batches)).backward()
            for n, p in unrolled_params.items():
                acc[n] += p.grad.float()
        copy_grads = acc
    else:
        loss = torch.stack([unrolled(**b).loss for b in batches]).mean()
        loss.backward()
        copy_grads = {n: p.grad for n, p in unrolled_params.items()}
    grads = {name: torch.stack([copy_grads[c] for c in names]).sum(0) for name, names in copies.items()}
    first_copy = {name: copy_grads[names[0]].clone() for name, names in copies.items()}
    extra: dict[str, Any] = {}
    if precision == "bf16":
        # Plain PyTorch bf16 on the *shared* model: autograd sums a shared parameter's copies in bf16 inside
        # each backward, as it must under DeepSpeed too; the micro-batches are accumulated in fp32.
        plain = AlbertForPreTraining(model_cfg)
        plain.load_state_dict(init)
        plain.to(torch.bfloat16)
        plain_params = dict(plain.named_parameters())
        # DeepSpeed's scaling: each micro-batch's loss / GA backward in bf16, fp32 sums, mean over the ranks
        # (a power of two: exact).
        pacc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in plain_params.items()}
        for b in batches:
            plain.zero_grad()
            (plain(**b).loss / (len(batches) // world_size)).backward()
            for n, p in plain_params.items():
                pacc[n] += p.grad.float()
        extra["plain_grads"] = {n: g / world_size for n, g in pacc.items()}

    # (b) the shared model trained one step by plain PyTorch on the same global batch.
    # bf16: DeepSpeed casts the module to bf16 before it makes the fp32 master copy, so bf16 training starts
    # from the bf16-rounded initial weights; so do the bf16 references, and their updates count from there.
    start = {k: (v.bfloat16().float() if precision == "bf16" and v.is_floating_point() else v)
             for k, v in init.items()}
    model = AlbertForPreTraining(model_cfg)
    model.load_state_dict(start)
    optimizer = build_optimizer(model, cfg.optimizer).optimizer
    if precision == "bf16":
        for name, p in model.named_parameters():
            p.grad = grads[name].clone()
    else:
        loss = torch.stack([model(**b).loss for b in batches]).mean()
        loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.engine.gradient_clipping))
    optimizer.step()
    named = dict(model.named_parameters())
    if second_batches is not None:  # a second plain step (fp32), on the next global batch
        extra["step1_params"] = {name: p.detach().clone() for name, p in named.items()}
        optimizer.zero_grad()
        torch.stack([model(**b).loss for b in second_batches]).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.engine.gradient_clipping)
        optimizer.step()
    if precision == "bf16":  # the fp32 master weights stepped with the plain bf16 gradients
        pmodel = AlbertForPreTraining(model_cfg)
        pmodel.load_state_dict(start)
        poptimizer = build_optimizer(pmodel, cfg.optimizer).optimizer
        for name, p in pmodel.named_parameters():
            p.grad = extra["plain_grads"][name].clone()
        torch.nn.utils.clip_grad_norm_(pmodel.parameters(), cfg.engine.gradient_clipping)
        poptimizer.step()
        extra["plain_params"] = {name: p.detach().clone() for name, p in pmodel.named_parameters()}
    return {
        "grads": grads,
        "first_copy_grads": first_copy,
        "n_copies": {name: len(names) for name, names in copies.items()},
        "state": init,
        "init": {name: start[name].clone() for name in named},
        "params": {name: p.detach().clone() for name, p in named.items()},
        "grad_norm": grad_norm,
        "grad_norm_f64": float(torch.stack([g.double().norm() for g in grads.values()]).norm()),
        **extra,
    }


def scaled_errors(xs: dict[str, torch.Tensor], refs: dict[str, torch.Tensor],
                  floor_fraction: float = 1e-3, norm: float = float("inf")) -> dict[str, float]:
    """Per tensor ``|x - ref| / max(|ref|, floor)``, floor = `floor_fraction` x the largest |ref| of all tensors.

    ``|.|`` is the max norm (default) or the L2 norm (``norm=2``).

    Scale-free per tensor, except that a tensor whose reference is a thousand times smaller than the largest
    one is measured against that floor: the attention key bias, for instance, has a gradient that is zero in
    exact arithmetic (softmax is invariant to adding the same q.b_k to every score of a query), so its
    computed value is rounding noise, and noise compared with noise says nothing.
    """
    refs64 = {n: refs[n].detach().double() for n in xs}
    floor = floor_fraction * max(torch.linalg.vector_norm(r, norm).item() for r in refs64.values())
    out = {}
    for n, x in xs.items():
        ref = refs64[n]
        diff = torch.linalg.vector_norm(x.detach().double().reshape(ref.shape) - ref, norm).item()
        denom = max(torch.linalg.vector_norm(ref, norm).item(), floor)
        out[n] = diff / denom if denom > 0 else (0.0 if diff == 0 else float("inf"))
    return out


def global_l2_error(xs: dict[str, torch.Tensor], refs: dict[str, torch.Tensor]) -> float:
    """||x - ref|| / ||ref|| over all tensors concatenated (L2)."""
    diff = sum(torch.sum((xs[n].detach().double().reshape(refs[n].shape) - refs[n].double()) ** 2) for n in xs)
    total = sum(torch.sum(refs[n].double() ** 2) for n in xs)
    return float((diff / total).sqrt()) if total > 0 else 0.0


def bf16_figures(ref: dict, ref32: dict, grads: dict[str, torch.Tensor],
                 update: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A bf16 cell's errors against fp32 arithmetic, and the same errors of the ideal bf16 computations.

    ``fp32_*``: DeepSpeed's gradients and master-weight update against the fp32 reference; ``ideal_fp32_*``:
    the bf16 reference (unrolled bf16, exact fp32 accumulation) against the same fp32 reference - what bf16
    arithmetic costs by itself; ``floor_*``: plain-PyTorch bf16 on the shared model against the bf16
    reference - the difference two correct bf16 computations of the same step have (the shared copies are
    summed in bf16 by autograd, in another order than the unrolled reference's fp32 sum).
    """
    names = list(grads)
    upd32 = {n: ref32["params"][n] - ref32["init"][n] for n in names}
    upd16 = {n: ref["params"][n] - ref["init"][n] for n in names}
    plain_upd = {n: ref["plain_params"][n] - ref["init"][n] for n in names}
    return {
        "fp32_grad_error": _worst(scaled_errors(grads, ref32["grads"])),
        "fp32_grad_global_l2_error": (global_l2_error(grads, ref32["grads"]), "all parameters"),
        "fp32_update_global_l2_error": (global_l2_error(update, upd32), "all parameters"),
        "ideal_fp32_grad_error": _worst(scaled_errors({n: ref["grads"][n] for n in names}, ref32["grads"])),
        "ideal_fp32_grad_global_l2_error": (global_l2_error({n: ref["grads"][n] for n in names}, ref32["grads"]),
                                            "all parameters"),
        "ideal_fp32_update_global_l2_error": (global_l2_error(upd16, upd32), "all parameters"),
        "floor_grad_error": _worst(scaled_errors({n: ref["plain_grads"][n] for n in names}, ref["grads"])),
        "floor_master_param_error": _worst(scaled_errors({n: ref["plain_params"][n] for n in names},
                                                         ref["params"])),
        "floor_update_global_l2_error": (global_l2_error(plain_upd, upd16), "all parameters"),
        "plain_grad_error": _worst(scaled_errors(grads, ref["plain_grads"])),
        "plain_master_param_error": _worst(scaled_errors({n: ref["init"][n] + update[n] for n in names},
                                                         ref["plain_params"])),
        "plain_update_error": _worst(scaled_errors(update, plain_upd)),
        "plain_update_global_l2_error": (global_l2_error(update, plain_upd), "all parameters"),
    }


def _worst(errors: dict[str, float]) -> tuple[float, str]:
    name = max(errors, key=errors.get)
    return errors[name], name


def _reentrant_checkpoint(function, *args, use_reentrant=None, **kwargs):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(function, *args, use_reentrant=True, **kwargs)


def run_cell(cell: Cell, rank: int, world_size: int, ref_cache: dict) -> dict[str, Any]:
    """Run one optimiser step of `cell` on this rank and compare it with the single-process references."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

    from albert_dist.engine.compile import compile_engine, dynamo_counters
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.grad_norm import install_exact_clipping
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model import albert as albert_module

    if cell.world_size != world_size:
        raise ValueError(f"cell {cell.id} needs {cell.world_size} ranks, this process group has {world_size}")
    t_setup = time.perf_counter()
    cfg = train_config(cell)
    ga = cell.gradient_accumulation_steps
    batches = global_batch(cfg.model, ga * world_size, seed=SEED + ga)
    second_batches = global_batch(cfg.model, ga * world_size, seed=SEED + ga + 1000) if cell.steps == 2 else None
    key = (cell.sharing, ga, cell.precision, world_size, cell.steps, cell.optimizer)
    ref_s = 0.0
    if key not in ref_cache:  # the reference depends on neither the stage nor checkpointing
        ref_s = time.perf_counter()
        ref_cache[key] = reference(cfg, batches, cell.precision, world_size, second_batches)
        ref_s = time.perf_counter() - ref_s
    ref = ref_cache[key]
    ref32 = None
    if cell.precision == "bf16":  # the fp32 reference too: bf16 is also judged against fp32 arithmetic
        key32 = (cell.sharing, ga, "fp32", world_size, cell.steps, cell.optimizer)
        if key32 not in ref_cache:
            t_ref = time.perf_counter()
            ref_cache[key32] = reference(cfg, batches, "fp32", world_size)
            ref_s += time.perf_counter() - t_ref
        ref32 = ref_cache[key32]

    ds_config = build_deepspeed_config(cfg.engine, world_size)
    # The trainer's static gather has data.prediction_slots slots; here STATIC_SLOTS for every cell (one shape,
    # so the compiled graphs serve every cell), checked to hold the longest row.
    if cell.static_head:
        longest = max(int((b["mlm_labels"] != -100).sum(1).max()) for b in batches + (second_batches or []))
        if longest > STATIC_SLOTS:
            raise ValueError(f"a row of cell {cell.id} has {longest} labels, more than STATIC_SLOTS={STATIC_SLOTS}")
    model = AlbertForPreTraining(cfg.model, max_predictions_per_seq=STATIC_SLOTS if cell.static_head else None)
    model.load_state_dict(ref["state"])
    optimizer, after_initialize = build_optimizer(model, cfg.optimizer)
    t0 = time.perf_counter()
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    after_initialize(engine)
    install_exact_clipping(engine)  # as the trainer does (ZeRO-0 fp32 only)
    if cfg.engine.compile:
        # Compiled once per process and reused: dynamo guards on structure, not on the module instance, so the
        # block graphs serve every later cell of any sharing mode (the model scope's, every cell of one sharing
        # mode). A guard failure past the recompile limit would fall back to eager silently: here it raises.
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        # Each family of cells (scope; ZeRO-3 or not: its hooks break the graphs at every submodule) starts from
        # an empty dynamo cache, so the graphs a family compiles are counted on their own.
        family = (cfg.engine.compile_scope, cell.zero_stage == 3)
        if ref_cache.get("compile_family") != family:
            torch._dynamo.reset()
            ref_cache["compile_family"] = family
        compile_engine(engine, cfg.engine.compile_scope)
        result_dynamo_before = dynamo_counters()
    # Count DeepSpeed's backward prologue (ZeRO bookkeeping, BF16_Optimizer clearing its bf16 gradients): it
    # runs only from hooks DeepSpeed puts on the output tensors it can find, i.e. only if it can walk our
    # output type. The hook closure looks the method up on the engine at call time, so an instance attribute
    # sees every call.
    prologue_calls = [0]
    real_prologue = engine._backward_prologue

    def counting_prologue():
        prologue_calls[0] += 1
        return real_prologue()

    engine._backward_prologue = counting_prologue
    named = dict(engine.module.named_parameters())
    result: dict[str, Any] = {"ds_config": ds_config, "grad_norm_ref": ref["grad_norm"]}
    if cell.zero_stage == 3:
        # Evidence that partitioning is exercised: each rank holds about half of every parameter.
        result["unpartitioned"] = sorted(n for n, p in named.items() if p.ds_tensor.numel() >= p.ds_numel)
    def snapshot() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The module's parameters (gathered under ZeRO-3) and, where DeepSpeed keeps them, the fp32 masters."""
        if cell.zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(named.values())):
                module = {n: p.detach().float().clone() for n, p in named.items()}
        else:
            module = {n: p.detach().float().clone() for n, p in named.items()}
        if cell.zero_stage >= 1:
            masters = {n: safe_get_full_fp32_param(p).detach().float().clone() for n, p in named.items()}
        elif cell.precision == "bf16":  # ZeRO-0 bf16: DeepSpeed's FP16_UnfusedOptimizer has fp32 copies per group
            fp32_of = {id(lp): hp for lps, hps in zip(engine.optimizer.fp16_groups, engine.optimizer.fp32_groups)
                       for lp, hp in zip(lps, hps)}
            masters = {n: fp32_of[id(p)].detach().clone() for n, p in named.items()}
        else:
            masters = {}
        return module, masters

    grads: dict[str, torch.Tensor] = {}
    after: list[tuple[dict, dict]] = []  # (module, master) parameters after each step
    with ExitStack() as stack:
        if cell.control == "reentrant":
            stack.enter_context(mock.patch.object(albert_module, "checkpoint", _reentrant_checkpoint))
        dynamo_after: list[dict[str, int]] = []
        step_s: list[float] = []
        for step, step_batches in enumerate([batches, second_batches][:cell.steps]):
            if step == 1 and cfg.engine.compile:  # anything compiled after the first step is an error
                stack.enter_context(torch._dynamo.config.patch(error_on_recompile=True))
            t_step = time.perf_counter()
            for micro in range(ga):
                out = engine(**step_batches[micro * world_size + rank])
                engine.backward(out.loss)
                if step == 0 and micro == ga - 1:  # grads exist between the boundary backward and the step
                    grads = {n: safe_get_full_grad(p).detach().float().clone() for n, p in named.items()}
                engine.step()
            step_s.append(time.perf_counter() - t_step)
            if step == 0:  # the norm DeepSpeed clipped with (ZeRO-0 fp32: albert_dist.engine.grad_norm's)
                norm = engine.get_global_grad_norm()
                result["reported_grad_norm"] = None if norm is None else float(norm)
            dynamo_after.append(dynamo_counters())
            after.append(snapshot())
    module_params, master = after[0]
    result["prologue_calls"] = prologue_calls[0]
    result["grad_norm_f64"] = ref["grad_norm_f64"]
    result["step_s"] = step_s
    if cfg.engine.compile:  # process-wide counts at the cell's start, after step 1, after step 2
        result["dynamo"] = [result_dynamo_before] + dynamo_after
        result["compiled"] = (engine.module.albert.encoder.run_block is not albert_module._run_block
                              if cfg.engine.compile_scope == "block"
                              else getattr(engine.module, "_compiled_call_impl", None) is not None)
    engine.destroy()
    result["seconds"] = time.perf_counter() - t_setup
    if cell.static_head and not cell.compile:  # an eager twin: kept for the compiled cell that follows it
        ref_cache[("eager", cell.sharing, cell.zero_stage, ga)] = {"grads": grads, "after": after}
    twin = ref_cache.get(("eager", cell.sharing, cell.zero_stage, ga)) if cell.compile else None
    if twin is not None:
        result["eager_grad_error"] = _worst(scaled_errors(grads, twin["grads"]))
        for i, ((mod, mas), (tmod, tmas)) in enumerate(zip(after, twin["after"])):
            prefix = "eager_" if i == 0 else f"eager_step{i + 1}_"
            result[f"{prefix}param_error"] = _worst(scaled_errors(mod, tmod))
            if mas:
                result[f"{prefix}master_param_error"] = _worst(scaled_errors(mas, tmas))

    result["grad_error"] = _worst(scaled_errors(grads, ref["grads"]))
    shared_names = [n for n in named if ref["n_copies"][n] > 1]
    if shared_names:  # control: a reference that forgets to sum over the reuses must disagree
        wrong = scaled_errors({n: grads[n] for n in shared_names}, ref["first_copy_grads"])
        result["first_copy_grad_error"] = _worst(wrong)
    ref_step1 = ref.get("step1_params", ref["params"])
    ref_update = {n: ref_step1[n] - ref["init"][n] for n in named}
    # The parameters the module computes with (bf16 copies in bf16 cells) and, at ZeRO >= 1, the fp32
    # master weights; updates (after - before) too, since an update is ~1e-3 of a weight.
    for prefix, values in (("", module_params), ("master_", master)):
        if values:
            result[f"{prefix}param_error"] = _worst(scaled_errors(values, ref_step1))
            result[f"{prefix}update_error"] = _worst(
                scaled_errors({n: values[n] - ref["init"][n] for n in named}, ref_update))
    if cell.steps == 2:  # step 2 from step 1's reference parameters
        ref_update2 = {n: ref["params"][n] - ref_step1[n] for n in named}
        for prefix, values in zip(("step2_", "step2_master_"), after[1]):
            if values:
                result[f"{prefix}param_error"] = _worst(scaled_errors(values, ref["params"]))
                result[f"{prefix}update_error"] = _worst(
                    scaled_errors({n: values[n] - ref_step1[n] for n in named}, ref_update2))
    # Norm-wise view (bf16): per-tensor relative L2 error (same floor rule) and the whole-model relative L2 error.
    result["grad_l2_error"] = _worst(scaled_errors(grads, ref["grads"], norm=2))
    result["grad_global_l2_error"] = (global_l2_error(grads, ref["grads"]), "all parameters")
    upd = master or module_params
    upd = {n: upd[n] - ref["init"][n] for n in named}
    result["update_l2_error"] = _worst(scaled_errors(upd, ref_update, norm=2))
    result["update_global_l2_error"] = (global_l2_error(upd, ref_update), "all parameters")
    if ref32 is not None:
        result.update(bf16_figures(ref, ref32, grads, upd))
    result["timing"] = {"reference_s": ref_s, "setup_s": t0 - t_setup, "engine_s": time.perf_counter() - t0}
    return result


def worker(rank: int, world_size: int, port: int, cells: list[Cell], results: "queue_mod.Queue") -> None:
    """Entry point of one spawned rank: start the process group, run every cell, post one message per cell."""
    os.environ.update(local_rank_env(rank, world_size, port))
    torch.set_num_threads(1)
    try:
        from albert_dist.distributed.group import init_distributed

        init_distributed(timeout_s=120)
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
        # ZeRO-3's optimiser logs its constructor's locals() through an eagerly formatted f-string, i.e. the
        # repr of every parameter, and defragments with a full gc.collect(): with small print thresholds and
        # the start-up objects frozen out of the collector, building an engine per cell stays cheap.
        torch.set_printoptions(threshold=4, edgeitems=1)
        gc.collect()
        gc.freeze()
        ref_cache: dict = {}
        for cell in cells:
            try:
                results.put(("cell", rank, cell.id, run_cell(cell, rank, world_size, ref_cache)))
            except Exception as err:  # reported per cell; the control cells expect one
                results.put(("cell", rank, cell.id, {"error": f"{type(err).__name__}: {err}",
                                                     "traceback": traceback.format_exc()}))
            # The same after every cell: its garbage collected once, what lives on frozen, so that DeepSpeed's
            # own full collections of the next cell (BF16_Optimizer's memory reports, ~6 per bf16 ZeRO-1 cell;
            # ZeRO-3's defragment) walk that cell's objects only, not every earlier cell's (they grew to ~4x the
            # cost of a bf16 ZeRO-2 cell by the end of the matrix).
            gc.collect()
            gc.freeze()
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()
    except BaseException:
        results.put(("fatal", rank, None, traceback.format_exc()))
        raise
    results.put(("done", rank, None, None))


def run_matrix(cells: list[Cell], world_size: int = WORLD_SIZE, timeout_s: float = 600.0) -> dict[str, dict]:
    """Spawn `world_size` ranks once, run `cells` in order and return ``{cell.id: merged result}``.

    A merged result holds each rank's result under ``ranks`` and, when no rank failed, the worst of the
    ranks' errors at the top level; a failed rank's exception text is under ``error``. Raises
    `RuntimeError` when a rank dies or the whole run exceeds `timeout_s` (the ranks are then terminated).
    """
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world_size, port, cells, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    per_rank: dict[str, dict[int, dict]] = {c.id: {} for c in cells}
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"gradient matrix did not finish within {timeout_s:.0f} s; "
                                   f"finished cells: {[c for c, r in per_rank.items() if len(r) == world_size]}")
            try:
                kind, rank, cell_id, payload = results.get(timeout=min(remaining, 5.0))
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a rank exited with code {dead[0]} before finishing the matrix")
                continue
            if kind == "cell":
                per_rank[cell_id][rank] = payload
            elif kind == "fatal":
                raise RuntimeError(f"rank {rank} failed outside a cell:\n{payload}")
            else:
                done.add(rank)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return {cell_id: merge_ranks(by_rank) for cell_id, by_rank in per_rank.items()}


def merge_ranks(by_rank: dict[int, dict]) -> dict[str, Any]:
    """Combine the ranks' results of one cell: the worst error of each kind, any rank's exception."""
    merged: dict[str, Any] = {"ranks": by_rank}
    errors = [r["error"] for r in by_rank.values() if "error" in r]
    if errors:
        merged["error"] = errors[0]
        return merged
    for key, value in by_rank[min(by_rank)].items():
        if key.endswith("_error"):
            merged[key] = max((r[key] for r in by_rank.values()), key=lambda t: t[0])
        else:
            merged[key] = value
    merged["seconds"] = max(r["seconds"] for r in by_rank.values())
    return merged
