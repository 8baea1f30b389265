"""ALBERT for pretraining (MLM + SOP) with grouped cross-layer sharing; reads top to bottom.

Lan et al. 2020, "ALBERT: A Lite BERT for Self-supervised Learning of Language Representations": factorised
embeddings (section 3.1), cross-layer sharing (3.1, Table 4) and sentence-order prediction (3.2). Parameter
names follow transformers' `AlbertForPreTraining` (see `albert_dist.model.sharing` for the storage layout of
each sharing mode). Pure `nn.Module` code: no DeepSpeed, no torch.distributed. Every parameter is used only
through a call of the module that owns it (no reaching into a child's `.weight`), which ZeRO-3's
gather-on-forward hooks rely on; the tied MLM decoder is an `nn.Linear` whose weight *is* the word-embedding
Parameter, as in transformers.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from albert_dist.model.config import IGNORE_INDEX, AlbertConfig
from albert_dist.model.sharing import executed_blocks, shares_attention, shares_ffn


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """Tanh-approximate GELU (transformers' "gelu_new"), as one fused kernel."""
    return F.gelu(x, approximate="tanh")


def activation(name: str):
    """The activation function for `hidden_act` (fused PyTorch kernels; "gelu_new" == tanh-approximate GELU)."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return gelu_tanh
    if name == "gelu":
        return F.gelu
    if name == "relu":
        return F.relu
    if name == "silu":
        return F.silu
    raise ValueError(f"model.hidden_act: unknown activation {name!r}")


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT/ALBERT initialisation of one module (``model.apply``): Linear and Embedding weights ~ normal(0, std),
    biases 0, LayerNorm weight 1 and bias 0; other modules untouched."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class PreTrainingOutput(NamedTuple):
    """Losses, loss sums and accuracy counts of one forward pass.

    A `NamedTuple`, not a dataclass: DeepSpeed finds the output tensors to hook by walking tensors, tuples,
    lists and dicts only (0.19.8 `runtime/utils.py::OutputBackwardHookManager._traverse_and_register_hooks`,
    and ZeRO-3's `runtime/zero/utils.py::apply_to_tensors_only`, which rebuilds namedtuples). Without those
    hooks `engine._backward_prologue()` never runs: bf16 at ZeRO-1 (BF16_Optimizer) then never clears its
    bf16 gradients between micro-steps and accumulates 3 g1 + 2 g2 + g3 at GA 3
    (tests/distributed/test_grad_matrix.py counts the prologue calls in every cell).

    `loss = mlm_loss + sop_loss`; each loss is the mean cross-entropy over its labelled positions / examples
    of this micro-batch (fp32 scalars; 0 when nothing is labelled). The sums let the trainer normalise over a
    whole optimiser step instead (`albert_dist.engine.loss.micro_step_loss`). Counts are int64 scalars, so
    losses and accuracies can be summed over micro-steps and ranks before dividing.
    """

    loss: torch.Tensor
    """MLM + SOP loss, fp32 scalar (per-micro-batch means)."""
    mlm_loss: torch.Tensor
    """Mean MLM cross-entropy over positions with a label != -100, fp32 scalar (nats)."""
    sop_loss: torch.Tensor
    """Mean SOP cross-entropy over examples with a label != -100, fp32 scalar (nats)."""
    mlm_correct: torch.Tensor
    """Labelled positions whose argmax prediction equals the label, int64 scalar."""
    mlm_count: torch.Tensor
    """Labelled MLM positions, int64 scalar."""
    sop_correct: torch.Tensor
    """Examples whose SOP argmax equals the label, int64 scalar."""
    sop_count: torch.Tensor
    """Labelled SOP examples, int64 scalar."""
    mlm_loss_sum: torch.Tensor
    """Sum of the MLM cross-entropy over the labelled positions, fp32 scalar (nats)."""
    sop_loss_sum: torch.Tensor
    """Sum of the SOP cross-entropy over the labelled examples, fp32 scalar (nats)."""
    mlm_dropped: torch.Tensor
    """Labelled MLM positions beyond the model's `max_predictions_per_seq` slots of their row, which no loss
    saw, int64 scalar (0 from the data pipeline, whose masking is capped at the same number)."""


class AlbertEmbeddings(nn.Module):
    """Word + position + token-type embeddings of size E, then LayerNorm and dropout."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        E = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, E)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) int64 ids and token types -> (B, S, E) embeddings."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)  # broadcast over B
        return self.dropout(self.LayerNorm(x))


class AlbertAttention(nn.Module):
    """Post-LN multi-head self-attention sub-block: ``LayerNorm(x + dropout(dense(SDPA(q, k, v))))``."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.attention_dropout_p = config.attention_probs_dropout_prob
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.dense = nn.Linear(H, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None,
                query_positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, H); key_mask (B, 1, 1, S) bool, True = attend to that key, or None -> (B, S, H).

        With `query_positions` (B, N) int64, only those positions are computed (as queries and residual
        stream; keys and values still cover all S positions) and the output is (B, N, H).
        """
        B, S, H = x.shape
        xq = x if query_positions is None else x.gather(1, query_positions[..., None].expand(-1, -1, H))
        N = xq.shape[1]
        q = self.query(xq).view(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, N, hd)
        k = self.key(x).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, S, hd)
        v = self.value(x).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        dropout_p = self.attention_dropout_p if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)  # (B, nh, N, hd)
        ctx = ctx.transpose(1, 2).reshape(B, N, H)
        return self.LayerNorm(xq + self.output_dropout(self.dense(ctx)))


class AlbertLayer(nn.Module):
    """One ALBERT block's parameters; holds the attention and/or the feed-forward sub-block.

    With `sharing="all"` every `AlbertLayer` holds both (transformers' layout); in the partial modes a
    shared `AlbertLayer` holds one sub-block and each executed block's own `AlbertLayer` the other.
    """

    def __init__(self, config: AlbertConfig, with_attention: bool = True, with_ffn: bool = True):
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        if with_attention:
            self.attention = AlbertAttention(config)
        if with_ffn:
            self.ffn = nn.Linear(H, I)
            self.ffn_output = nn.Linear(I, H)
            self.full_layer_layer_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
            self.act = activation(config.hidden_act)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """Post-LN feed-forward sub-block, (B, S, H) -> (B, S, H).

        Dropout on the FFN output follows the original ALBERT code (transformers omits it; identical in eval).
        """
        return self.full_layer_layer_norm(h + self.dropout(self.ffn_output(self.act(self.ffn(h)))))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """A whole block (needs both sub-blocks): (B, S, H) -> (B, S, H)."""
        return self.feed_forward(self.attention(x, key_mask))


class AlbertLayerGroup(nn.Module):
    """The K = inner_group_num shared blocks of one group (transformers' name)."""

    def __init__(self, config: AlbertConfig, with_attention: bool, with_ffn: bool):
        super().__init__()
        self.albert_layers = nn.ModuleList(
            AlbertLayer(config, with_attention, with_ffn) for _ in range(config.inner_group_num))


def _run_block(attention: AlbertAttention, ffn_owner: AlbertLayer, x: torch.Tensor,
               key_mask: torch.Tensor | None, query_positions: torch.Tensor | None) -> torch.Tensor:
    return ffn_owner.feed_forward(attention(x, key_mask, query_positions))


class AlbertTransformer(nn.Module):
    """E->H projection, then the L x K executed blocks, each taking its sub-blocks from the sharing plan."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.gradient_checkpointing = config.gradient_checkpointing
        self.share_attention = shares_attention(config.sharing)
        self.share_ffn = shares_ffn(config.sharing)
        # The original ALBERT code projects only when E != H (which also matches Table 4's E=768 counts).
        if config.embedding_size != config.hidden_size:
            self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        else:
            self.embedding_hidden_mapping_in = nn.Identity()
        any_shared = self.share_attention or self.share_ffn
        self.albert_layer_groups = nn.ModuleList(
            AlbertLayerGroup(config, self.share_attention, self.share_ffn)
            for _ in range(config.num_hidden_groups if any_shared else 0))
        # Executed block k = i * K + j owns whatever is not shared.
        all_shared = self.share_attention and self.share_ffn
        self.blocks = nn.ModuleList(
            AlbertLayer(config, not self.share_attention, not self.share_ffn)
            for _ in range(0 if all_shared else config.num_executed_blocks))
        self.plan = executed_blocks(config)
        # What runs one executed block: `_run_block`, or a compiled version of it (albert_dist.engine.compile
        # compiles it once; every block of a sharing mode has the same structure, so one graph serves all).
        self.run_block = _run_block

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None,
                output_positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, E) embeddings; key_mask (B, 1, 1, S) bool or None -> (B, S, H).

        With `output_positions` (B, N) int64 the result is (B, N, H), the hidden states at those positions
        only: the last executed block then computes queries, attention output and feed-forward just there.
        Earlier blocks need every position (as keys and values of the next block), the last one does not.
        """
        h = self.embedding_hidden_mapping_in(x)
        last = len(self.plan) - 1
        for n, (k, g, j) in enumerate(self.plan):
            shared = self.albert_layer_groups[g].albert_layers[j] if self.albert_layer_groups else None
            attention = (shared if self.share_attention else self.blocks[k]).attention
            ffn_owner = shared if self.share_ffn else self.blocks[k]
            positions = output_positions if n == last else None
            if self.gradient_checkpointing and torch.is_grad_enabled():
                # Non-reentrant: the reentrant variant breaks ZeRO-2/3 when a module runs several times.
                h = checkpoint(self.run_block, attention, ffn_owner, h, key_mask, positions, use_reentrant=False)
            else:
                h = self.run_block(attention, ffn_owner, h, key_mask, positions)
        return h


class AlbertModel(nn.Module):
    """Embeddings + encoder + pooler (dense + tanh on the first token)."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.embeddings = AlbertEmbeddings(config)
        self.encoder = AlbertTransformer(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor,
                output_positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) int64 inputs -> sequence output (B, S, H) and pooled output (B, H).

        `attention_mask` None: no padding, attention runs without a mask (the form FlashAttention takes; equal
        to an all-ones mask). `output_positions` (B, N) int64 with ``output_positions[:, 0] == 0`` (the pooled
        first token) restricts the sequence output to those positions, (B, N, H); see `AlbertTransformer.forward`.
        """
        # (B, 1, 1, S), True = real token; None: every token is real
        key_mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        seq = self.encoder(self.embeddings(input_ids, token_type_ids), key_mask, output_positions)
        pooled = torch.tanh(self.pooler(seq[:, 0]))
        return seq, pooled


class AlbertMLMHead(nn.Module):
    """dense H->E, activation, LayerNorm, decoder E->V tied to the word embeddings, own bias."""

    def __init__(self, config: AlbertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        E, V = config.embedding_size, config.vocab_size
        self.dense = nn.Linear(config.hidden_size, E)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(E, V, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one Parameter, two owners
        self.bias = nn.Parameter(torch.zeros(V))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., H) -> logits (..., V)."""
        return self.decoder(self.LayerNorm(self.act(self.dense(h)))) + self.bias


class AlbertSOPHead(nn.Module):
    """Sentence-order classifier on the pooled output (no dropout, as in the original pretraining code)."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled (B, H) -> logits (B, 2)."""
        return self.classifier(pooled)


class AlbertForPreTraining(nn.Module):
    """ALBERT with the MLM and SOP heads; `forward` returns losses and accuracy counts.

    Initialisation as BERT/ALBERT: weights ~ normal(0, initializer_range), biases 0, LayerNorm weight 1 and
    bias 0. Unlike transformers no padding row is zeroed (the original ALBERT code has none either).

    `max_predictions_per_seq` (the data pipeline's cap, `data.max_predictions_per_seq`) fixes how many labelled
    positions per row `forward` carries through the last block and the MLM head: P + 1 per row (the first
    token for SOP), padded, so every micro-batch of a run has the same shapes and no host sync (ALBERT's TF
    code pads `masked_lm_positions` to the same P). None: the longest row of each batch decides (a host sync
    and a new shape per batch). A plain attribute: it holds no parameter and changes no state dict.
    """

    def __init__(self, config: AlbertConfig, max_predictions_per_seq: Optional[int] = None):
        super().__init__()
        if max_predictions_per_seq is not None and (isinstance(max_predictions_per_seq, bool)
                                                    or not isinstance(max_predictions_per_seq, int)
                                                    or max_predictions_per_seq < 1):
            raise ValueError(f"max_predictions_per_seq must be an integer >= 1 or None, got {max_predictions_per_seq!r}")
        self.config = config
        self.max_predictions_per_seq = max_predictions_per_seq
        self.albert = AlbertModel(config)
        self.predictions = AlbertMLMHead(config, self.albert.embeddings.word_embeddings)
        self.sop_classifier = AlbertSOPHead(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_bert_weights(module, self.config.initializer_range)
        if isinstance(module, AlbertMLMHead):
            nn.init.zeros_(module.bias)

    def _check_inputs(self, input_ids: torch.Tensor, **same_shape: torch.Tensor | None) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, S), got shape {tuple(input_ids.shape)}")
        for name, tensor in same_shape.items():
            if tensor is not None and tensor.shape != input_ids.shape:
                raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(tensor.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds model.max_position_embeddings="
                             f"{self.config.max_position_embeddings}")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor,
                mlm_labels: torch.Tensor, sop_labels: torch.Tensor) -> PreTrainingOutput:
        """Pretraining losses.

        Args: `input_ids`, `attention_mask` (1 = token, 0 = padding; None = no padding, attention without a
        mask), `token_type_ids`, `mlm_labels` (-100 = not predicted): (B, S) int64; `sop_labels` (B,) int64
        (0 = in order, 1 = swapped, -100 = ignore).
        Only the labelled positions and the first token are computed past the last block's keys and values,
        and the MLM head runs only there: the loss equals the one computed from full (B, S, V) logits at a
        fraction of the head's and the last block's cost. With `max_predictions_per_seq` = P the gather has
        the static shape (B, min(P + 1, S)) (no host sync); a row with more than P labelled positions keeps
        its first P and counts the rest in `mlm_dropped` (the data pipeline never makes one: its masking
        budget is capped at P). Without P the gather is padded to the batch's longest row (one host sync).
        Raises `ValueError` on inconsistent shapes or S > max_position_embeddings.
        """
        self._check_inputs(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           mlm_labels=mlm_labels)
        if sop_labels.shape != input_ids.shape[:1]:
            raise ValueError(f"sop_labels must be (B,) = {tuple(input_ids.shape[:1])}, got {tuple(sop_labels.shape)}")
        # Only the labelled positions and the first token (pooled for SOP) leave the encoder: gather their
        # indices, labelled ones in order after position 0, padded per row to N slots.
        labelled = mlm_labels != IGNORE_INDEX  # (B, S)
        needed = labelled.clone()
        needed[:, 0] = True
        counts = needed.sum(1)  # (B,)
        if self.max_predictions_per_seq is None:
            n_slots = int(counts.max())  # data-dependent size: one host sync on GPU
        else:
            n_slots = min(self.max_predictions_per_seq + 1, input_ids.shape[1])
        positions = torch.sort((~needed).to(torch.int8), dim=1, stable=True).indices[:, :n_slots]  # (B, N)
        seq, pooled = self.albert(input_ids, attention_mask, token_type_ids, positions)  # (B, N, H), (B, H)
        valid = torch.arange(n_slots, device=counts.device)[None, :] < counts[:, None]  # (B, N)
        picked = mlm_labels.gather(1, positions)
        mlm_count = labelled.sum()
        if self.max_predictions_per_seq is None:
            picked_labelled = valid & (picked != IGNORE_INDEX)
            targets = picked[picked_labelled]  # (M,) the M labelled positions
            mlm_logits = self.predictions(seq[picked_labelled]).float()  # (M, V)
            mlm_correct = (mlm_logits.argmax(-1) == targets).sum()
            mlm_dropped = torch.zeros_like(mlm_count)
        else:
            # Every slot goes through the head; unlabelled ones (the first token, padding slots) are ignored.
            targets = torch.where(valid, picked, IGNORE_INDEX).flatten()  # (B*N,)
            mlm_logits = self.predictions(seq.flatten(0, 1)).float()  # (B*N, V)
            mlm_correct = ((mlm_logits.argmax(-1) == targets) & (targets != IGNORE_INDEX)).sum()
            mlm_dropped = (counts - n_slots).clamp(min=0).sum()
        mlm_loss_sum = F.cross_entropy(mlm_logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        mlm_loss = mlm_loss_sum / mlm_count.clamp(min=1)

        sop_logits = self.sop_classifier(pooled).float()  # (B, 2)
        sop_valid = sop_labels != IGNORE_INDEX
        sop_count = sop_valid.sum()
        sop_loss_sum = F.cross_entropy(sop_logits, sop_labels, reduction="sum")
        sop_loss = sop_loss_sum / sop_count.clamp(min=1)
        sop_correct = ((sop_logits.argmax(-1) == sop_labels) & sop_valid).sum()

        return PreTrainingOutput(loss=mlm_loss + sop_loss, mlm_loss=mlm_loss, sop_loss=sop_loss,
                                 mlm_correct=mlm_correct, mlm_count=mlm_count,
                                 sop_correct=sop_correct, sop_count=sop_count,
                                 mlm_loss_sum=mlm_loss_sum, sop_loss_sum=sop_loss_sum, mlm_dropped=mlm_dropped)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full MLM logits (B, S, V) and SOP logits (B, 2), in the parameters' dtype (for tests and export).

        Raises `ValueError` on inconsistent shapes.
        """
        self._check_inputs(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        seq, pooled = self.albert(input_ids, attention_mask, token_type_ids)
        return self.predictions(seq), self.sop_classifier(pooled)
