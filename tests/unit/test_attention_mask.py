"""Attention without a mask for batches the host knows are unpadded (`albert_dist.data.pretraining.drop_full_mask`):
outputs and gradients equal the masked path with an all-ones mask, the decision is made on the host copy, and
compiled code keeps one graph per variant (no recompilation when masked and unmasked batches alternate)."""
import numpy as np
import pytest
import torch

from albert_dist.data.pretraining import Example, collate, drop_full_mask
from albert_dist.engine.compile import compile_model, dynamo_counters
from albert_dist.model import AlbertConfig, AlbertForPreTraining

V, S, P = 61, 12, 3


def tiny(sharing: str) -> AlbertConfig:
    return AlbertConfig(vocab_size=V, embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=S, sharing=sharing)


def full_batch(seed: int, B: int = 3) -> dict[str, torch.Tensor]:
    """Rows without padding: P labelled positions each (not the first), random SOP labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.full((B, S), -100)
    for i in range(B):
        where = 1 + torch.randperm(S - 1, generator=g)[:P]
        labels[i, where] = torch.randint(0, V, (P,), generator=g)
    return {"input_ids": torch.randint(1, V, (B, S), generator=g), "attention_mask": torch.ones(B, S, dtype=torch.long),
            "token_type_ids": (torch.arange(S) >= S // 2).long().expand(B, S).contiguous(), "mlm_labels": labels,
            "sop_labels": torch.randint(0, 2, (B,), generator=g)}


def padded_batch(seed: int) -> dict[str, torch.Tensor]:
    batch = full_batch(seed)
    batch["attention_mask"][0, S - 3:] = 0
    batch["mlm_labels"][0, S - 3:] = -100
    return batch


def loss_and_grads(model, batch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    (out.mlm_loss_sum + out.sop_loss_sum).backward()
    return [t.detach().clone() for t in out], [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("sharing", ["all", "none"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_no_mask_equals_the_all_ones_mask(sharing, checkpointing):
    """The masked path (what every batch took before) with an all-ones mask against the same batch without a
    mask: every output of `PreTrainingOutput` and every parameter's gradient, in training mode."""
    torch.manual_seed(0)
    config = tiny(sharing)
    config.gradient_checkpointing = checkpointing
    model = AlbertForPreTraining(config, max_predictions_per_seq=P).train()
    masked = full_batch(1)
    outs_m, grads_m = loss_and_grads(model, masked)
    outs_n, grads_n = loss_and_grads(model, {**masked, "attention_mask": None})
    assert len(grads_m) == len(grads_n) == sum(1 for p in model.parameters() if p.requires_grad)
    assert outs_m[0] > 0
    for a, b in zip(outs_m + grads_m, outs_n + grads_n):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    # and the comparison can see a mask: with a padded row, dropping its mask moves that row's logits
    padded = padded_batch(1)
    ids, types = padded["input_ids"], padded["token_type_ids"]
    with torch.no_grad():
        moved = (model.logits(ids, padded["attention_mask"], types)[0] - model.logits(ids, None, types)[0]).abs()
    assert moved[0].max() > 1e3 * 1e-7 and moved[1:].max() == 0


def test_logits_and_the_encoder_take_no_mask():
    torch.manual_seed(0)
    model = AlbertForPreTraining(tiny("all")).eval()
    batch = full_batch(2)
    mlm, sop = model.logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    mlm_n, sop_n = model.logits(batch["input_ids"], None, batch["token_type_ids"])
    torch.testing.assert_close(mlm_n, mlm, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sop_n, sop, rtol=1e-6, atol=1e-7)


def _example(length: int, seed: int) -> Example:
    rng = np.random.default_rng(seed)
    return Example(input_ids=rng.integers(5, V, length).astype(np.int32), len_a=length // 2 - 1,
                   masked_positions=np.array([1]), masked_ids=np.array([7], dtype=np.int32), sop_label=0)


def test_the_host_drops_only_a_mask_without_padding():
    """From `collate`: rows filling S -> no mask (the other tensors untouched); one short row -> the batch as is."""
    full = collate([_example(S, 0), _example(S, 1)], S)
    dropped = drop_full_mask(full)
    assert dropped["attention_mask"] is None
    assert all(dropped[k] is full[k] for k in full if k != "attention_mask")
    assert full["attention_mask"] is not None  # the loader's batch is not changed
    short = collate([_example(S, 0), _example(S - 1, 1)], S)
    assert drop_full_mask(short) is short


def test_the_decision_is_refused_on_a_device_tensor():
    """On the device the check would be a host sync: refused, not done."""
    batch = {"attention_mask": torch.ones(2, S, dtype=torch.long, device="meta")}
    with pytest.raises(ValueError, match="host"):
        drop_full_mask(batch)


@pytest.mark.parametrize("scope", ["block", "model"])
def test_compiled_variants_compile_once_each(scope):
    """Compiled (dynamo, "eager" backend: the graphs and guards of inductor's, without code generation): a
    masked batch, then an unmasked one, compile a graph set each; alternating afterwards, with new values,
    compiles nothing (`error_on_recompile`) and the shapes stay static (no dynamic dimension marked)."""
    torch.manual_seed(0)
    model = AlbertForPreTraining(tiny("all"), max_predictions_per_seq=P).train()
    compile_model(model, scope, backend="eager")
    before = dynamo_counters()["unique_graphs"]
    loss_and_grads(model, padded_batch(3))
    masked_graphs = dynamo_counters()["unique_graphs"] - before
    loss_and_grads(model, drop_full_mask(full_batch(4)))
    both = dynamo_counters()["unique_graphs"] - before
    assert masked_graphs > 0 and both > masked_graphs
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in range(5, 9):
            batch = drop_full_mask(full_batch(seed) if seed % 2 else padded_batch(seed))
            assert (batch["attention_mask"] is None) == bool(seed % 2)
            loss_and_grads(model, batch)
    assert dynamo_counters()["unique_graphs"] - before == both
