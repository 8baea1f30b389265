"""Optimiser and learning-rate schedule for ALBERT pretraining.

* Parameter groups: weight decay on every weight matrix / embedding table, none on LayerNorm weights and on
  biases (BERT/ALBERT reference implementations, `AdamWeightDecayOptimizer(exclude_from_weight_decay=
  ["LayerNorm", "layer_norm", "bias"])`; Lan et al. 2020 section 4.1 trains with LAMB and the same exclusions).
* Optimiser: `torch.optim.AdamW` (Loshchilov & Hutter 2019, decoupled weight decay) handed to DeepSpeed as a
  client optimiser, which works on CPU and GPU at every ZeRO stage; or LAMB (You et al. 2019) from
  `albert_dist.engine.lamb` (param groups and construction here), which stays exact under ZeRO partitioning.
* Schedule: linear warmup from 0 to `lr` over `warmup_steps` (or `warmup_ratio` x max_steps), then linear or polynomial decay to 0 at
  `total_steps` (ALBERT: 3,125 warmup steps, polynomial decay with power 1 over 125k steps).

The schedule is a `torch.optim.lr_scheduler.LambdaLR` given to `deepspeed.initialize`, so DeepSpeed steps it
once per optimiser step (at the gradient-accumulation boundary) and saves it in its checkpoints.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from albert_dist.engine.config import OPTIMIZERS, OptimConfig
from albert_dist.engine.lamb import Lamb, attach_zero_partition_map

logger = logging.getLogger(__name__)


def is_no_decay(module: nn.Module, param_name: str) -> bool:
    """True for parameters that get no weight decay: every parameter of a LayerNorm and every bias.

    Decided from the owning module's type (not from name substrings) so that a renamed LayerNorm is still
    excluded; `param_name` is the parameter's local name inside `module` (e.g. "weight", "bias").
    """
    return isinstance(module, nn.LayerNorm) or param_name == "bias"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split `model`'s trainable parameters into a decay group and a no-decay group.

    Returns `[{"params", "weight_decay", "names", "no_decay": False}, {..., "no_decay": True}]`, each parameter
    exactly once: a parameter reused by several layers (ALBERT's shared groups) or tied (the MLM decoder and
    the word embeddings) appears once, classified by its first owner. Empty groups are dropped. The "names"
    and "no_decay" keys are extra information for logging and for LAMB's layer-adaptation exclusion (You et
    al. 2019 exclude the same parameters from the trust ratio); torch optimisers ignore unknown keys.
    """
    seen: set[int] = set()
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for module_name, module in model.named_modules():
        for local_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{local_name}" if module_name else local_name
            (no_decay if is_no_decay(module, local_name) else decay).append((full_name, param))
    groups = [
        {"params": [p for _, p in decay], "names": [n for n, _ in decay], "weight_decay": weight_decay,
         "no_decay": False},
        {"params": [p for _, p in no_decay], "names": [n for n, _ in no_decay], "weight_decay": 0.0,
         "no_decay": True},
    ]
    return [g for g in groups if g["params"]]


class BuiltOptimizer(NamedTuple):
    """What `build_optimizer` returns: the client optimiser and the hook to call on the engine built with it."""

    optimizer: torch.optim.Optimizer
    """The optimiser to pass to `deepspeed.initialize(optimizer=...)`."""
    after_initialize: Callable[[Any], None]
    """Call with the `DeepSpeedEngine` after `deepspeed.initialize`, before the first step (LAMB: teaches it
    DeepSpeed's flat partitions; AdamW: nothing)."""


def undo_state_creation_step(engine: Any) -> None:
    """`after_initialize` of AdamW: take back the step DeepSpeed's FP16_UnfusedOptimizer takes on creation.

    Without ZeRO, bf16 and fp16 run through DeepSpeed 0.19.8's `runtime/fp16/unfused_optimizer.py::
    FP16_UnfusedOptimizer`, whose constructor calls `initialize_optimizer_states()`: one `optimizer.step()` with
    all-zero gradients on its fp32 copies of the parameters. For AdamW that step is not empty: it applies the
    decoupled weight decay once (w *= 1 - lr * weight_decay) and counts as step 1, so the first real update
    uses step-2 bias corrections (measured by the bf16 ZeRO-0 cells of tests/distributed/test_grad_matrix.py:
    update 47 % off). The fp32 copies were cloned from the low-precision weights, so copying those back and
    dropping the optimiser state restores the state before that step; AdamW recreates its moments at the
    first real step. A no-op for every other DeepSpeed optimiser wrapper (ZeRO, BF16_Optimizer, none).
    """
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    wrapper = getattr(engine, "optimizer", None)
    if not isinstance(wrapper, FP16_UnfusedOptimizer):
        return
    with torch.no_grad():
        for low, high in zip(wrapper.fp16_groups, wrapper.fp32_groups):
            for lp, hp in zip(low, high):
                hp.copy_(lp.to(hp.dtype))
    wrapper.optimizer.state.clear()


#: Param-group keys that are the lr schedule's state (restored with the scheduler) or the parameters themselves.
_NOT_HYPERPARAMETERS = ("params", "lr", "initial_lr")


def group_hyperparameters(optimizer: Any) -> list[dict[str, Any]]:
    """Every param group's hyper-parameters (weight_decay, betas, eps, LAMB's layer_adaptation, the group's
    "names"/"no_decay" tags, ...), i.e. everything but the parameters and the lr schedule's "lr"/"initial_lr".

    Take it from the engine's optimiser right after `deepspeed.initialize` (the values the config asked for)
    and hand it to `repair_optimizer_after_load` after every checkpoint load. Values are deep copies.
    """
    return [{k: copy.deepcopy(v) for k, v in group.items() if k not in _NOT_HYPERPARAMETERS}
            for group in optimizer.param_groups]


def repair_optimizer_after_load(engine: Any, expected: list[dict[str, Any]]) -> list[str]:
    """Undo what DeepSpeed's checkpoint load gets wrong in the optimiser; returns what was repaired.

    Call it after *every* `engine.load_checkpoint` (the checkpoint load path, `albert_dist.engine.checkpoint`),
    with `expected = group_hyperparameters(engine.optimizer)` taken before the load. A no-op when the load was
    right (same-size resumes, ZeRO 0-2). Why: DeepSpeed 0.19.8
    `runtime/zero/stage3.py::DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3`
    (ZeRO-3 universal checkpoint, i.e. every ZeRO-3 resume on another world size)

    * copies the checkpoint's `param_groups[0]` into *every* group, so ALBERT's no-decay group (LayerNorm
      weights, biases) resumes with group 0's `weight_decay` (0.01) and, under LAMB, `layer_adaptation=True`:
      every group's hyper-parameters are re-applied from `expected` (the config). The lr schedule's state
      ("lr", "initial_lr") is left to the scheduler DeepSpeed restores;
    * stores one and the same `step` tensor in the state of every sub-group, and torch's AdamW increments it
      in place once per group: the second group's bias correction then runs a step ahead (measured: biases and
      LayerNorm weights 1e-3 of an update off after one step). Each state gets its own copy.

    Parameters and moments load exactly (tests/distributed/test_zero3_reshard.py). Returns one line per
    repair ("group i key: loaded -> expected", "step counter of ... unshared"), each logged as a warning.
    Raises `ValueError` when the number of groups differs (the optimiser does not match the config).
    """
    groups = engine.optimizer.param_groups
    if len(groups) != len(expected):
        raise ValueError(f"the optimiser has {len(groups)} param groups after the checkpoint load, the config "
                         f"builds {len(expected)}")
    changed = []
    for i, (group, want) in enumerate(zip(groups, expected)):
        for key, value in want.items():
            if key not in group or group[key] != value:
                changed.append(f"group {i} {key}: {_short(group.get(key, '(missing)'))} -> {_short(value)}")
                group[key] = copy.deepcopy(value)
    basic = getattr(engine, "basic_optimizer", None) or engine.optimizer  # the client optimiser (its state)
    counters: set[int] = set()
    for state in basic.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            if id(step) in counters:
                state["step"] = step.clone()
                changed.append(f"step counter {float(step):g} shared with another state: unshared")
            counters.add(id(state["step"]))
    for line in changed:
        logger.warning("checkpoint load repaired (DeepSpeed ZeRO-3 universal load): %s", line)
    return changed


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> BuiltOptimizer:
    """The client optimiser handed to `deepspeed.initialize`, over `param_groups(model, cfg.weight_decay)`.

    AdamW uses the non-foreach, non-fused implementation so that ZeRO's flat fp32 partitions (one tensor per
    group) and an unpartitioned run give bit-identical updates on CPU. LAMB (`albert_dist.engine.lamb.Lamb`)
    gets `lamb_param_groups` and an `after_initialize` hook that attaches DeepSpeed's partition map, so the
    caller has no optimiser-specific branch. Raises `ValueError` for an unknown `cfg.type`.
    """
    groups = param_groups(model, cfg.weight_decay)
    if cfg.type == "adamw":
        return BuiltOptimizer(torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                                weight_decay=cfg.weight_decay, foreach=False),
                              undo_state_creation_step)
    if cfg.type == "lamb":
        return BuiltOptimizer(build_lamb(groups, cfg), attach_zero_partition_map)
    raise ValueError(f"optimizer.type must be one of {OPTIMIZERS}, got {cfg.type!r}")


def lamb_param_groups(groups: list[dict]) -> list[dict]:
    """ALBERT param groups (`albert_dist.engine.optim.param_groups`) with LAMB's keys: a group marked
    `no_decay: True` (LayerNorm weights, biases) gets `weight_decay 0.0` and `layer_adaptation False`, the
    exclusions of You et al. 2019 (section 4, BERT training). Returns new dicts; the input is not modified."""
    out = []
    for group in groups:
        group = dict(group)
        if group.get("no_decay", False):
            group["weight_decay"] = 0.0
            group["layer_adaptation"] = False
        out.append(group)
    return out


def build_lamb(groups: list[dict], cfg: OptimConfig) -> Lamb:
    """The `Lamb` for `optimizer.type: lamb`: `cfg.lr`, `cfg.betas`, `cfg.eps`, `cfg.weight_decay` over
    `lamb_param_groups(groups)`. The engine must still call `attach_zero_partition_map(engine)` after
    `deepspeed.initialize` (`build_optimizer` returns it as the `after_initialize` hook)."""
    return Lamb(lamb_param_groups(groups), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                weight_decay=cfg.weight_decay)


def lr_factor(step: int, warmup_steps: int, total_steps: int, decay: str = "linear", power: float = 1.0) -> float:
    """Multiplier of the peak lr for the update of optimiser step `step` (0-based, the lr used by update step+1).

    warmup: (step + 1) / warmup_steps for step < warmup_steps, so the first update is not wasted at lr 0 (as in
    HF's `get_linear_schedule_with_warmup` shifted by one); decay: ((total - step) / (total - warmup)) ** power,
    which reaches 0 after the last step (step = total_steps). Raises `ValueError` if total_steps < 1 or
    warmup_steps > total_steps.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps!r}")
    if warmup_steps > total_steps:
        raise ValueError(f"optimizer.warmup_steps ({warmup_steps}) must be <= max_steps ({total_steps})")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return remaining if decay == "linear" else remaining ** power


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR applying `lr_factor` to every group's peak lr; DeepSpeed steps it once per optimiser step."""
    warmup = cfg.warmup_steps_for(total_steps)
    lr_factor(0, warmup, total_steps)  # validate warmup <= total before building

    def factor(step: int) -> float:
        return lr_factor(step, warmup, total_steps, cfg.decay, cfg.power)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
