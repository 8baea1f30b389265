"""ALBERT for sequence classification / regression on our encoder, for every sharing mode.

transformers' `AlbertForSequenceClassification` (modeling_albert.py) is the reference: the pooled output
(``tanh(pooler(h[:, 0]))``), dropout ``classifier_dropout_prob``, a ``classifier`` Linear H -> num_labels; the loss
is cross-entropy for ``num_labels > 1`` with integer labels and MSE on the squeezed logits for ``num_labels == 1``
(its ``problem_type`` "single_label_classification" / "regression"). Parameter names are transformers', so a
``sharing: all`` model loads the ``albert.*`` tensors of a pretraining checkpoint or of a transformers model one
to one; unlike transformers this class also holds the partial sharing modes (attention / ffn / none) that
albert_dist pretrains. Pure `nn.Module` code (no transformers import): `forward` returns a dict, which
transformers' Trainer reads like its own ``ModelOutput`` (``outputs["loss"]``, the other values as predictions).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from albert_dist.model.albert import AlbertModel, init_bert_weights
from albert_dist.model.config import AlbertConfig

#: transformers' AlbertConfig.classifier_dropout_prob default.
CLASSIFIER_DROPOUT_PROB = 0.1
#: Pretraining-only tensors a pretraining state dict holds that the classifier does not.
PRETRAINING_HEADS = ("predictions.", "sop_classifier.")


class AlbertForSequenceClassification(nn.Module):
    """Encoder + pooler, dropout, ``classifier`` Linear(H, num_labels).

    Args:
        config: the encoder's `AlbertConfig` (any sharing mode).
        num_labels: classes (>= 2), or 1 for regression (MSE).
        classifier_dropout_prob: dropout on the pooled output, in [0, 1) (transformers' default 0.1).

    Initialisation as `AlbertForPreTraining` (normal(0, initializer_range) weights, zero biases, unit LayerNorm):
    the encoder is usually overwritten by `load_encoder`, the classifier keeps it (transformers does the same).

    Raises:
        ValueError: num_labels < 1 or a dropout outside [0, 1).
    """

    def __init__(self, config: AlbertConfig, num_labels: int,
                 classifier_dropout_prob: float = CLASSIFIER_DROPOUT_PROB):
        super().__init__()
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(f"num_labels must be an integer >= 1, got {num_labels!r}")
        if not 0.0 <= classifier_dropout_prob < 1.0:
            raise ValueError(f"classifier_dropout_prob must be in [0, 1), got {classifier_dropout_prob!r}")
        self.config = config
        self.num_labels = num_labels
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_bert_weights(module, self.config.initializer_range)

    def load_encoder(self, state: dict[str, torch.Tensor]) -> None:
        """Copy the ``albert.*`` tensors of a pretraining state dict (`AlbertForPreTraining`'s names; the MLM and
        SOP heads are dropped) into the encoder, strictly.

        Raises:
            ValueError: an encoder tensor missing, unexpected or of another shape (e.g. another sharing mode or
                size): names the first keys.
        """
        encoder = {k[len("albert."):]: v for k, v in state.items() if k.startswith("albert.")}
        other = [k for k in state if not k.startswith(("albert.", *PRETRAINING_HEADS))]
        expected = self.albert.state_dict()
        shapes = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
                  for k, v in encoder.items() if k in expected and v.shape != expected[k].shape]
        missing = sorted(set(expected) - set(encoder))
        unexpected = sorted(set(encoder) - set(expected)) + other
        if shapes or missing or unexpected:
            raise ValueError(f"checkpoint does not match the model config: shapes {shapes[:3]}, "
                             f"missing {['albert.' + k for k in missing[:5]]}, unexpected {unexpected[:5]}")
        self.albert.load_state_dict(encoder, strict=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """Logits and, with `labels`, the loss.

        Args:
            input_ids, attention_mask (1 = token, 0 = padding), token_type_ids (None = all 0): (B, S) int64.
            labels: (B,) int64 class ids (num_labels > 1) or (B,) float targets (num_labels == 1).

        Returns:
            ``{"logits": (B, num_labels) float}`` plus ``"loss"`` (fp32 scalar: mean cross-entropy, or the mean
            squared error of ``logits.squeeze(-1)``) when labels are given; ``"loss"`` comes first, as the
            Trainer reads it.
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        _, pooled = self.albert(input_ids, attention_mask, token_type_ids)  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        if labels is None:
            return {"logits": logits}
        if self.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
        else:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1).long())
        return {"loss": loss, "logits": logits}
