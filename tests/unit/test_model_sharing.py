"""The core property: a shared parameter's gradient is the sum of its copies' gradients in an unrolled model.

Also: unroll computes the same function, masked-only MLM loss equals the full-logit loss, accuracy counts,
checkpointing changes nothing, the storage layout of each sharing mode.
"""
import pytest
import torch
import torch.nn.functional as F

from albert_dist.model import AlbertConfig, AlbertForPreTraining, PreTrainingOutput
from albert_dist.model.sharing import executed_blocks
from albert_dist.model.unroll import unroll

V, B, S = 97, 3, 11


def tiny(sharing="all", L=5, G=2, K=2, checkpointing=False, **kw) -> AlbertConfig:
    return AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=L,
                        num_hidden_groups=G, inner_group_num=K, num_attention_heads=4, intermediate_size=48,
                        max_position_embeddings=S, sharing=sharing, gradient_checkpointing=checkpointing, **kw)


def batch(seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, V, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[1, 7:] = 0  # right padding
    token_type_ids = torch.zeros(B, S, dtype=torch.long)
    token_type_ids[:, 5:] = 1
    mlm_labels = torch.full((B, S), -100)
    mlm_labels[0, [1, 4, 9]] = torch.randint(0, V, (3,), generator=g)
    mlm_labels[1, [0, 2]] = torch.randint(0, V, (2,), generator=g)  # position 0 labelled too
    mlm_labels[2, 10] = 5  # row 2: one prediction
    sop_labels = torch.tensor([0, 1, 1])
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                mlm_labels=mlm_labels, sop_labels=sop_labels)


def grads(model: AlbertForPreTraining, data) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(**data).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("sharing", ["all", "attention", "ffn", "none"])
def test_shared_gradient_equals_sum_of_copies(sharing, checkpointing):
    torch.manual_seed(0)
    model = AlbertForPreTraining(tiny(sharing, checkpointing=checkpointing)).train()
    unrolled, copies = unroll(model)
    assert unrolled.config.sharing == "none"
    # Every parameter of the unrolled model is the copy of exactly one parameter of the model.
    flat = [c for names in copies.values() for c in names]
    assert sorted(flat) == sorted(n for n, _ in unrolled.named_parameters())
    data = batch()
    g_model, g_unrolled = grads(model, data), grads(unrolled, data)
    for name, names in copies.items():
        expected = torch.stack([g_unrolled[c] for c in names]).sum(0)
        torch.testing.assert_close(g_model[name], expected, rtol=1e-5, atol=1e-7, msg=name)
    shared = [n for n, c in copies.items() if len(c) > 1]
    assert bool(shared) == (sharing != "none")  # the property is exercised, not vacuous


def test_copies_follow_group_index():
    model = AlbertForPreTraining(tiny("attention", L=7, G=3, K=1))
    _, copies = unroll(model)
    # 7 layers in 3 groups -> 0,0,0,1,1,2,2: group 1's attention runs in executed blocks 3 and 4.
    assert copies["albert.encoder.albert_layer_groups.1.albert_layers.0.attention.query.weight"] == [
        "albert.encoder.blocks.3.attention.query.weight", "albert.encoder.blocks.4.attention.query.weight"]
    assert copies["albert.encoder.blocks.6.ffn.weight"] == ["albert.encoder.blocks.6.ffn.weight"]
    assert copies["albert.pooler.weight"] == ["albert.pooler.weight"]


@pytest.mark.parametrize("sharing", ["all", "attention", "ffn", "none"])
def test_unrolled_computes_the_same_function(sharing):
    torch.manual_seed(1)
    model = AlbertForPreTraining(tiny(sharing)).eval()
    unrolled, _ = unroll(model)
    data = batch(1)
    with torch.no_grad():
        a, b = model(**data), unrolled(**data)
        la, lb = model.logits(data["input_ids"], data["attention_mask"], data["token_type_ids"])[0], \
            unrolled.logits(data["input_ids"], data["attention_mask"], data["token_type_ids"])[0]
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=1e-6)


def test_storage_layout_per_mode():
    names = {s: {n for n, _ in AlbertForPreTraining(tiny(s, L=2, G=1, K=1)).named_parameters()}
             for s in ("all", "attention", "ffn", "none")}
    group = "albert.encoder.albert_layer_groups.0.albert_layers.0."
    assert group + "attention.query.weight" in names["all"] and group + "ffn.weight" in names["all"]
    assert not any(".blocks." in n for n in names["all"])
    assert group + "attention.query.weight" in names["attention"] and group + "ffn.weight" not in names["attention"]
    assert {"albert.encoder.blocks.0.ffn.weight", "albert.encoder.blocks.1.ffn.weight"} <= names["attention"]
    assert group + "ffn.weight" in names["ffn"] and "albert.encoder.blocks.1.attention.key.weight" in names["ffn"]
    assert not any("albert_layer_groups" in n for n in names["none"])
    assert "predictions.decoder.weight" not in names["all"]  # tied, listed once as the word embeddings


def test_executed_blocks_order():
    assert executed_blocks(tiny(L=3, G=2, K=2)) == [(0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 1), (4, 1, 0), (5, 1, 1)]


@pytest.mark.parametrize("sharing", ["all", "ffn"])
def test_masked_only_loss_equals_full_logit_loss(sharing):
    torch.manual_seed(2)
    model = AlbertForPreTraining(tiny(sharing)).eval()
    data = batch(2)
    with torch.no_grad():
        out = model(**data)
        mlm_logits, sop_logits = model.logits(data["input_ids"], data["attention_mask"], data["token_type_ids"])
    labels = data["mlm_labels"]
    full_mlm = F.cross_entropy(mlm_logits.reshape(-1, V), labels.reshape(-1))  # mean over labelled positions
    full_sop = F.cross_entropy(sop_logits, data["sop_labels"])
    assert isinstance(out, PreTrainingOutput)
    torch.testing.assert_close(out.mlm_loss, full_mlm, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.sop_loss, full_sop, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.loss, full_mlm + full_sop, rtol=1e-6, atol=1e-6)
    labelled = labels != -100
    assert out.mlm_count.item() == labelled.sum().item() == 6
    assert out.mlm_correct.item() == (mlm_logits.argmax(-1)[labelled] == labels[labelled]).sum().item()
    assert out.sop_count.item() == B
    assert out.sop_correct.item() == (sop_logits.argmax(-1) == data["sop_labels"]).sum().item()
    for t in (out.loss, out.mlm_loss, out.sop_loss):
        assert t.dtype == torch.float32 and t.dim() == 0
    for t in (out.mlm_correct, out.mlm_count, out.sop_correct, out.sop_count):
        assert t.dtype == torch.int64 and t.dim() == 0


def test_masked_only_gradient_equals_full_logit_gradient():
    torch.manual_seed(3)
    model = AlbertForPreTraining(tiny("all")).train()
    data = batch(3)
    g_ours = grads(model, data)
    model.zero_grad(set_to_none=True)
    mlm_logits, sop_logits = model.logits(data["input_ids"], data["attention_mask"], data["token_type_ids"])
    (F.cross_entropy(mlm_logits.reshape(-1, V), data["mlm_labels"].reshape(-1))
     + F.cross_entropy(sop_logits, data["sop_labels"])).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(g_ours[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_no_labels_gives_zero_loss_not_nan():
    model = AlbertForPreTraining(tiny("all"))
    data = batch()
    data["mlm_labels"] = torch.full((B, S), -100)
    data["sop_labels"] = torch.full((B,), -100)
    out = model(**data)
    assert out.loss.item() == 0.0 and out.mlm_count.item() == 0 and out.sop_count.item() == 0


def test_padding_is_ignored():
    torch.manual_seed(4)
    model = AlbertForPreTraining(tiny("all")).eval()
    data = batch()
    changed = {k: v.clone() for k, v in data.items()}
    changed["input_ids"][1, 7:] = (changed["input_ids"][1, 7:] + 1) % V  # tokens under the padding mask
    with torch.no_grad():
        a, b = model(**data), model(**changed)
    torch.testing.assert_close(a.loss, b.loss)


def test_bad_shapes_raise():
    model = AlbertForPreTraining(tiny("all"))
    data = batch()
    with pytest.raises(ValueError, match="attention_mask"):
        model(**{**data, "attention_mask": data["attention_mask"][:, :5]})
    with pytest.raises(ValueError, match="sop_labels"):
        model(**{**data, "sop_labels": data["sop_labels"][:2]})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        long = {k: (torch.cat([v, v], 1) if v.dim() == 2 else v) for k, v in data.items()}
        model(**long)


def test_checkpointing_gives_identical_gradients_with_dropout():
    data = batch(5)
    out = {}
    for ckpt in (False, True):
        torch.manual_seed(5)
        model = AlbertForPreTraining(tiny("attention", checkpointing=ckpt, hidden_dropout_prob=0.1,
                                          attention_probs_dropout_prob=0.1)).train()
        torch.manual_seed(6)  # same dropout masks; non-reentrant checkpoint replays the RNG state
        out[ckpt] = grads(model, data)
    for name in out[False]:
        torch.testing.assert_close(out[True][name], out[False][name], rtol=1e-5, atol=1e-7, msg=name)


def test_bert_initialisation():
    torch.manual_seed(7)
    config = tiny("none", initializer_range=0.05)
    model = AlbertForPreTraining(config)
    for name, p in model.named_parameters():
        if "LayerNorm" in name or "layer_norm" in name:
            expected = 1.0 if name.endswith("weight") else 0.0
            assert torch.all(p == expected), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        elif p.numel() > 500:
            assert abs(p.std().item() - 0.05) < 0.01 and abs(p.mean().item()) < 0.01, name
    assert model.predictions.decoder.weight is model.albert.embeddings.word_embeddings.weight
