"""Optimiser and learning-rate schedule for ALBERT pretraining.

* Parameter groups: weight decay on every weight matrix / embedding table, none on LayerNorm weights and on
  biases (BERT/ALBERT reference implementations, `AdamWeightDecayOptimizer(exclude_from_weight_decay=
  ["LayerNorm", "layer_norm", "bias"])`; Lan et al. 2020 section 4.1 trains with LAMB and the same exclusions).
* Optimiser: `torch.optim.AdamW` (Loshchilov & Hutter 2019, decoupled weight decay) handed to DeepSpeed as a
  client optimiser, which works on CPU and GPU at every ZeRO stage; or LAMB (You et al. 2019) from
  `albert_dist.engine.lamb`, which stays exact under ZeRO partitioning.
* Schedule: linear warmup from 0 to `lr` over `warmup_steps`, then linear or polynomial decay to 0 at
  `total_steps` (ALBERT: 3,125 warmup steps, polynomial decay with power 1 over 125k steps).

The schedule is a `torch.optim.lr_scheduler.LambdaLR` given to `deepspeed.initialize`, so DeepSpeed steps it
once per optimiser step (at the gradient-accumulation boundary) and saves it in its checkpoints.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "polynomial")


@dataclass
class OptimConfig:
    """Optimiser, weight decay and learning-rate schedule (the `optimizer:` section of a recipe)."""

    type: str = "adamw"
    """Optimiser: "adamw" (torch.optim.AdamW) or "lamb" (albert_dist.engine.lamb, exact under ZeRO)."""
    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = 0.01
    """Decoupled weight decay on weight matrices and embeddings (never on LayerNorm weights or biases)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam (beta1, beta2): decay rates of the first and second moment estimates."""
    eps: float = 1e-6
    """Adam epsilon added to the square root of the second moment (ALBERT/BERT: 1e-6)."""
    warmup_steps: int = 0
    """Optimiser steps of linear warmup from 0 to lr (ALBERT: 3125)."""
    decay: str = "linear"
    """Decay after warmup, to 0 at the last step: "linear" or "polynomial" (with `power`)."""
    power: float = 1.0
    """Exponent of the polynomial decay (1.0 = linear, ALBERT's setting); used when decay is "polynomial"."""

    def __post_init__(self) -> None:
        if self.type not in OPTIMIZERS:
            raise ValueError(f"optimizer.type must be one of {OPTIMIZERS}, got {self.type!r}")
        if not self.lr > 0.0:
            raise ValueError(f"optimizer.lr must be > 0, got {self.lr!r}")
        if self.weight_decay < 0.0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two numbers in [0, 1), got {list(self.betas)!r}")
        if not self.eps > 0.0:
            raise ValueError(f"optimizer.eps must be > 0, got {self.eps!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.decay not in DECAYS:
            raise ValueError(f"optimizer.decay must be one of {DECAYS}, got {self.decay!r}")
        if not self.power > 0.0:
            raise ValueError(f"optimizer.power must be > 0, got {self.power!r}")


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


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The client optimiser handed to `deepspeed.initialize`, over `param_groups(model, cfg.weight_decay)`.

    AdamW uses the non-foreach, non-fused implementation so that ZeRO's flat fp32 partitions (one tensor per
    group) and an unpartitioned run give bit-identical updates on CPU. Raises `ValueError` for an unknown
    `cfg.type` and `ImportError` when LAMB is requested but `albert_dist.engine.lamb` is not installed.
    """
    groups = param_groups(model, cfg.weight_decay)
    if cfg.type == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                 weight_decay=cfg.weight_decay, foreach=False)
    if cfg.type == "lamb":
        # The single call site of the LAMB implementation (owned by the LAMB module).
        from albert_dist.engine.lamb import build_lamb

        return build_lamb(groups, cfg)
    raise ValueError(f"optimizer.type must be one of {OPTIMIZERS}, got {cfg.type!r}")


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
    lr_factor(0, cfg.warmup_steps, total_steps)  # validate warmup <= total before building

    def factor(step: int) -> float:
        return lr_factor(step, cfg.warmup_steps, total_steps, cfg.decay, cfg.power)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
