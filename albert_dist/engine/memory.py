"""Memory per device before the first step: model states for the ZeRO stage and world size, DeepSpeed's
gradient buckets, activations from the measured per-block formula; the memory line and the refusal (torch-free).

Every byte count below is what DeepSpeed 0.19 allocates for this project's client optimiser (torch AdamW or
LAMB, two fp32 moments per parameter), as `bench/memory_scale.py` measured it by walking the engine's tensors
on 1, 2 and 4 ranks (docs/scale.md has the figures), not the textbook ZeRO figures. Bytes per parameter on each
of N ranks:

=========  ======  ================================  =======================================  ==============
precision  stage   parameters                        gradients (at their peak)                optimiser
=========  ======  ================================  =======================================  ==============
fp32       1, 2    4 (the module's own, flat)        8/N (reduced partition + its flat copy)  4/N + 8/N
fp32       3       4/N + persistent tensors whole    8/N                                      4/N + 8/N
bf16       1       2                                 4 (fp32 accumulation, all) + 2           4/N + 8/N
bf16       2       2                                 4/N (fp32 partition)                     4/N + 8/N
bf16       3       2/N + persistent tensors whole    8/N                                      4/N + 8/N
=========  ======  ================================  =======================================  ==============

(optimiser: fp32 master partition + the two moments. "Persistent": ZeRO-3 keeps every tensor of at most
`stage3_param_persistence_threshold` elements (1e5) whole on every rank. ZeRO-0 is not measured: its row is
DeepSpeed's documented layout.) DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`: 2 + 18/N;
`estimate_zero3_model_states_mem_needs`: 4 x largest layer + 18/N) assume 16-bit parameters and gradients; they
leave out what is counted here as buffers:

* the gradient-reduction bucket, `reduce_bucket_size` elements (DeepSpeed's default 5e8: 2 GB in fp32 whatever
  the model's size) in the reduction dtype: fp32 at ZeRO-1/2 in fp32 and at ZeRO-3, the weights' dtype at
  bf16 ZeRO-2, none at bf16 ZeRO-1 (`BF16_Optimizer` reduces from its flat fp32 gradients); ZeRO-1/2 allocate it
  in every backward pass, ZeRO-3 once;
* ZeRO-3's gathered parameters: a module's whole parameters while it runs, kept gathered while reused within
  `stage3_max_reuse_distance` (1e9 elements by default: a shared ALBERT block stays gathered for the whole
  pass), at most `stage3_max_live_parameters` (1e9) elements; counted once, though a prefetching all-gather in
  flight holds its flat output beside the parameters it replaces (twice the set, measured for albert-large).

Activations (`activation_bytes`, per micro-batch of B sequences of S tokens, element size e of the precision)
count the tensors autograd saves in `albert_dist.model.albert`'s code, checked against torch's profiler on CPU
(bench/memory_scale.py): per executed block and token (8H + 2I)·e + (heads + 4)·4 without checkpointing (block
input, q, k, v, attention output, two LayerNorm inputs and one output, FFN input side and GELU output; the
attention kernels (flash on CPU, flash / memory-efficient on GPU) save a log-sum-exp per head, not the S x S
scores); H·e with checkpointing (the block input), plus one block's set while it is recomputed. The last
block runs queries and feed-forward only at the M masked positions + the first token; embeddings add
B·S·(2E·e + 8), the MLM head B·M·((H + 3E)·e + 4V) (its fp32 log-softmax). The backward pass adds the tied
decoder's V x E gradient (waiting for the embedding's), the buffer that sums a shared block's gradients across
its uses (one block's parameters), and one block's activation gradients.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from albert_dist.model.config import AlbertConfig
from albert_dist.model.sharing import block_parameter_counts, parameter_numels, shares_attention, shares_ffn

#: A whole job's config, `albert_dist.config.TrainConfig` (the app layer: not imported here, layers run down).
TrainConfig = Any

#: Bytes per element of the weights and activations of each `engine.precision`.
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: DeepSpeed 0.19's `zero_optimization` defaults the estimate uses when the config leaves them unset.
DEEPSPEED_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_param_persistence_threshold": 100_000,
                      "stage3_max_live_parameters": 1_000_000_000}
#: Share of a GPU's memory the estimate may fill: the CUDA context, NCCL buffers and the caching allocator's
#: fragmentation take the rest (a few GB on an 80 GB device).
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes per device (one rank) of one training step; `*_bytes` are bytes."""

    params_bytes: int = 0
    """Parameters this rank holds between steps (whole, partitioned, persistent)."""
    grads_bytes: int = 0
    """Gradients at their peak (the step's reduced partition, or all of them)."""
    optimizer_bytes: int = 0
    """fp32 master weights and the two Adam/LAMB moments this rank holds."""
    buffers_bytes: int = 0
    """DeepSpeed's gradient-reduction bucket(s)."""
    gathered_bytes: int = 0
    """ZeRO-3: whole parameters gathered during forward/backward (beyond this rank's partition)."""
    activations_bytes: int = 0
    """Peak of saved activations + backward temporaries for one micro-batch."""
    offloaded_bytes: int = 0
    """Host memory taken by ZeRO-Offload (not on the device, not in `total_bytes`)."""

    @property
    def model_states_bytes(self) -> int:
        """Parameters + gradients + optimiser states: what DeepSpeed's estimators count."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """Everything on the device: model states + buffers + gathered parameters + activations."""
        return self.model_states_bytes + self.buffers_bytes + self.gathered_bytes + self.activations_bytes

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "model_states_bytes": self.model_states_bytes, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes of one micro-batch: `retained_bytes` saved when the forward pass returns, and
    `peak_bytes` = retained + the backward pass's temporaries (its high-water mark)."""

    retained_bytes: int
    peak_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _zero_option(cfg: TrainConfig, name: str) -> int:
    value = getattr(cfg.engine.zero_optimization, name, None)
    return int(DEEPSPEED_DEFAULTS[name] if value is None else value)


def model_state_bytes(cfg: TrainConfig, world_size: int) -> MemoryEstimate:
    """Model states (parameters, gradients, optimiser), buffers and ZeRO-3's gathered parameters per rank for
    `cfg` on `world_size` ranks, per the table of the module docstring; activations 0 (`estimate` adds them).

    Raises `ValueError` for world_size < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    numels = parameter_numels(cfg.model)
    n = sum(numels)
    N = world_size
    stage, precision = cfg.engine.zero_stage, cfg.engine.precision
    w = ELEMENT_BYTES[precision]
    part = math.ceil(n / N)  # elements of one rank's partition (DeepSpeed pads to equal partitions)
    bucket = _zero_option(cfg, "reduce_bucket_size")
    offload_opt = cfg.engine.offload_optimizer.device != "none"
    offload_param = cfg.engine.offload_param.device != "none"
    gathered = buffers = 0
    if stage == 0:  # not measured by bench/memory_scale.py (the cells are ZeRO 1-3): DeepSpeed's layout
        params = w * n + (4 * n if w != 4 else 0)  # bf16 without ZeRO: an fp32 copy of every parameter
        grads = w * n
        optim = 8 * n
    elif stage in (1, 2):
        params = w * n
        if precision == "fp32":
            grads = 8 * part  # the reduced partition and its flattened copy the optimiser steps on
        elif stage == 1:
            grads = 4 * n + w * n  # BF16_Optimizer: fp32 accumulation of every gradient + the bf16 ones
        else:
            grads = 4 * part  # the fp32 partition (bf16 gradients live in the bucket)
        optim = 12 * part
        # the bucket holds the reduction dtype: fp32 at ZeRO-1 fp32, the weights' at ZeRO-2 (BF16_Optimizer,
        # i.e. bf16 at ZeRO-1, reduces from its fp32 flat gradients without one)
        buffers = 0 if (stage == 1 and precision != "fp32") else bucket * w
    else:
        threshold = _zero_option(cfg, "stage3_param_persistence_threshold")
        persistent = sum(x for x in numels if x <= threshold)
        params = w * part + w * persistent
        grads = 8 * part  # the fp32 gradient partition and its copy handed to the optimiser
        optim = 12 * part
        buffers = bucket * 4  # fp32 (the accumulation dtype), one bucket
        if N > 1:  # on one rank the gathered parameter is the partition itself
            gathered = w * min(n - persistent, _zero_option(cfg, "stage3_max_live_parameters"))
    offloaded = 0
    if offload_opt and stage >= 1:
        offloaded += optim
        optim = 0
    if offload_param and stage == 3:
        offloaded += params
        params = w * persistent
    return MemoryEstimate(params_bytes=params, grads_bytes=grads, optimizer_bytes=optim, buffers_bytes=buffers,
                          gathered_bytes=gathered, offloaded_bytes=offloaded)


def masked_positions(cfg: TrainConfig, seq_len: Optional[int] = None) -> int:
    """MLM predictions per sequence: min(max_predictions_per_seq, round(masked_lm_prob x S)), at least 1."""
    S = seq_len or cfg.data.max_seq_length
    return max(1, min(cfg.data.max_predictions_per_seq, round(cfg.data.masked_lm_prob * S)))


def activation_bytes(model: AlbertConfig, micro_batch: int, seq_len: int, precision: str = "fp32",
                     masked: Optional[int] = None, masked_fraction: float = 0.15) -> ActivationEstimate:
    """Activation bytes of one micro-batch of `micro_batch` sequences of `seq_len` tokens (module docstring).

    `masked`: MLM predictions per sequence (default round(masked_fraction x S), at least 1). Checkpointing is
    `model.gradient_checkpointing`. Raises `ValueError` for an unknown precision or sizes < 1.
    """
    if precision not in ELEMENT_BYTES:
        raise ValueError(f"precision must be one of {tuple(ELEMENT_BYTES)}, got {precision!r}")
    if micro_batch < 1 or seq_len < 1:
        raise ValueError(f"micro_batch and seq_len must be >= 1, got {micro_batch}, {seq_len}")
    e = ELEMENT_BYTES[precision]
    B, S = micro_batch, seq_len
    M = masked if masked is not None else max(1, round(masked_fraction * S))
    Nq = min(S, M + 1)  # positions the last block computes: the masked ones and the first token
    V, E, H, I = model.vocab_size, model.embedding_size, model.hidden_size, model.intermediate_size
    nh = model.num_attention_heads
    L = model.num_hidden_layers * model.inner_group_num
    block = 8 * H * e + 2 * I * e + (nh + 4) * 4  # per token; LayerNorm statistics and log-sum-exp stay fp32
    last_full = 3 * H * e  # the last block's input, keys and values cover all S positions
    last_query = block - 3 * H * e  # the rest of the last block, at the Nq positions only
    embeddings = B * S * (2 * E * e + 8)
    head = B * M * ((H + 3 * E) * e + V * 4)  # gathered hidden states, dense/GELU/LayerNorm, fp32 log-softmax
    if model.gradient_checkpointing:
        retained = B * S * H * e * L + embeddings + head
        recompute = B * S * block if L > 1 else B * (S * last_full + Nq * last_query)
    else:
        retained = B * ((L - 1) * S * block + S * last_full + Nq * last_query) + embeddings + head
        recompute = 0
    # Backward: the tied decoder's V x E gradient waits in autograd's buffer until the embedding's arrives;
    # a shared weight's gradients are summed across its uses in a buffer of its size (one group's blocks at a
    # time, plus the incoming copy of the largest); the gradients of one block's widest activations.
    attn, ffn = block_parameter_counts(model)
    K = model.inner_group_num
    shared = shares_attention(model.sharing) or shares_ffn(model.sharing)
    grad_buffers = (K * (attn + ffn) + max(attn, ffn)) * e if shared else (attn + ffn) * e
    head_phase = retained + V * E * e + 2 * B * M * V * 4
    block_phase = retained - head + V * E * e + grad_buffers + recompute + B * S * (I + H) * e
    embedding_phase = embeddings + 3 * V * E * e
    peak = max(head_phase, block_phase, embedding_phase)
    return ActivationEstimate(retained_bytes=int(retained), peak_bytes=int(peak))


def estimate(cfg: TrainConfig, world_size: int) -> MemoryEstimate:
    """Per-device bytes of `cfg` on `world_size` ranks: `model_state_bytes` + activations of one micro-batch
    (`engine.train_micro_batch_size_per_gpu` x `data.max_seq_length`, the run's precision)."""
    states = model_state_bytes(cfg, world_size)
    acts = activation_bytes(cfg.model, cfg.engine.train_micro_batch_size_per_gpu, cfg.data.max_seq_length,
                            cfg.engine.precision, masked=masked_positions(cfg))
    return replace(states, activations_bytes=acts.peak_bytes)


# ------------------------------------------------------------------------------------------- preflight
#: Environment variable that turns the refusal into a warning ("warn"): the estimate is DeepSpeed 0.19's
#: layout; another DeepSpeed version, or a kernel that saves more, can make it wrong either way.
CHECK_ENV = "ALBERT_DIST_MEMORY_CHECK"
#: Bucket size (elements) the advice proposes when DeepSpeed's 5e8 default would not fit.
SMALL_BUCKET = 50_000_000


def fmt_bytes(n: float) -> str:
    """Bytes as GiB (>= 1 GiB) or MiB, e.g. "2.34 GiB", "45.1 MiB"."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def describe(est: MemoryEstimate, cfg: TrainConfig, world_size: int) -> str:
    """The memory line: total per device and its parts, with the settings they follow from."""
    e = cfg.engine
    ckpt = "checkpointing" if cfg.model.gradient_checkpointing else "no checkpointing"
    parts = [f"model states {fmt_bytes(est.model_states_bytes)} (parameters {fmt_bytes(est.params_bytes)}, "
             f"gradients {fmt_bytes(est.grads_bytes)}, optimizer {fmt_bytes(est.optimizer_bytes)}; ZeRO-{e.zero_stage}, "
             f"{world_size} rank{'s' if world_size != 1 else ''}, {e.precision})"]
    if est.buffers_bytes:
        parts.append(f"gradient buckets {fmt_bytes(est.buffers_bytes)} (reduce_bucket_size "
                     f"{_zero_option(cfg, 'reduce_bucket_size'):.3g})")
    if est.gathered_bytes:
        parts.append(f"ZeRO-3 gathered parameters {fmt_bytes(est.gathered_bytes)}")
    parts.append(f"activations {fmt_bytes(est.activations_bytes)} (micro-batch {e.train_micro_batch_size_per_gpu} x "
                 f"{cfg.data.max_seq_length} tokens, {ckpt})")
    line = f"memory per device (estimate) {fmt_bytes(est.total_bytes)} = " + " + ".join(parts)
    if est.offloaded_bytes:
        line += f"; offloaded to host memory {fmt_bytes(est.offloaded_bytes)}"
    return line


def _parse(value: str):
    return {"true": True, "false": False}.get(value, int(value) if value.lstrip("-").isdigit() else value)


def _apply(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """A copy of `cfg` with dotted `key=value` overrides applied in order (dataclasses.replace, so every
    section validates again); only the int/bool/str values `candidate_changes` writes."""

    def put(obj, parts: list[str], value):
        if len(parts) == 1:
            return replace(obj, **{parts[0]: value})
        return replace(obj, **{parts[0]: put(getattr(obj, parts[0]), parts[1:], value)})

    for item in overrides:
        key, value = item.split("=", 1)
        cfg = put(cfg, key.split("."), _parse(value))
    return cfg


#: Micro-batch (sequences) below which halving it costs more than checkpointing: a GPU's matmuls shrink.
MIN_EFFICIENT_MICRO_BATCH = 8


def candidate_changes(cfg: TrainConfig) -> list[list[str]]:
    """Single changes that lower the per-device memory, cheapest (in throughput) first, as dotted overrides.

    A smaller gradient bucket (free); ZeRO-1 -> 2 (free); half the micro-batch with twice the accumulation
    (same global batch) down to `MIN_EFFICIENT_MICRO_BATCH`; ZeRO-3 (one all-gather of the parameters per
    step, small for shared ALBERT blocks, bench/zero.py); activation checkpointing (about 1/3 more compute);
    smaller micro-batches still; ZeRO-Offload of the optimizer, then of the parameters (host memory and PCIe
    traffic every step).
    """
    e = cfg.engine
    out: list[list[str]] = []
    if _zero_option(cfg, "reduce_bucket_size") > SMALL_BUCKET and e.zero_stage >= 1:
        out.append([f"engine.zero_optimization.reduce_bucket_size={SMALL_BUCKET}"])
    if e.zero_stage < 2:
        out.append(["engine.zero_stage=2"])
    halvings: list[list[str]] = []
    micro, ga = e.train_micro_batch_size_per_gpu, e.gradient_accumulation_steps
    while micro % 2 == 0:
        micro, ga = micro // 2, ga * 2
        halvings.append([f"engine.train_micro_batch_size_per_gpu={micro}", f"engine.gradient_accumulation_steps={ga}"])
    cheap = [h for h in halvings if int(h[0].split("=")[1]) >= MIN_EFFICIENT_MICRO_BATCH]
    out += cheap
    if e.zero_stage < 3:
        out.append(["engine.zero_stage=3"])
    if not cfg.model.gradient_checkpointing:
        out.append(["model.gradient_checkpointing=true"])
    out += halvings[len(cheap):]
    if e.offload_optimizer.device == "none":
        out.append(([] if e.zero_stage >= 1 else ["engine.zero_stage=1"]) + ["engine.offload_optimizer.device=cpu"])
    if e.offload_param.device == "none":
        out.append(["engine.zero_stage=3", "engine.offload_param.device=cpu"])
    return out


def smallest_fitting_change(cfg: TrainConfig, world_size: int,
                            usable_bytes: float) -> Optional[tuple[list[str], MemoryEstimate]]:
    """The first of `candidate_changes` whose estimate fits in `usable_bytes`; else the shortest run of them
    applied together (in that order) that fits; None when even all of them together do not fit."""
    candidates = candidate_changes(cfg)
    for change in candidates:
        est = estimate(_apply(cfg, change), world_size)
        if est.total_bytes <= usable_bytes:
            return change, est
    applied: list[list[str]] = []
    for change in candidates:
        # a later change of the same key (micro-batch halvings, stages) replaces the earlier one
        keys = {c.split("=")[0] for c in change}
        applied = [a for a in applied if not keys & {c.split("=")[0] for c in a}] + [change]
        est = estimate(_apply(cfg, [c for a in applied for c in a]), world_size)
        if est.total_bytes <= usable_bytes:
            # drop what is not needed, the costliest first
            for change_ in reversed(list(applied)):
                rest = [a for a in applied if a is not change_]
                trial = estimate(_apply(cfg, [c for a in rest for c in a]), world_size)
                if trial.total_bytes <= usable_bytes:
                    applied, est = rest, trial
            return [c for a in applied for c in a], est
    return None


def device_memory(local_rank: int) -> Optional[tuple[str, int]]:
    """(name, total bytes) of this rank's GPU, or None on a CPU-only machine (torch imported here, lazily)."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = local_rank % max(1, torch.cuda.device_count())
    props = torch.cuda.get_device_properties(index)
    return f"GPU {index} ({props.name})", int(props.total_memory)


def check_memory(cfg: TrainConfig, world_size: int, device: Optional[tuple[str, int]],
                 log: bool = True) -> MemoryEstimate:
    """The preflight memory check: log the memory line (when `log`), and on a GPU whose usable memory
    (`USABLE_FRACTION` of `device`'s bytes) the estimate exceeds, refuse with the smallest change that fits.

    `device`: (name, total bytes) of the accelerator (`device_memory`), None on CPU (only the line). With
    $ALBERT_DIST_MEMORY_CHECK=warn the refusal is logged as a warning instead.

    Raises:
        ValueError: the estimate exceeds the device (exit code 2 before any process group), naming the device,
            both byte counts and the smallest change (`smallest_fitting_change`) as dotted overrides.
    """
    import logging
    import os

    logger = logging.getLogger(__name__)
    est = estimate(cfg, world_size)
    usable = USABLE_FRACTION * device[1] if device is not None else float("inf")
    if est.total_bytes <= usable:
        if log:
            logger.info(describe(est, cfg, world_size))
        return est
    name, total = device
    found = smallest_fitting_change(cfg, world_size, usable)
    advice = (f"the smallest change that fits: {' '.join(found[0])} (estimate {fmt_bytes(found[1].total_bytes)})"
              if found else "no change this check knows fits: use more ranks (ZeRO-3 partitions the model states) "
                            "or a device with more memory")
    message = (f"{describe(est, cfg, world_size)}; this exceeds {USABLE_FRACTION:.0%} of the {fmt_bytes(total)} of "
               f"{name}: {advice}. ({CHECK_ENV}=warn starts anyway; docs/scale.md has the measured figures)")
    if os.environ.get(CHECK_ENV, "").lower() == "warn":
        if log:
            logger.warning(message)
        return est
    raise ValueError(message)


def preflight(cfg: TrainConfig, world_size: int, local_rank: int, log: bool = True) -> MemoryEstimate:
    """`check_memory` on this rank's device (`device_memory`): the app's one call before any process group.
    Raises `ValueError` (exit code 2) when the estimate exceeds the GPU; on CPU only logs the line."""
    return check_memory(cfg, world_size, device_memory(local_rank), log=log)
