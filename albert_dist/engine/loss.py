"""The pretraining loss of one optimiser step, normalised over the whole global batch, and the step itself.

MLM: sum of the cross-entropy over every masked token of the global batch (all micro-steps, all ranks) / the
number of those tokens. SOP: sum over the labelled sequences of the global batch / their number. A mean per
micro-batch instead weights a token by 1 / (its micro-batch's masked count), so gradient accumulation, the
micro-batch size and the number of ranks would change the gradient whenever micro-batches hold different
numbers of masked tokens (short sequences, the 20-prediction cap); transformers fixed the same bug for
gradient accumulation in 2024 (huggingface/transformers PR #34191).

The counts are known before the first forward: the labels are in the batches. `label_counts` sums them over
the step's micro-batches and all-reduces them once; each micro-step's backward then uses
`micro_step_loss`, scaled for what DeepSpeed does to it (`engine.backward` divides by the accumulation steps,
the gradient reduction averages over the data-parallel ranks).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist

from albert_dist.distributed.collectives import is_multi_rank
from albert_dist.engine.grad_norm import exact_norm_applies, global_grad_norm
from albert_dist.model.config import IGNORE_INDEX


def label_counts(batches: Sequence[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Masked tokens and labelled SOP sequences of a whole optimiser step: (2,) float64 on the batches' device.

    `batches` are this rank's micro-batches of the step (the loader's dicts with (B, S) `mlm_labels` and (B,)
    `sop_labels`, -100 = no label). Collective: one SUM all-reduce over the process group when one is up with
    more than one rank, so every rank returns the global counts.
    """
    mlm = sum((b["mlm_labels"] != IGNORE_INDEX).sum() for b in batches)
    sop = sum((b["sop_labels"] != IGNORE_INDEX).sum() for b in batches)
    counts = torch.stack([torch.as_tensor(mlm), torch.as_tensor(sop)]).to(torch.float64)
    if is_multi_rank():
        dist.all_reduce(counts)
    return counts


def micro_step_loss(output: Any, counts: torch.Tensor, micro_steps: int, sop_weight: float = 1.0) -> torch.Tensor:
    """This micro-step's share of the step loss, as `engine.backward` must receive it (fp32 scalar).

    step loss = sum_CE_MLM / counts[0] + sop_weight * sum_CE_SOP / counts[1] over the global batch; this
    micro-step contributes its own sums (`output.mlm_loss_sum`, `output.sop_loss_sum` of a
    `PreTrainingOutput`). `micro_steps` = gradient_accumulation_steps x data-parallel world size: DeepSpeed
    divides the loss by the first and averages the gradients over the second, and multiplying by both makes
    the reduced gradient that of the step loss. A zero count gives that term 0 (nothing was labelled).
    """
    mlm = output.mlm_loss_sum / counts[0].clamp(min=1).to(output.mlm_loss_sum.dtype)
    sop = output.sop_loss_sum / counts[1].clamp(min=1).to(output.sop_loss_sum.dtype)
    return micro_steps * (mlm + sop_weight * sop)


class StepResult(NamedTuple):
    """What `optimizer_step` returns; tensors stay on the device (reading them is a host sync)."""

    outputs: list
    """The micro-steps' `PreTrainingOutput`s (detached), for metrics."""
    grad_norm: Optional[torch.Tensor]
    """The global gradient 2-norm of the step before clipping, a scalar tensor (None if DeepSpeed reports
    none and it could not be computed)."""


def optimizer_step(engine: Any, batches: Sequence[dict[str, torch.Tensor]], sop_weight: float = 1.0,
                   poison: bool = False, on_phase: Optional[Callable[[str], None]] = None) -> StepResult:
    """One optimiser step on a DeepSpeed engine: forward, `engine.backward`, `engine.step` per micro-batch.

    `batches`: this rank's `engine.gradient_accumulation_steps()` micro-batches on the engine's device (the
    count is checked: DeepSpeed steps at its own boundary). Collective (`label_counts`). No host sync of its
    own: the outputs and the norm stay tensors (DeepSpeed's step may sync inside; docs/training-loop.md lists where).
    Returns the detached outputs and the step's pre-clipping gradient norm (`engine.get_global_grad_norm()`;
    at fp32 ZeRO-0 the float64 norm of `albert_dist.engine.grad_norm`, from the exact clipping the trainer
    installs or, with clipping off, computed here just before the last `engine.step()`).
    `poison`: this rank's MLM loss sum of the first micro-step is made NaN before its backward pass, so the step's
    loss and gradients are non-finite (the testing switch of `albert_dist.engine.divergence`, a poisoned step).
    `on_phase` (the hang watchdog's mark, `albert_dist.job.watchdog`) hears "forward_backward" first and
    "optimizer_step" before the last `engine.step()` (where DeepSpeed reduces and steps).
    Raises `ValueError` when the number of batches differs from the engine's accumulation steps.
    """
    mark = on_phase or (lambda phase: None)
    mark("forward_backward")
    ga = engine.gradient_accumulation_steps()
    if len(batches) != ga:
        raise ValueError(f"{len(batches)} micro-batches for an engine with gradient_accumulation_steps={ga}")
    counts = label_counts(batches)
    world = engine.dp_world_size
    outputs = []
    own_norm = None
    for i, batch in enumerate(batches):
        out = engine(**batch)
        if poison and i == 0:
            out = out._replace(mlm_loss_sum=out.mlm_loss_sum * float("nan"))
        engine.backward(micro_step_loss(out, counts, ga * world, sop_weight))
        if i == ga - 1 and exact_norm_applies(engine) and not engine.gradient_clipping() > 0:
            own_norm = global_grad_norm(engine.module.parameters())  # before step() zeroes the gradients
        if i == ga - 1:
            mark("optimizer_step")
        engine.step()
        outputs.append(type(out)(*(t.detach() for t in out)))  # metrics only: keep no autograd graph alive
    reported = own_norm if own_norm is not None else engine.get_global_grad_norm()
    return StepResult(outputs, None if reported is None else torch.as_tensor(reported))


__all__ = ["StepResult", "label_counts", "micro_step_loss", "optimizer_step"]
