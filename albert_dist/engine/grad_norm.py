"""The global gradient norm at ZeRO-0 fp32, computed as DeepSpeed's ZeRO-1/2 compute it, and clipping with it.

DeepSpeed 0.19.8 clips fp32 ZeRO-0 gradients in `engine.clip_fp32_gradients` through
`deepspeed.runtime.utils.clip_grad_norm_`, which takes each tensor's norm with fp32 ``norm()``. On CPU that is
5.75e-5 (relative) low on the 256k-element tied embedding gradient of albert-tiny (step-1 norm 1.3728369 where
float64 gives 1.3728624), so every step clipped slightly too little and ZeRO-0's weights drifted from ZeRO-1/2/3's
(1.2e-5 scaled on the tied embedding after 8 steps; the stages with a float64 norm agree to 1.1e-6). It also keeps
no norm (`engine.get_global_grad_norm()` is None at ZeRO-0 fp32). ZeRO-1/2 (`stage_1_and_2.get_grad_norm_direct`)
take every tensor's norm in float64 (`deepspeed.runtime.zero.utils.get_norm_dtype`), sum the squares, cast the
sum to fp32 and take the root; `global_grad_norm` does exactly that, and `install_exact_clipping` makes a
ZeRO-0 fp32 engine clip with it, with ZeRO-1/2's coefficient ``1 / max(1, (norm + 1e-6) / clip)``
(`unscale_and_clip_grads`), so ZeRO-0 and ZeRO-1 step alike and log the same `train/grad_norm`.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch


def global_grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """2-norm over the `.grad` of every parameter in `params` (None grads skipped), a float32 scalar tensor on the
    gradients' device (no host sync): each tensor's norm in float64, squares summed in float64, the sum cast to
    float32 and its root taken, as DeepSpeed's ZeRO-1/2 `get_grad_norm_direct`. 0 when no parameter has a grad.
    The gradients must be complete on this rank (ZeRO-0 after the boundary all-reduce): no collective runs."""
    norms = [torch.linalg.vector_norm(p.grad.detach().to(torch.float64)) for p in params if p.grad is not None]
    if not norms:
        return torch.zeros((), dtype=torch.float32)
    return torch.stack(norms).pow(2).sum().float().sqrt()


def exact_norm_applies(engine: Any) -> bool:
    """True for the engines whose clipping `install_exact_clipping` replaces: ZeRO-0 without a mixed-precision
    optimiser, where full fp32 gradients sit in `param.grad` on every rank after the boundary backward and
    DeepSpeed clips them itself (`engine._take_model_step` -> `clip_fp32_gradients`)."""
    return engine.zero_optimization_stage() == 0 and not engine.bfloat16_enabled() and not engine.fp16_enabled()


def install_exact_clipping(engine: Any) -> bool:
    """Make a ZeRO-0 fp32 `engine` clip with `global_grad_norm` and report it: replaces the engine's
    `clip_fp32_gradients` (instance attribute; `_take_model_step` looks it up at every step, only when
    `gradient_clipping` > 0) by one that computes the norm, scales every gradient by
    ``1 / max(1, (norm + 1e-6) / clip)`` on the device, and stores the norm (float32 tensor) where
    `engine.get_global_grad_norm()` returns it. Returns whether it was installed (False for other engines,
    which keep DeepSpeed's float64 norms). Gradients are identical on every rank at ZeRO-0, so no collective
    is needed (DeepSpeed's version averages the identical norms over the data-parallel group)."""
    if not exact_norm_applies(engine):
        return False
    module, clip = engine.module, float(engine.gradient_clipping())

    def clip_fp32_gradients() -> None:
        params = [p for p in module.parameters() if p.grad is not None]
        norm = global_grad_norm(params)
        coef = 1.0 / torch.clamp((norm + 1e-6) / clip, min=1.0)
        for p in params:
            p.grad.mul_(coef.to(p.grad.dtype))
        engine._global_grad_norm = norm

    engine.clip_fp32_gradients = clip_fp32_gradients
    return True


__all__ = ["exact_norm_applies", "global_grad_norm", "install_exact_clipping"]
