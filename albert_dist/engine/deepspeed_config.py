"""The DeepSpeed JSON config, generated from an `EngineConfig` and validated before any process group starts.

Only what ALBERT pretraining needs is modelled (DeepSpeed config reference,
https://www.deepspeed.ai/docs/config-json/): the batch triple `train_batch_size = train_micro_batch_size_per_gpu
x gradient_accumulation_steps x world_size`, gradient clipping, precision (fp32, bf16 with fp32 gradient
accumulation; fp16 is refused by `EngineConfig`) and ZeRO stage 0-3 with a small validated pass-through of
`zero_optimization` options. Everything else keeps DeepSpeed's defaults.

The gradient-accumulation count written here is the one the training loop uses (it reads it back from the
same `EngineConfig`): DeepSpeed decides at which micro-step to reduce and step from this number, and a value
that differs from the loop's makes ZeRO-2 keep only part of the accumulated micro-batches.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from albert_dist.engine.config import EngineConfig, global_batch_size
from albert_dist.model.config import AlbertConfig
from albert_dist.model.sharing import parameter_numels

#: DeepSpeed 0.19's reduce bucket default (elements), sized for billion-parameter models
DEEPSPEED_BUCKET = 500_000_000
#: Bucket sizes are rounded up to a multiple of this (DeepSpeed wants the all-gather bucket a multiple of its
#: alignment factor); it is also the smallest bucket, so a tiny model keeps one bucket
BUCKET_GRAIN = 1_000_000


def model_bucket_size(numels: Sequence[int]) -> int:
    """Elements per ZeRO reduce and all-gather bucket for a model whose parameter tensors have `numels` elements:
    a quarter of the parameters, at least the largest tensor (its gradient fits one bucket), rounded up to
    `BUCKET_GRAIN`, at most DeepSpeed's default. Why: DeepSpeed's fixed 5e8 allocates 1 GB (bf16) or 2 GB (fp32)
    of bucket for any model (ALBERT-base has 1.2e7 parameters); a quarter keeps a step's reduction to a few
    collectives while the bucket holds a quarter of a gradient copy."""
    wanted = max(max(numels, default=0), math.ceil(sum(numels) / 4))
    return min(DEEPSPEED_BUCKET, max(BUCKET_GRAIN, math.ceil(wanted / BUCKET_GRAIN) * BUCKET_GRAIN))


def bucket_defaults(model: AlbertConfig, zero_stage: int) -> dict[str, int]:
    """The `zero_optimization` bucket sizes albert_dist sets for `model` where the config leaves them unset:
    reduce (ZeRO 1-3) and all-gather (ZeRO 1-2), `model_bucket_size` each; none at ZeRO-0."""
    size = model_bucket_size(parameter_numels(model))
    keys = {1: ("reduce_bucket_size", "allgather_bucket_size"), 2: ("reduce_bucket_size", "allgather_bucket_size"),
            3: ("reduce_bucket_size",)}.get(zero_stage, ())
    return {key: size for key in keys}


def build_deepspeed_config(engine: EngineConfig, world_size: int, accelerator: Optional[str] = None,
                           model: Optional[AlbertConfig] = None) -> dict:
    """The DeepSpeed config dict for the `engine:` section on `world_size` ranks (the content of the run's ds_config.json);
    `engine` resolved for `world_size` (``gradient_accumulation_steps: auto``: `albert_dist.config.for_world_size`,
    once per job, in the preflight).

    `accelerator` is DeepSpeed's accelerator name ("cpu", "cuda", ...); None asks
    `deepspeed.accelerator.get_accelerator()`. With `model`, bucket sizes the config leaves unset are scaled to
    it (`bucket_defaults`); without, DeepSpeed's defaults stay. Raises `ValueError` for a batch triple that does
    not multiply out or is not resolved (see `global_batch_size`) and for bf16 on an accelerator without bf16.

    The client optimiser (torch AdamW or LAMB, built by `albert_dist.engine.optim`) is passed to
    `deepspeed.initialize` rather than named here, so `zero_allow_untested_optimizer` is set and
    `zero_force_ds_cpu_optimizer` is off (DeepSpeed would otherwise demand its C++ CPU Adam on CPU).
    """
    train_batch_size = global_batch_size(engine, world_size)
    if accelerator is None:
        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()
        accelerator = accel.device_name()
        bf16_ok = bool(accel.is_bf16_supported())
    else:
        bf16_ok = True
    if engine.precision == "bf16" and not bf16_ok:
        raise ValueError(f"engine.precision=bf16 is not supported by accelerator {accelerator!r}")

    zero: dict[str, Any] = {"stage": engine.zero_stage}
    if model is not None:
        zero.update(bucket_defaults(model, engine.zero_stage))
    zero.update(engine.zero_optimization.to_dict())
    for name in ("offload_optimizer", "offload_param"):
        offload = getattr(engine, name)
        if offload.device != "none":
            zero[name] = {"device": offload.device, "pin_memory": offload.pin_memory}
    ds: dict[str, Any] = {
        "train_batch_size": train_batch_size,
        "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": engine.gradient_accumulation_steps,
        "gradient_clipping": engine.gradient_clipping,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        # The trainer logs through its tracker; silence DeepSpeed's own periodic prints.
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer is on and synchronized by default (deepspeed/utils/config.py): it drains the
        # device at every forward of an engine without training_data (ours) and at every engine.step(), i.e. twice
        # per micro-step (deepspeed/utils/timer.py ThroughputTimer). The trainer measures throughput itself.
        "timers": {"throughput": {"enabled": False}},
    }
    if engine.precision == "bf16":
        # `immediate_grad_update` stays at DeepSpeed's default (false): with the backward prologue running
        # (PreTrainingOutput is a NamedTuple DeepSpeed hooks), the 16 bf16 ZeRO-1 cells of the gradient matrix
        # give the same errors to every digit with true and false, and equal cell times.
        ds["bf16"] = {"enabled": True}
        ds["data_types"] = {"grad_accum_dtype": engine.accumulation_dtype}
        # DeepSpeed reduces bf16 models' gradients in bf16 unless told otherwise (engine.communication_data_type),
        # i.e. it rounds the fp32-accumulated gradients to bf16 for the reduction. Reducing in the accumulation
        # dtype makes bf16 + fp32 accumulation at ZeRO 1-3 equal a single-process bf16 step with fp32 sums
        # (measured: gradients 1.4e-8 apart on every such cell of tests/distributed/test_grad_matrix.py, against
        # 0.2 % of the update with bf16 reduction), for twice the gradient bytes on the wire.
        ds["communication_data_type"] = engine.accumulation_dtype
    return ds
