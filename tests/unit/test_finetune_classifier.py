"""`AlbertForSequenceClassification` (ours, every sharing mode) against transformers' class of the same name:
the same weights give the same logits, loss and gradients (classification and regression, padded batches)."""
from __future__ import annotations

import pytest
import torch

from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.classifier import AlbertForSequenceClassification
from albert_dist.model.config import AlbertConfig
from albert_dist.model.hf import hf_config, to_transformers

transformers = pytest.importorskip("transformers")


def _config(**kw) -> AlbertConfig:
    fields = dict(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_hidden_groups=1,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=24)
    return AlbertConfig(**{**fields, **kw})


def _batch(num_labels: int):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 50, (4, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padded rows: the key mask must match transformers'
    mask[3, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    labels = torch.randn(4, generator=gen) * 2 if num_labels == 1 else torch.tensor([0, 2, 1, 2]) % num_labels
    return ids, mask, types, labels


@pytest.mark.parametrize("num_labels, embedding_size", [(3, 16), (1, 16), (2, 32)])
def test_logits_loss_and_gradients_equal_transformers(num_labels, embedding_size):
    torch.manual_seed(0)
    config = _config(embedding_size=embedding_size)
    pre = AlbertForPreTraining(config)
    ours = AlbertForSequenceClassification(config, num_labels)
    ours.load_encoder(pre.state_dict())
    hc = hf_config(config)
    hc.num_labels = num_labels
    theirs = transformers.AlbertForSequenceClassification(hc)
    state = {k: v for k, v in to_transformers(pre).state_dict().items() if k.startswith("albert.")}
    state.update({f"classifier.{k}": v.clone() for k, v in ours.classifier.state_dict().items()})
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    ours.eval(), theirs.eval()  # dropout off in both: the comparison is exact up to fp32 rounding

    ids, mask, types, labels = _batch(num_labels)
    out = ours(ids, mask, types, labels=labels)
    ref = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    torch.testing.assert_close(out["logits"], ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["loss"], ref.loss, rtol=1e-5, atol=1e-6)
    out["loss"].backward()
    ref.loss.backward()
    theirs_grads = dict(theirs.named_parameters())
    compared = 0
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, theirs_grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
        compared += 1
    assert compared == len(list(ours.parameters())) and compared > 20


@pytest.mark.parametrize("sharing", ["attention", "ffn", "none"])
def test_partial_sharing_modes_load_their_pretraining_encoder(sharing):
    config = _config(sharing=sharing)
    pre = AlbertForPreTraining(config)
    model = AlbertForSequenceClassification(config, 2)
    model.load_encoder(pre.state_dict())
    ids, mask, types, labels = _batch(2)
    pre.eval(), model.eval()
    _, pooled = pre.albert(ids, mask, types)
    torch.testing.assert_close(model(ids, mask, types)["logits"], model.classifier(pooled))
    assert set(model.state_dict()) == {k for k in pre.state_dict() if k.startswith("albert.")} | {
        "classifier.weight", "classifier.bias"}


def test_encoder_of_another_sharing_mode_is_refused_naming_keys():
    pre = AlbertForPreTraining(_config(sharing="all"))
    model = AlbertForSequenceClassification(_config(sharing="none"), 2)
    with pytest.raises(ValueError, match="missing.*albert.encoder.blocks"):
        model.load_encoder(pre.state_dict())
    with pytest.raises(ValueError, match="num_labels"):
        AlbertForSequenceClassification(_config(), 0)
