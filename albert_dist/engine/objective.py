"""The pretraining objective: how the trainer weights the SOP loss against the MLM loss, step by step (torch-free).

    loss(step) = mlm_loss + sop_weight_at(cfg, step) * sop_loss

ALBERT (Lan et al. 2020) adds the two losses with weight 1 from the first step. On a small model and corpus
that holds the encoder collapsed: with SOP at weight 1 from step 0 albert-tiny predicts the most frequent
token at every [MASK] for the first ~300-400 steps (issue 11; docs/convergence.md has the measurement). The
schedule here lets the MLM break through first: weight 0 before ``sop_start_step``, then a linear ramp over
``sop_ramp_steps`` steps up to ``sop_weight`` (0 ramp steps: a step from 0 to ``sop_weight``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ObjectiveConfig:
    """Weight and schedule of the SOP loss (the `objective:` section of a recipe)."""

    sop_weight: float = 1.0
    """Weight of the SOP loss once ramped in (0: MLM only; ALBERT: 1)."""
    sop_start_step: int = 0
    """Optimiser steps trained on the MLM loss alone before the SOP loss is ramped in (0: from the first step)."""
    sop_ramp_steps: int = 0
    """Optimiser steps of the linear ramp of the SOP weight from 0 to sop_weight, starting at sop_start_step."""

    def __post_init__(self) -> None:
        if not self.sop_weight >= 0.0:
            raise ValueError(f"objective.sop_weight must be >= 0, got {self.sop_weight!r}")
        if self.sop_start_step < 0:
            raise ValueError(f"objective.sop_start_step must be >= 0, got {self.sop_start_step!r}")
        if self.sop_ramp_steps < 0:
            raise ValueError(f"objective.sop_ramp_steps must be >= 0, got {self.sop_ramp_steps!r}")


def sop_weight_at(cfg: ObjectiveConfig, step: int) -> float:
    """Weight of the SOP loss in the update of optimiser step ``step`` (0-based: the number of steps done).

    0 for ``step < sop_start_step``; then ``sop_weight * min(1, (step - sop_start_step + 1) / sop_ramp_steps)``
    (as the learning-rate warmup of `albert_dist.engine.optim.lr_factor`, so the first ramp step is not
    wasted at weight 0), or ``sop_weight`` at once when ``sop_ramp_steps`` is 0. Raises `ValueError` for a
    negative step.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if step < cfg.sop_start_step:
        return 0.0
    if cfg.sop_ramp_steps == 0:
        return float(cfg.sop_weight)
    return float(cfg.sop_weight) * min(1.0, (step - cfg.sop_start_step + 1) / cfg.sop_ramp_steps)


__all__ = ["ObjectiveConfig", "sop_weight_at"]
