"""`AlbertConfig`: the model hyper-parameters, with transformers' field names plus the sharing mode."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, Optional, get_args

from albert_dist.on_resume import APPLIES, on_resume

#: Activations accepted in `hidden_act` (transformers' names). "gelu_new" and "gelu_pytorch_tanh" are both the
#: tanh approximation of GELU (Hendrycks & Gimpel 2016, eq. for the approximation) used by BERT/ALBERT.
Activation = Literal["gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)

#: Sharing modes, ALBERT paper (Lan et al. 2020) section 4.5 / Table 4; see `albert_dist.model.sharing`.
Sharing = Literal["all", "attention", "ffn", "none"]
SHARING_MODES: tuple[str, ...] = get_args(Sharing)


#: AlbertConfig fields that transformers' AlbertConfig has under the same name.
HF_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_hidden_groups",
             "inner_group_num", "num_attention_heads", "intermediate_size", "hidden_act", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size", "initializer_range",
             "layer_norm_eps")

#: Label value of positions / examples that take no part in a loss: the data pipeline writes it, the model's
#: losses skip it (transformers' convention, torch's cross_entropy default ignore_index).
IGNORE_INDEX = -100


@dataclass
class AlbertConfig:
    """ALBERT hyper-parameters (transformers' `AlbertConfig` field names) plus the cross-layer sharing mode.

    Defaults are ALBERT-base v2 (Lan et al. 2020, Table 1; dropout 0 as in the v2 release). Validation runs in
    `__post_init__` and raises `ValueError` naming the field and the value; the config is never mutated.
    """

    vocab_size: int = 30000
    """Size of the sentencepiece vocabulary V (must match the tokenizer)."""
    embedding_size: int = 128
    """Factorised embedding size E (ALBERT section 3.1); projected to hidden_size when E != H."""
    hidden_size: int = 768
    """Transformer hidden size H."""
    num_hidden_layers: int = 12
    """Number of layers L; the executed depth is L x inner_group_num blocks."""
    num_hidden_groups: int = 1
    """Number of groups G (1 <= G <= L); layer i uses group i * G // L."""
    inner_group_num: int = 1
    """Blocks per group K; every layer runs its group's K blocks in sequence."""
    num_attention_heads: int = 12
    """Attention heads; must divide hidden_size."""
    intermediate_size: int = 3072
    """Feed-forward inner size I."""
    hidden_act: Activation = "gelu_new"
    """Feed-forward and MLM-head activation, one of ACTIVATIONS."""
    hidden_dropout_prob: float = field(default=0.0, metadata=on_resume(APPLIES))
    """Dropout on embeddings and on the attention / feed-forward outputs, in [0, 1)."""
    attention_probs_dropout_prob: float = field(default=0.0, metadata=on_resume(APPLIES))
    """Dropout on the attention probabilities, in [0, 1)."""
    max_position_embeddings: int = 512
    """Number of learned absolute positions (maximum sequence length)."""
    type_vocab_size: int = 2
    """Number of token types (segment A / B)."""
    initializer_range: float = field(default=0.02, metadata=on_resume(
        APPLIES, "loads the checkpoint's weights: the initialiser range has no effect"))
    """Standard deviation of the normal weight initialisation (BERT/ALBERT)."""
    layer_norm_eps: float = field(default=1e-12, metadata=on_resume(APPLIES))
    """LayerNorm epsilon."""
    sharing: Sharing = "all"
    """Cross-layer sharing: "all" | "attention" | "ffn" | "none" (see albert_dist.model.sharing)."""
    gradient_checkpointing: bool = field(default=False, metadata=on_resume(APPLIES))
    """Recompute every executed block in backward (non-reentrant torch.utils.checkpoint)."""
    init_from: Optional[str] = field(default=None, metadata=on_resume(
        APPLIES, "loads its checkpoint's weights: init_from only chooses where a new run starts"))
    """A new run's starting weights: a transformers ALBERT directory, a run directory (its newest verified
    checkpoint, or its final model when that holds the same step), a checkpoint (``<run>/checkpoints/step_N``) or
    an MLflow run id (albert_dist.runs); its architecture and tokenizer unless the recipe sets them. None: random
    initialisation."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_hidden_groups",
                     "inner_group_num", "num_attention_heads", "intermediate_size", "max_position_embeddings",
                     "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be an integer >= 1, got {value!r}")
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ValueError(f"model.num_hidden_groups must be <= num_hidden_layers ({self.num_hidden_layers}), "
                             f"got {self.num_hidden_groups}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"model.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads, got {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"model.hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"model.sharing must be one of {SHARING_MODES}, got {self.sharing!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {value!r}")
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not value > 0.0:
                raise ValueError(f"model.{name} must be > 0, got {value!r}")
        if self.init_from is not None and not self.init_from.strip():
            raise ValueError("model.init_from must be a directory or an MLflow run id, or null; got ''")

    @property
    def head_dim(self) -> int:
        """Per-head size H / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_executed_blocks(self) -> int:
        """Executed depth L x inner_group_num (the blocks a forward pass runs)."""
        return self.num_hidden_layers * self.inner_group_num


#: AlbertConfig fields a `model.init_from` source's config gives a new run (the architecture); `init_from` and
#: `gradient_checkpointing` (how this run trains) are the recipe's.
ARCHITECTURE = tuple(f.name for f in fields(AlbertConfig) if f.name not in ("init_from", "gradient_checkpointing"))
