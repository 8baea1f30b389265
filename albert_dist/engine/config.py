"""Configs of the engine layer (the `engine:`, `optimizer:` and `checkpoint:` sections of a recipe), torch-free.

Beside the components they configure in spirit (deepspeed_config.py, optim.py, checkpoint.py), but kept in one
module that imports neither torch nor deepspeed, so that `albert_dist.config` (and a config check before any
process group starts) stays cheap and free of import cycles.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Optional, Union, get_args

from albert_dist.on_resume import APPLIES, CONVERT, QUIET, REFUSE, RESTART_STREAMS, on_resume

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
GradAccumDtype = Literal["fp32", "bf16"]
GRAD_ACCUM_DTYPES: tuple[str, ...] = get_args(GradAccumDtype)
CompileScope = Literal["block", "model"]
COMPILE_SCOPES: tuple[str, ...] = get_args(CompileScope)


#: DeepSpeed `zero_optimization` options rarely set (no recipe, test or benchmark sets them), accepted in
#: `engine.zero_optimization.extra` and passed through as given: name -> (type, smallest value; None for a bool).
EXTRA_ZERO_OPTIONS: dict[str, tuple[type, Optional[int]]] = {
    "contiguous_gradients": (bool, None),  # copy gradients into a contiguous buffer as they are produced
    "reduce_scatter": (bool, None),  # ZeRO-1/2: reduce gradients with reduce-scatter instead of all-reduce
    "allgather_bucket_size": (int, 1),  # ZeRO-1/2: elements all-gathered at a time after the optimiser step
    "stage3_max_live_parameters": (int, 0),  # ZeRO-3: maximum gathered elements kept alive
}


@dataclass
class ZeroOptimizationConfig:
    """Pass-through of DeepSpeed `zero_optimization` options (same names); None keeps DeepSpeed's default."""

    overlap_comm: Optional[bool] = field(default=None, metadata=on_resume(APPLIES))
    """Overlap gradient reduction with the backward pass."""
    reduce_bucket_size: Optional[int] = field(default=None, metadata=on_resume(APPLIES))
    """Elements reduced at a time."""
    stage3_param_persistence_threshold: Optional[int] = field(default=None, metadata=on_resume(CONVERT))
    """ZeRO-3: parameters with fewer elements stay unpartitioned (DeepSpeed default 1e5; 0 partitions all)."""
    stage3_prefetch_bucket_size: Optional[int] = field(default=None, metadata=on_resume(APPLIES))
    """ZeRO-3: elements prefetched ahead of use."""
    stage3_max_reuse_distance: Optional[int] = field(default=None, metadata=on_resume(APPLIES))
    """ZeRO-3: keep a gathered parameter if it is reused within this many elements (shared ALBERT groups)."""
    round_robin_gradients: Optional[bool] = field(default=None, metadata=on_resume(CONVERT))
    """ZeRO-1/2: round-robin gradient partition assignment (helps CPU offload)."""
    extra: dict[str, Any] = field(default_factory=dict, metadata=on_resume(APPLIES))
    """Rarely set DeepSpeed options, passed through as given; only the keys of `EXTRA_ZERO_OPTIONS`, each of its
    type (e.g. ``engine.zero_optimization.extra={stage3_max_live_parameters: 100000000}``)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"engine.zero_optimization.{name} must be >= 0, got {value!r}")
        if self.reduce_bucket_size is not None and self.reduce_bucket_size < 1:
            raise ValueError(f"engine.zero_optimization.reduce_bucket_size must be >= 1, got {self.reduce_bucket_size!r}")
        for name, value in self.extra.items():
            if name not in EXTRA_ZERO_OPTIONS:
                raise ValueError(f"engine.zero_optimization.extra.{name}: not an option passed through (allowed: "
                                 f"{', '.join(EXTRA_ZERO_OPTIONS)}; the others are fields of "
                                 "engine.zero_optimization)")
            kind, least = EXTRA_ZERO_OPTIONS[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"engine.zero_optimization.extra.{name} must be a {kind.__name__}, got {value!r}")
            if least is not None and value < least:
                raise ValueError(f"engine.zero_optimization.extra.{name} must be >= {least}, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """The options that were set, as DeepSpeed `zero_optimization` keys (`extra`'s among them)."""
        return {**{k: v for k, v in asdict(self).items() if v is not None and k != "extra"}, **self.extra}


OFFLOAD_DEVICES = ("none", "cpu")


@dataclass
class OffloadConfig:
    """ZeRO-Offload of optimiser states (`engine.offload_optimizer`) or parameters (`engine.offload_param`).

    DeepSpeed's `zero_optimization.offload_optimizer` / `offload_param` (only `device` and `pin_memory`; NVMe is
    not offered). Validated by `EngineConfig`, which knows the dotted path.
    """

    device: str = field(default="none", metadata=on_resume(CONVERT))
    """"none" (stay on the accelerator) or "cpu" (keep them in host memory; the optimiser steps there)."""
    pin_memory: bool = field(default=False, metadata=on_resume(APPLIES))
    """Page-locked host buffers: faster host<->GPU copies, costs pinned memory (no effect on a CPU-only run)."""


@dataclass
class EngineConfig:
    """DeepSpeed engine settings (the `engine:` section of a recipe); names follow DeepSpeed's JSON keys."""

    zero_stage: int = field(default=2, metadata=on_resume(
        REFUSE, "DeepSpeed 0.19.8 loads no checkpoint of one ZeRO stage into an engine of another, not even through "
                "its universal checkpoint (measured, 2 -> 3: state_dict_factory finds none of the per-rank model "
                "states ZeRO-3 reads)"))
    """ZeRO stage: 0 (data parallel), 1 (optimiser states), 2 (+ gradients), 3 (+ parameters) partitioned."""
    train_micro_batch_size_per_gpu: int = field(default=8, metadata=on_resume(RESTART_STREAMS))
    """Sequences per rank per forward/backward pass (micro-step)."""
    gradient_accumulation_steps: Union[int, str] = field(default=1, metadata=on_resume(
        APPLIES, "accumulates the new number of micro-steps; the global batch must stay the same (checked), so the "
                 "trajectory continues"))
    """Micro-steps per optimiser step; the training loop runs exactly this many. "auto": train_batch_size /
    (micro x world size), resolved when the world size is known (`resolve_accumulation`), so one recipe fits any
    number of ranks that divides its global batch."""
    train_batch_size: Optional[int] = field(default=None, metadata=on_resume(QUIET))
    """Global sequences per optimiser step; must equal micro x accumulation x world size (None: derived)."""
    gradient_clipping: float = field(default=1.0, metadata=on_resume(APPLIES))
    """Clip the global gradient 2-norm to this value before each step (0: no clipping)."""
    precision: Precision = field(default="fp32", metadata=on_resume(REFUSE))
    """"fp32" or "bf16" (bf16 weights/activations, fp32 master weights); "fp16" is refused (see `__post_init__`)."""
    grad_accum_dtype: Optional[GradAccumDtype] = field(default=None, metadata=on_resume(REFUSE))
    """bf16 only: dtype gradients are accumulated and reduced across ranks in, "fp32" (needs ZeRO >= 1) or "bf16";
    None: fp32 at ZeRO 1-3, bf16 at ZeRO-0 (see `accumulation_dtype`)."""
    zero_optimization: ZeroOptimizationConfig = field(default_factory=ZeroOptimizationConfig)
    """Extra DeepSpeed `zero_optimization` options, passed through when set."""
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    """ZeRO-Offload of the fp32 master weights and optimiser states (needs zero_stage >= 1)."""
    offload_param: OffloadConfig = field(default_factory=OffloadConfig)
    """ZeRO-Infinity parameter offload of the partitioned parameters (needs zero_stage 3)."""
    peak_tflops_per_device: Optional[float] = field(default=None, metadata=on_resume(QUIET))
    """Peak dense TFLOP/s of one device for MFU; None: $ALBERT_DIST_PEAK_TFLOPS, else a matmul measured at start."""
    compile: bool = field(default=False, metadata=on_resume(
        APPLIES, "compiles (or not) from the resumed step on; the arithmetic is the same within fp32 rounding "
                 "(tests/distributed/test_compile.py)"))
    """torch.compile (inductor) the training forward and backward (albert_dist.engine.compile); the first step
    compiles. Off by default until measured on a GPU (docs/benchmarks.md has the CPU figures)."""
    compile_scope: CompileScope = field(default="model", metadata=on_resume(
        APPLIES, "compiles the new scope from the resumed step on"))
    """What `compile` compiles: "model" (DeepSpeed's engine.compile(): the whole forward with embeddings, heads
    and losses; ZeRO 0-2) or "block" (the executed-block function, once: two graphs serve every block whatever
    the depth; ZeRO 0-3). CPU figures for both in docs/benchmarks.md."""
    init_timeout_s: float = field(default=900.0, metadata=on_resume(QUIET))
    """Seconds a rank may go without progress from its start to its first finished optimiser step (process
    group, resume, first batch, compile) before the hang watchdog ends the job with exit 76 (docs/faults.md)."""
    step_timeout_s: float = field(default=300.0, metadata=on_resume(QUIET))
    """Seconds a rank may stay in one phase of a step (data, forward/backward, optimiser step) after its first
    step before the hang watchdog ends the job with exit 76; saves and evaluations get longer (docs/faults.md)."""

    @property
    def accumulation_dtype(self) -> str:
        """The gradient accumulation/reduction dtype a bf16 run uses: `grad_accum_dtype` when set, else "fp32"
        at ZeRO 1-3 and "bf16" at ZeRO-0, where DeepSpeed 0.19 has no fp32 accumulation (its
        `engine._do_optimizer_sanity_check` refuses bf16 weights with fp32 accumulation without ZeRO; measured
        cost at ZeRO-0: 1.2e-2 gradient error against the 6.6e-3 floor of fp32 sums, docs/gradients.md)."""
        if self.grad_accum_dtype is not None:
            return self.grad_accum_dtype
        return "bf16" if self.zero_stage == 0 else "fp32"

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"engine.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.train_micro_batch_size_per_gpu < 1:
            raise ValueError(f"engine.train_micro_batch_size_per_gpu must be >= 1, "
                             f"got {self.train_micro_batch_size_per_gpu!r}")
        ga = self.gradient_accumulation_steps
        if isinstance(ga, str) and ga != AUTO or not isinstance(ga, str) and ga < 1:
            raise ValueError(f"engine.gradient_accumulation_steps must be an integer >= 1 or {AUTO!r}, got {ga!r}")
        if self.train_batch_size is not None and self.train_batch_size < 1:
            raise ValueError(f"engine.train_batch_size must be >= 1 or null, got {self.train_batch_size!r}")
        if ga == AUTO and self.train_batch_size is None:
            raise ValueError(f"engine.gradient_accumulation_steps={AUTO} needs engine.train_batch_size (the global "
                             "batch it is derived from); got train_batch_size=null")
        if self.gradient_clipping < 0.0:
            raise ValueError(f"engine.gradient_clipping must be >= 0, got {self.gradient_clipping!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"engine.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "fp16":
            # Refused rather than shipped untested: DeepSpeed's CPU accelerator has no fp16, so no test here can
            # run its loss scaler, and the loss handed to engine.backward is multiplied by accumulation x world size
            # (engine/loss.py), which the dynamic scaler would meet log2(GA x world) halvings too high (skipped steps).
            raise ValueError("engine.precision=fp16 is not supported: its dynamic loss scaling is untested here (no "
                             "fp16 on DeepSpeed's CPU accelerator) and would start log2(gradient_accumulation_steps x "
                             "world size) halvings too high; use bf16 (GPUs since Ampere) or fp32")
        if self.grad_accum_dtype is not None and self.grad_accum_dtype not in GRAD_ACCUM_DTYPES:
            raise ValueError(f"engine.grad_accum_dtype must be one of {GRAD_ACCUM_DTYPES}, "
                             f"got {self.grad_accum_dtype!r}")
        if self.precision == "bf16" and self.grad_accum_dtype == "fp32" and self.zero_stage == 0:
            # DeepSpeed 0.19 (engine._do_optimizer_sanity_check) raises NotImplementedError for bf16 weights
            # with fp32 gradient accumulation without ZeRO: fp32 accumulation lives in the ZeRO optimisers.
            raise ValueError("engine.precision=bf16 with engine.grad_accum_dtype=fp32 needs engine.zero_stage >= 1 "
                             "(DeepSpeed accumulates bf16 gradients in fp32 only inside its ZeRO optimisers); "
                             "got zero_stage=0. Use zero_stage>=1, or grad_accum_dtype=bf16")
        for name in ("offload_optimizer", "offload_param"):
            device = getattr(self, name).device
            if device not in OFFLOAD_DEVICES:
                raise ValueError(f"engine.{name}.device must be one of {OFFLOAD_DEVICES}, got {device!r}")
        # DeepSpeed offloads only what ZeRO partitions: optimiser states from stage 1, parameters at stage 3.
        if self.offload_optimizer.device != "none" and self.zero_stage < 1:
            raise ValueError(f"engine.offload_optimizer.device={self.offload_optimizer.device} needs "
                             f"engine.zero_stage >= 1, got zero_stage={self.zero_stage}")
        if self.offload_param.device != "none" and self.zero_stage != 3:
            raise ValueError(f"engine.offload_param.device={self.offload_param.device} needs engine.zero_stage=3, "
                             f"got zero_stage={self.zero_stage}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"engine.compile_scope must be one of {COMPILE_SCOPES}, got {self.compile_scope!r}")
        if self.compile and self.compile_scope == "model" and self.zero_stage == 3:
            # Measured with DeepSpeed 0.19.8: dynamo traces into ZeRO-3's per-submodule hooks and guards on each
            # submodule's ds_id and hook objects, so it recompiles for every submodule, past its recompile limit
            # (then the rest runs eagerly, slowly and noisily). The block scope keeps those hooks out of its graphs.
            raise ValueError("engine.compile_scope=model does not work with engine.zero_stage=3 (ZeRO-3's "
                             "parameter hooks make torch.compile recompile for every submodule); use "
                             "engine.compile_scope=block, or zero_stage <= 2")
        for name in ("init_timeout_s", "step_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"engine.{name} must be a finite number of seconds > 0, got {value!r}")
        if self.peak_tflops_per_device is not None and not self.peak_tflops_per_device > 0:
            raise ValueError(f"engine.peak_tflops_per_device must be > 0 or null, got {self.peak_tflops_per_device!r}")


#: `EngineConfig.gradient_accumulation_steps` derived from the global batch and the world size
AUTO = "auto"


def resolve_accumulation(engine: EngineConfig, world_size: int) -> EngineConfig:
    """`engine` with ``gradient_accumulation_steps: auto`` replaced by train_batch_size / (micro x `world_size`);
    `engine` itself when the accumulation is a number. The one place "auto" is resolved, called once per job
    (`albert_dist.config.for_world_size`, in the app's preflight); `global_batch_size` and the DeepSpeed config
    builder take the result (`check_resolved`).

    Raises `ValueError` naming the fields and values when train_batch_size is not a multiple of micro x world size,
    or when `world_size` < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if engine.gradient_accumulation_steps != AUTO:
        return engine
    micro, target = engine.train_micro_batch_size_per_gpu, engine.train_batch_size
    if target % (micro * world_size):
        raise ValueError(f"engine.gradient_accumulation_steps={AUTO}: engine.train_batch_size ({target}) is not a "
                         f"multiple of train_micro_batch_size_per_gpu ({micro}) x world size ({world_size}) = "
                         f"{micro * world_size}; change the micro batch or the number of ranks")
    return replace(engine, gradient_accumulation_steps=target // (micro * world_size))


def check_resolved(engine: EngineConfig, world_size: int) -> None:
    """`engine` is resolved for a job of `world_size` ranks: its accumulation a number (`resolve_accumulation`
    made it one), `world_size` >= 1.

    Raises `ValueError` naming the field when ``gradient_accumulation_steps`` is still "auto", or `world_size`.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if engine.gradient_accumulation_steps == AUTO:
        raise ValueError(f"engine.gradient_accumulation_steps={AUTO} is not resolved for the world size "
                         f"({world_size}): resolve it first (albert_dist.config.for_world_size)")


def global_batch_size(engine: EngineConfig, world_size: int) -> int:
    """train_batch_size = micro x accumulation x world size: the one place this rule is checked, on an engine
    resolved for `world_size` (`resolve_accumulation`).

    Raises `ValueError` naming all four numbers when `engine.train_batch_size` is set and differs, or as
    `check_resolved`.
    """
    check_resolved(engine, world_size)
    derived = engine.train_micro_batch_size_per_gpu * engine.gradient_accumulation_steps * world_size
    if engine.train_batch_size is not None and engine.train_batch_size != derived:
        raise ValueError(
            f"engine.train_batch_size ({engine.train_batch_size}) must equal train_micro_batch_size_per_gpu "
            f"({engine.train_micro_batch_size_per_gpu}) x gradient_accumulation_steps "
            f"({engine.gradient_accumulation_steps}) x world size ({world_size}) = {derived}"
            + _batch_hint(engine.train_batch_size, engine.train_micro_batch_size_per_gpu, world_size))
    return derived


def _batch_hint(target: int, micro: int, world_size: int) -> str:
    """The accumulation that reaches `target` on `world_size` ranks, when one exists (the usual fix)."""
    if target % (micro * world_size) == 0:
        return f"; on {world_size} rank(s) set engine.gradient_accumulation_steps={target // (micro * world_size)}"
    return f"; {target} is not a multiple of micro batch x world size ({micro * world_size})"


OptimizerType = Literal["adamw", "lamb"]
#: The schedule's fields: `lr_factor` is a function of the step and the current config (resume included).
_SCHEDULE = on_resume(APPLIES, "follows the new learning-rate schedule from the checkpoint's step on")
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerType)
Decay = Literal["linear", "polynomial"]
DECAYS: tuple[str, ...] = get_args(Decay)


@dataclass
class OptimConfig:
    """Optimiser, weight decay and learning-rate schedule (the `optimizer:` section of a recipe)."""

    type: OptimizerType = field(default="adamw", metadata=on_resume(REFUSE))
    """Optimiser: "adamw" (torch.optim.AdamW) or "lamb" (albert_dist.engine.lamb, exact under ZeRO)."""
    lr: float = field(default=1e-3, metadata=on_resume(
        APPLIES, "uses the new peak lr from the next step (lr x lr_factor(step) of the current schedule)"))
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = field(default=0.01, metadata=on_resume(APPLIES))
    """Decoupled weight decay on weight matrices and embeddings (never on LayerNorm weights or biases)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=on_resume(APPLIES))
    """Adam (beta1, beta2): decay rates of the first and second moment estimates."""
    eps: float = field(default=1e-6, metadata=on_resume(APPLIES))
    """Adam epsilon added to the square root of the second moment (ALBERT/BERT: 1e-6)."""
    warmup_steps: int = field(default=0, metadata=_SCHEDULE)
    """Optimiser steps of linear warmup from 0 to lr (ALBERT: 3125); 0 with `warmup_ratio` set."""
    warmup_ratio: Optional[float] = field(default=None, metadata=_SCHEDULE)
    """Warmup as a fraction of max_steps, in [0, 1] (ALBERT: 3125 / 125000 = 0.025); rounded to whole steps.
    An alternative to warmup_steps, so that a short run (max_steps=5) of a recipe needs no second override."""
    decay: Decay = field(default="linear", metadata=_SCHEDULE)
    """Decay after warmup, to 0 at the last step: "linear" or "polynomial" (with `power`)."""
    power: float = field(default=1.0, metadata=_SCHEDULE)
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
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"optimizer.warmup_ratio must be in [0, 1] or null, got {self.warmup_ratio!r}")
        if self.warmup_ratio is not None and self.warmup_steps:
            raise ValueError(f"optimizer.warmup_steps ({self.warmup_steps}) and optimizer.warmup_ratio "
                             f"({self.warmup_ratio}) are both set: give one (the other 0 / null)")
        if self.decay not in DECAYS:
            raise ValueError(f"optimizer.decay must be one of {DECAYS}, got {self.decay!r}")
        if not self.power > 0.0:
            raise ValueError(f"optimizer.power must be > 0, got {self.power!r}")

    def warmup_steps_for(self, max_steps: int) -> int:
        """Warmup in optimiser steps for a run of `max_steps`: `warmup_steps`, or `warmup_ratio` x max_steps
        rounded to the nearest step (halves up; 0.025 x 125000 = 3125)."""
        if self.warmup_ratio is None:
            return self.warmup_steps
        return int(self.warmup_ratio * max_steps + 0.5)


#: What a failed checkpoint save does (`CheckpointConfig.on_save_error`).
SAVE_ERROR_POLICIES = ("fail", "continue")


@dataclass
class CheckpointConfig:
    """When and where checkpoints are written, how many are kept, and where training resumes from."""

    save_interval_steps: int = 100
    """Optimiser steps between two checkpoints (0: only the final one); one is always written at the end."""
    keep_last: int = 3
    """Number of newest complete checkpoints kept; older ones are deleted after a save completes (never the newest
    one known healthy: albert_dist.engine.divergence)."""
    dir: Optional[str] = None
    """Checkpoint directory; None: <run_dir>/checkpoints."""
    resume: Optional[str] = None
    """None: start fresh; "auto": the newest checkpoint in `dir` that verifies, if any; else a checkpoint directory or tag dir to resume from."""
    on_save_error: str = "fail"
    """A save that fails (disk full, any OS error): "fail" = exit with EXIT_SAVE_FAILED; "continue" = log it, keep training, retry at the next interval."""

    def directory(self, run_dir: Optional[str]) -> Optional[str]:
        """Where the job's checkpoints live: `dir`, else `<run_dir>/checkpoints`; None while the run directory
        is still to be chosen (`run_dir` None: the trainer picks runs/<recipe>-<time> once the ranks are up)."""
        if self.dir is not None:
            return self.dir
        return None if run_dir is None else f"{run_dir.rstrip('/')}/checkpoints"

    def __post_init__(self) -> None:
        if self.save_interval_steps < 0:
            raise ValueError(f"checkpoint.save_interval_steps must be >= 0, got {self.save_interval_steps!r}")
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last!r}")
        if self.dir is not None and not self.dir:
            raise ValueError("checkpoint.dir must be a non-empty path or null, got ''")
        if self.resume is not None and not self.resume:
            raise ValueError("checkpoint.resume must be 'auto', a path or null, got ''")
        if self.on_save_error not in SAVE_ERROR_POLICIES:
            raise ValueError(f"checkpoint.on_save_error must be one of {SAVE_ERROR_POLICIES}, got {self.on_save_error!r}")
