"""Memory per device before the first step: model states for the ZeRO stage and world size, DeepSpeed's
gradient buckets, activations from the measured per-block formula; the memory line (torch-free). The refusal
of a job that does not fit, with the smallest change that does, is the preflight's (`albert_dist.apps.pretrain.preflight`).

Every byte count below is what DeepSpeed 0.19 allocates for this project's client optimiser (torch AdamW or
LAMB, two fp32 moments per parameter), as `bench/memory_scale.py` measured it by walking the engine's tensors
on 1, 2 and 4 ranks (docs/scale-memory.md has the figures), not the textbook ZeRO figures. Bytes per parameter on each
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

* the gradient-reduction bucket, `reduce_bucket_size` elements (unset: scaled to the model,
  `deepspeed_config.model_bucket_size`, where DeepSpeed's 5e8 default is 2 GB in fp32 whatever the model's size)
  in the reduction dtype: fp32 at ZeRO-1/2 in fp32 and at ZeRO-3, the weights' dtype at
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
from typing import Optional

from albert_dist.data.config import DataConfig, masking_budget
from albert_dist.sizes import fmt_bytes
from albert_dist.engine.config import EngineConfig
from albert_dist.engine.deepspeed_config import bucket_defaults
from albert_dist.model.config import AlbertConfig
from albert_dist.model.sharing import block_parameter_counts, parameter_numels, shares_attention, shares_ffn

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


def zero_option(engine: EngineConfig, name: str, model: Optional[AlbertConfig] = None) -> int:
    """`engine.zero_optimization.<name>` (a field or an `extra` option); when unset, the bucket size the DeepSpeed
    config gets for `model` (`deepspeed_config.bucket_defaults`), else DeepSpeed's default (`DEEPSPEED_DEFAULTS`)."""
    value = engine.zero_optimization.to_dict().get(name)
    if value is None and model is not None:
        value = bucket_defaults(model, engine.zero_stage).get(name)
    return int(DEEPSPEED_DEFAULTS[name] if value is None else value)


def model_state_bytes(model: AlbertConfig, engine: EngineConfig, world_size: int) -> MemoryEstimate:
    """Model states (parameters, gradients, optimiser), buffers and ZeRO-3's gathered parameters per rank for
    `model` trained with `engine` on `world_size` ranks, per the table of the module docstring; activations 0
    (`estimate` adds them).

    Raises `ValueError` for world_size < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    numels = parameter_numels(model)
    n = sum(numels)
    N = world_size
    stage, precision = engine.zero_stage, engine.precision
    w = ELEMENT_BYTES[precision]
    part = math.ceil(n / N)  # elements of one rank's partition (DeepSpeed pads to equal partitions)
    bucket = zero_option(engine, "reduce_bucket_size", model)
    offload_opt = engine.offload_optimizer.device != "none"
    offload_param = engine.offload_param.device != "none"
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
        threshold = zero_option(engine, "stage3_param_persistence_threshold")
        persistent = sum(x for x in numels if x <= threshold)
        params = w * part + w * persistent
        grads = 8 * part  # the fp32 gradient partition and its copy handed to the optimiser
        optim = 12 * part
        buffers = bucket * 4  # fp32 (the accumulation dtype), one bucket
        if N > 1:  # on one rank the gathered parameter is the partition itself
            gathered = w * min(n - persistent, zero_option(engine, "stage3_max_live_parameters"))
    offloaded = 0
    if offload_opt and stage >= 1:
        offloaded += optim
        optim = 0
    if offload_param and stage == 3:
        offloaded += params
        params = w * persistent
    return MemoryEstimate(params_bytes=params, grads_bytes=grads, optimizer_bytes=optim, buffers_bytes=buffers,
                          gathered_bytes=gathered, offloaded_bytes=offloaded)


def masked_positions(data: DataConfig, seq_len: Optional[int] = None) -> int:
    """MLM predictions in a full row of `seq_len` tokens (default `data.max_seq_length`): the pipeline's
    `masking_budget` of its S - 3 maskable tokens at `masked_lm_prob`, capped at `max_predictions_per_seq`."""
    S = seq_len or data.max_seq_length
    return masking_budget(S - 3, data.masked_lm_prob, data.max_predictions_per_seq)


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


def estimate(model: AlbertConfig, data: DataConfig, engine: EngineConfig, world_size: int) -> MemoryEstimate:
    """Per-device bytes of a job (its config's `model`, `data` and `engine` sections) on `world_size` ranks:
    `model_state_bytes` + activations of one micro-batch (`engine.train_micro_batch_size_per_gpu` x
    `data.max_seq_length`, the run's precision)."""
    states = model_state_bytes(model, engine, world_size)
    acts = activation_bytes(model, engine.train_micro_batch_size_per_gpu, data.max_seq_length, engine.precision,
                            masked=masked_positions(data))
    return replace(states, activations_bytes=acts.peak_bytes)


def describe(est: MemoryEstimate, model: AlbertConfig, data: DataConfig, engine: EngineConfig,
             world_size: int) -> str:
    """The memory line: total per device and its parts, with the settings they follow from."""
    e = engine
    ckpt = "checkpointing" if model.gradient_checkpointing else "no checkpointing"
    parts = [f"model states {fmt_bytes(est.model_states_bytes)} (parameters {fmt_bytes(est.params_bytes)}, "
             f"gradients {fmt_bytes(est.grads_bytes)}, optimizer {fmt_bytes(est.optimizer_bytes)}; ZeRO-{e.zero_stage}, "
             f"{world_size} rank{'s' if world_size != 1 else ''}, {e.precision})"]
    if est.buffers_bytes:
        parts.append(f"gradient buckets {fmt_bytes(est.buffers_bytes)} (reduce_bucket_size "
                     f"{zero_option(e, 'reduce_bucket_size', model):.3g})")
    if est.gathered_bytes:
        parts.append(f"ZeRO-3 gathered parameters {fmt_bytes(est.gathered_bytes)}")
    parts.append(f"activations {fmt_bytes(est.activations_bytes)} (micro-batch {e.train_micro_batch_size_per_gpu} x "
                 f"{data.max_seq_length} tokens, {ckpt})")
    line = f"memory per device (estimate) {fmt_bytes(est.total_bytes)} = " + " + ".join(parts)
    if est.offloaded_bytes:
        line += f"; offloaded to host memory {fmt_bytes(est.offloaded_bytes)}"
    return line


def device_memory(local_rank: int) -> Optional[tuple[str, int]]:
    """(name, total bytes) of this rank's GPU, or None on a CPU-only machine (torch imported here, lazily)."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = local_rank % max(1, torch.cuda.device_count())
    props = torch.cuda.get_device_properties(index)
    return f"GPU {index} ({props.name})", int(props.total_memory)
