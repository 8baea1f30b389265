"""The static MLM gather (`AlbertForPreTraining(config, max_predictions_per_seq=P)`): P + 1 slots per row whatever
the batch, with losses, gradients and accuracy counts equal to the dynamic gather (the implementation before
static shapes, still `max_predictions_per_seq=None`) and to cross-entropy over the full (B, S, V) logits; rows
with more labels than P are counted, and the data pipeline never makes one."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from albert_dist.data.config import DataConfig
from albert_dist.model import AlbertConfig, AlbertForPreTraining

V, S = 97, 13
REPO = Path(__file__).resolve().parents[2]


def tiny(sharing="all") -> AlbertConfig:
    return AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_hidden_groups=2,
                        num_attention_heads=4, intermediate_size=48, max_position_embeddings=S, sharing=sharing)


def batch(per_row: list[int], seed: int, label_first: bool = False) -> dict[str, torch.Tensor]:
    """Rows with `per_row[i]` labelled positions at random places (position 0 never, unless `label_first`),
    right padding after the labels, one ignored SOP label."""
    g = torch.Generator().manual_seed(seed)
    B = len(per_row)
    labels = torch.full((B, S), -100)
    mask = torch.ones(B, S, dtype=torch.long)
    for i, k in enumerate(per_row):
        where = 1 + torch.randperm(S - 1, generator=g)[:k]
        labels[i, where] = torch.randint(0, V, (k,), generator=g)
        last = int(where.max()) if k else 3
        mask[i, last + 1 + i % 2:] = 0  # some padding after the last label
    if label_first:
        labels[0, 0] = 4
    sop = torch.randint(0, 2, (B,), generator=g)
    sop[-1] = -100
    return {"input_ids": torch.randint(0, V, (B, S), generator=g) * mask, "attention_mask": mask,
            "token_type_ids": (torch.arange(S) >= S // 2).long().expand(B, S) * mask, "mlm_labels": labels,
            "sop_labels": sop}


def full_logits_reference(model, data) -> dict[str, torch.Tensor]:
    """Loss sums and counts from the full (B, S, V) logits: independent of any gather."""
    mlm_logits, sop_logits = model.logits(data["input_ids"], data["attention_mask"], data["token_type_ids"])
    labels = data["mlm_labels"]
    labelled = labels != -100
    sop = data["sop_labels"]
    return {"mlm_loss_sum": F.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"),
            "sop_loss_sum": F.cross_entropy(sop_logits.float(), sop, reduction="sum"),
            "mlm_correct": (mlm_logits.argmax(-1)[labelled] == labels[labelled]).sum(),
            "mlm_count": labelled.sum(), "sop_count": (sop != -100).sum(),
            "sop_correct": ((sop_logits.argmax(-1) == sop) & (sop != -100)).sum()}


def scaled_error(x: torch.Tensor, ref: torch.Tensor, floor: float) -> float:
    """max |x - ref| / max |ref|, the denominator at least `floor` (the attention key bias has a zero gradient,
    softmax being shift-invariant: there only noise ~1e-11 is left to compare)."""
    return float((x - ref).abs().max() / ref.abs().max().clamp(min=floor))


def run(model, data, P):
    model.max_predictions_per_seq = P
    model.zero_grad(set_to_none=True)
    out = model(**data)
    (out.mlm_loss_sum + out.sop_loss_sum).backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("sharing", ["all", "none"])
@pytest.mark.parametrize("per_row,label_first", [([3, 7, 0, 5], False), ([1, 1, 1, 1], True), ([9, 2, 6, 4], False)])
def test_static_gather_equals_dynamic_and_full_logits(sharing, per_row, label_first):
    torch.manual_seed(1)
    model = AlbertForPreTraining(tiny(sharing)).train()
    data = batch(per_row, seed=sum(per_row), label_first=label_first)
    dyn, g_dyn = run(model, data, None)
    model.zero_grad(set_to_none=True)
    ref = full_logits_reference(model, data)
    (ref["mlm_loss_sum"] + ref["sop_loss_sum"]).backward()
    g_full = {n: p.grad.clone() for n, p in model.named_parameters()}
    most = max(per_row) + int(label_first)
    for P in (most, most + 3, S + 5):  # exactly the longest row, spare slots, more slots than positions
        out, g = run(model, data, P)
        assert int(out.mlm_dropped) == 0
        for name in ("mlm_count", "mlm_correct", "sop_count", "sop_correct"):
            assert int(getattr(out, name)) == int(getattr(dyn, name)) == int(ref[name]), name
        for name in ("mlm_loss_sum", "sop_loss_sum", "mlm_loss", "sop_loss", "loss"):
            torch.testing.assert_close(getattr(out, name), getattr(dyn, name), rtol=1e-6, atol=1e-6, msg=name)
        for name in ("mlm_loss_sum", "sop_loss_sum"):
            torch.testing.assert_close(getattr(out, name), ref[name], rtol=1e-6, atol=1e-6, msg=name)
        floor = 1e-3 * max(float(t.abs().max()) for t in g_full.values())
        for n in g:  # scaled: max |error| / max |reference| per tensor (fp32 summation order differs)
            assert scaled_error(g[n], g_dyn[n], floor) < 1e-6, f"{n} vs dynamic, P={P}"
            assert scaled_error(g[n], g_full[n], floor) < 1e-6, f"{n} vs full logits, P={P}"


def test_every_batch_has_the_same_shapes():
    """The head sees (B x (P + 1), H) whatever the batch's label counts; the dynamic gather follows each batch."""
    torch.manual_seed(2)
    model = AlbertForPreTraining(tiny(), max_predictions_per_seq=6).eval()
    seen = []
    model.predictions.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))
    with torch.no_grad():
        for per_row in ([1, 2, 0, 1], [6, 6, 6, 6], [0, 0, 0, 0], [3, 5, 1, 2]):
            model(**batch(per_row, seed=len(seen)))
        assert seen == [(4 * 7, 32)] * 4
        seen.clear()
        model.max_predictions_per_seq = None
        for per_row in ([1, 2, 0, 1], [6, 6, 6, 6]):
            model(**batch(per_row, seed=len(seen)))
    assert seen == [(4, 32), (24, 32)]  # the labelled positions only


def test_a_row_over_the_cap_is_counted_not_hidden():
    """Labels past a row's P slots reach no loss and are counted in mlm_dropped (the trainer refuses them); the
    loss is then that of the first P labels of each row."""
    torch.manual_seed(3)
    model = AlbertForPreTraining(tiny(), max_predictions_per_seq=4).eval()
    data = batch([6, 2, 4, 7], seed=3)
    with torch.no_grad():
        out = model(**data)
    assert int(out.mlm_dropped) == (6 - 4) + (7 - 4)
    assert int(out.mlm_count) == 19  # every label is still counted, so the step's normalisation stays honest
    kept = data["mlm_labels"].clone()
    for row in kept:  # the first 4 labels of every row, by position
        where = (row != -100).nonzero().flatten()
        row[where[4:]] = -100
    with torch.no_grad():
        ref = full_logits_reference(model, {**data, "mlm_labels": kept})
    torch.testing.assert_close(out.mlm_loss_sum, ref["mlm_loss_sum"], rtol=1e-6, atol=1e-6)


def test_bad_cap_is_refused():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_predictions_per_seq"):
            AlbertForPreTraining(tiny(), max_predictions_per_seq=bad)


def test_prediction_slots_and_the_cap_note():
    cfg = DataConfig(max_seq_length=128, masked_lm_prob=0.15, max_predictions_per_seq=20)
    assert cfg.prediction_slots == 20 and cfg.masked_tokens_asked(0.15) == 19 and cfg.masking_cap_note() is None
    assert DataConfig(max_seq_length=16, max_predictions_per_seq=20).prediction_slots == 13
    # ALBERT's published recipe: the cap binds at length 512, and the note says by how much.
    albert = DataConfig(max_seq_length=512, masked_lm_prob=0.15, max_predictions_per_seq=20)
    note = albert.masking_cap_note()
    assert "max_predictions_per_seq=20" in note and "509" in note and "3.9%" in note and "asks 76" in note
    # Training at 30% under a cap of 40 is uncapped at length 128; the validation set's 15% too.
    assert DataConfig(max_seq_length=128, masked_lm_prob=0.3, max_predictions_per_seq=40).masking_cap_note() is None
    note = DataConfig(max_seq_length=128, masked_lm_prob=0.3, max_predictions_per_seq=20).masking_cap_note()
    assert "masked_lm_prob=0.3 asks 38" in note and "eval_masked_lm_prob" not in note


@pytest.mark.parametrize("rate,cap", [(0.3, 20), (0.15, 5)])
def test_pipeline_rows_never_exceed_the_cap(rate, cap):
    """Real batches where the cap binds: no row holds more than max_predictions_per_seq labels (the budget is
    capped by construction), and the static model drops nothing."""
    from albert_dist.data.pretraining import ExampleBuilder, collate
    from albert_dist.data.tokenizer import load_tokenizer

    sample_sp = load_tokenizer(str(REPO / "data/sample/spiece.model"))
    cfg = DataConfig(max_seq_length=128, masked_lm_prob=rate, max_predictions_per_seq=cap, short_seq_prob=0.0)
    builder = ExampleBuilder(sample_sp, cfg)
    text = (REPO / "data/sample/wikitext-2-train-00.txt").read_text(encoding="utf-8")[:200_000]
    examples = builder.build(text, np.random.default_rng(0))
    assert len(examples) > 100
    data = collate(examples, cfg.max_seq_length)
    per_row = (data["mlm_labels"] != -100).sum(1)
    assert int(per_row.max()) == cap  # the cap binds at this rate ...
    assert int(per_row.max()) <= cfg.prediction_slots  # ... and is never exceeded
    model = AlbertForPreTraining(dataclasses.replace(tiny(), vocab_size=sample_sp.get_piece_size(),
                                                     max_position_embeddings=128),
                                 max_predictions_per_seq=cfg.prediction_slots).eval()
    with torch.no_grad():
        out = model(**{k: v[:32] for k, v in data.items()})
    assert int(out.mlm_dropped) == 0 and int(out.mlm_count) == int(per_row[:32].sum())
