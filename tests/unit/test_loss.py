"""Per-token loss normalisation (`albert_dist.engine.loss`) and the per-token metrics (`MetricAccumulator`)."""
import pytest
import torch
import torch.nn.functional as F

from albert_dist.engine.loss import label_counts, micro_step_loss, optimizer_step
from albert_dist.engine.metrics import MetricAccumulator
from albert_dist.model import AlbertConfig, AlbertForPreTraining


def _batch(masked_per_row: list[int], seed: int, S: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B = len(masked_per_row)
    mlm = torch.full((B, S), -100)
    for i, k in enumerate(masked_per_row):
        mlm[i, 1:1 + k] = torch.randint(0, 50, (k,), generator=g)
    return {"input_ids": torch.randint(0, 50, (B, S), generator=g), "attention_mask": torch.ones(B, S, dtype=torch.long),
            "token_type_ids": torch.zeros(B, S, dtype=torch.long), "mlm_labels": mlm,
            "sop_labels": torch.tensor([0, -100, 1][:B])}


@pytest.fixture()
def model():
    torch.manual_seed(0)
    return AlbertForPreTraining(AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=24, max_position_embeddings=16,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()


def test_label_counts_sum_the_step():
    counts = label_counts([_batch([1, 7], 0), _batch([3, 2, 5], 1)])
    assert counts.dtype == torch.float64 and counts.tolist() == [18.0, 3.0]  # sop: 0 and 1 kept, -100 dropped


def test_micro_step_losses_add_up_to_the_per_token_loss(model):
    batches = [_batch([1, 7], 0), _batch([3, 2, 5], 1)]
    counts = label_counts(batches)
    outs = [model(**b) for b in batches]
    # What DeepSpeed makes of it: each loss / GA, averaged over 1 rank.
    total = sum(micro_step_loss(o, counts, micro_steps=2) / 2 for o in outs)
    # Independent: cross-entropy over the full logits of every labelled position / their count.
    mlm, sop, n_mlm, n_sop = 0.0, 0.0, 0, 0
    for b in batches:
        mlm_logits, sop_logits = model.logits(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        mlm = mlm + F.cross_entropy(mlm_logits.flatten(0, 1).float(), b["mlm_labels"].flatten(), reduction="sum")
        sop = sop + F.cross_entropy(sop_logits.float(), b["sop_labels"], reduction="sum")
        n_mlm += int((b["mlm_labels"] != -100).sum())
        n_sop += int((b["sop_labels"] != -100).sum())
    torch.testing.assert_close(total, mlm / n_mlm + sop / n_sop, rtol=1e-6, atol=1e-6)
    # The mean of micro-batch means is a different number on this batch (counts 8 vs 10).
    assert abs(float(torch.stack([o.loss for o in outs]).mean().detach() - total.detach())) > 1e-3
    # sop_weight scales only the SOP term.
    weighted = sum(micro_step_loss(o, counts, micro_steps=2, sop_weight=0.5) / 2 for o in outs)
    torch.testing.assert_close(weighted, mlm / n_mlm + 0.5 * sop / n_sop, rtol=1e-6, atol=1e-6)


def test_no_labels_gives_zero_loss(model):
    b = _batch([0, 0], 0)
    b["sop_labels"] = torch.tensor([-100, -100])
    out = model(**b)
    assert float(micro_step_loss(out, label_counts([b]), micro_steps=1).detach()) == 0.0


def test_optimizer_step_refuses_a_wrong_number_of_batches():
    class Engine:
        def gradient_accumulation_steps(self):
            return 2

    with pytest.raises(ValueError, match="gradient_accumulation_steps=2"):
        optimizer_step(Engine(), [_batch([1], 0)])


def test_logged_mlm_loss_and_accuracy_are_per_token(model):
    batches = [_batch([1, 7], 0), _batch([3, 2, 5], 1)]
    acc = MetricAccumulator(torch.device("cpu"))
    outs = [model(**b) for b in batches]
    for o, b in zip(outs, batches):
        acc.add_micro_step(o, b["attention_mask"])
    record = acc.reduce()
    n = sum(int(o.mlm_count) for o in outs)
    assert record["mlm_loss"] == pytest.approx(float(sum(o.mlm_loss_sum for o in outs)) / n, rel=1e-6)
    assert record["mlm_accuracy"] == pytest.approx(sum(int(o.mlm_correct) for o in outs) / n, rel=1e-6)
    assert record["sop_loss"] == pytest.approx(float(sum(o.sop_loss_sum for o in outs)) / 3, rel=1e-6)
    assert record["loss"] == pytest.approx(record["mlm_loss"] + record["sop_loss"], rel=1e-6)
