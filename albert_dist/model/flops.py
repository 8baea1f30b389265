"""Model FLOPs per token, for MFU (matmul FLOPs only, 2 per multiply-add; Kaplan et al. 2020 section 2.1).

`pretraining_flops_per_sequence` counts what `AlbertForPreTraining.forward` runs (the trainer's and
bench/gpu_step.py's MFU); the per-token counts are the dense encoder's (every position through every block).

Sharing does not change the compute: a shared block still runs once per executed block, so the counts use
the executed depth L x inner_group_num. Backward costs twice the forward (input and weight gradients), so
training = 3 x forward; activation recomputation is *not* counted (MFU counts model FLOPs, not hardware
FLOPs; Chowdhery et al. 2022, appendix B).
"""
from __future__ import annotations

from albert_dist.model.config import AlbertConfig


def forward_flops_per_token(config: AlbertConfig, seq_len: int) -> float:
    """Forward matmul FLOPs per token of the E->H projection and the L x K executed blocks.

    Per block: Q, K, V and output projections 8H^2, attention scores and context 4 S H, feed-forward 4 H I.
    The projection (2 E H) is counted only when E != H (otherwise there is none). Raises `ValueError` when
    `seq_len` < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    H, E, I = config.hidden_size, config.embedding_size, config.intermediate_size
    block = 8 * H * H + 4 * seq_len * H + 4 * H * I
    projection = 2 * E * H if E != H else 0
    return float(projection + config.num_executed_blocks * block)


def training_flops_per_token(config: AlbertConfig, seq_len: int) -> float:
    """Forward + backward model FLOPs per token of the executed blocks (+ projection): 3 x forward."""
    return 3.0 * forward_flops_per_token(config, seq_len)


def mlm_head_training_flops_per_prediction(config: AlbertConfig) -> float:
    """Forward + backward FLOPs of the MLM head per *labelled* position: 3 x (2 H E + 2 E V)."""
    return 3.0 * (2 * config.hidden_size * config.embedding_size + 2 * config.embedding_size * config.vocab_size)


def pretraining_flops_per_sequence(config: AlbertConfig, seq_len: int, max_predictions_per_seq: int,
                                   training: bool = True) -> float:
    """Matmul FLOPs of `AlbertForPreTraining.forward` (x 3 with `training`: + backward) for one row of `seq_len`
    positions, with the model's static gather of N = min(`max_predictions_per_seq` + 1, `seq_len`) slots.

    What the model computes: the projection and the first L x K - 1 blocks on all S positions; the last block
    only its keys and values on S positions and its queries, attention output (N x S scores) and feed-forward on
    the N slots; the MLM head (2 H E + 2 E V) on every slot; the pooler (2 H^2) and SOP classifier (4 H) once.
    Raises `ValueError` when `seq_len` < 1 or `max_predictions_per_seq` < 1.
    """
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    S = seq_len
    dense = forward_flops_per_token(config, S) * S  # validates seq_len
    H, E, I, V = config.hidden_size, config.embedding_size, config.intermediate_size, config.vocab_size
    N = min(max_predictions_per_seq + 1, S)
    full_block = (8 * H * H + 4 * S * H + 4 * H * I) * S
    last_block = 4 * H * H * S + 4 * H * H * N + 4 * N * S * H + 4 * H * I * N
    forward = dense - full_block + last_block + N * (2 * H * E + 2 * E * V) + 2 * H * H + 4 * H
    return float(3 * forward if training else forward)
