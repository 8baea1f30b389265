"""The fixed validation set gives the same examples and the same metrics at every evaluation and for world sizes
1 and 2 (2 gloo ranks), and the metrics equal an independent computation from full logits of the whole set.

One spawned 2-rank group evaluates the albert-tiny model (identical seeded weights everywhere) twice as a plain
module and once as a DeepSpeed ZeRO-3 engine (every parameter partitioned, so every forward is collective: the
ranks' slices differ in length and the shorter one must run a spare pass, or the group hangs). The test process
evaluates the same set with world size 1 and from full (B, S, V) logits in float64.
"""
from __future__ import annotations

import datetime
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from albert_dist.distributed.local_ranks import spawn_local_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
MICRO = 6
# 37 examples: rank 0 gets rows [0, 18) = 3 batches of 6, rank 1 rows [18, 37) = 4 batches (6, 6, 6, 1)
DATA = dict(max_seq_length=64, eval_examples=37)


def _model():
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining

    torch.manual_seed(0)
    return AlbertForPreTraining(load_model_config("albert-tiny")).eval()


def _evaluator(rank: int, world: int):
    from albert_dist.data.config import DataConfig
    from albert_dist.engine.evaluation import Evaluator

    return Evaluator(DataConfig(**DATA), MICRO, rank, world, torch.device("cpu"))


def _worker(rank: int, out_dir: str) -> None:
    try:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=120))
        ev = _evaluator(rank, WORLD)
        model = _model()
        with torch.no_grad():
            plain = [ev.evaluate(model), ev.evaluate(model)]
        sharded = _model()
        engine, _, _, _ = deepspeed.initialize(
            model=sharded, optimizer=torch.optim.AdamW(sharded.parameters()),  # the optimiser is never stepped
            config={"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                    "train_batch_size": MICRO * WORLD, "steps_per_print": 2**31 - 1,
                    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                    "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False})
        engine.eval()
        with torch.no_grad():
            zero3 = ev.evaluate(engine)
        rows = {k: torch.cat([b[k] for b in ev.batches]) for k in ev.set.batch}
        torch.save({"plain": plain, "zero3": zero3, "rows": rows, "set": ev.set.batch, "passes": ev.passes,
                    "batches": len(ev.batches), "once": ev.once_metrics()}, Path(out_dir) / f"rank{rank}.pt")
        engine.destroy()
    except Exception:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("valset")
    spawn_local_ranks(_worker, WORLD, str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def single():
    ev = _evaluator(0, 1)
    with torch.no_grad():
        return ev, ev.evaluate(_model())


def _reference(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The metrics of the whole set from full logits, in float64, without PreTrainingOutput or the Evaluator."""
    with torch.no_grad():
        mlm, sop = _model().logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    labelled = batch["mlm_labels"] != -100
    mlm, targets = mlm[labelled].double(), batch["mlm_labels"][labelled]
    sop = sop.double()
    return {"val/mlm_loss": F.cross_entropy(mlm, targets).item(),
            "val/mlm_accuracy": (mlm.argmax(-1) == targets).double().mean().item(),
            "val/sop_loss": F.cross_entropy(sop, batch["sop_labels"]).item(),
            "val/sop_accuracy": (sop.argmax(-1) == batch["sop_labels"]).double().mean().item()}


def test_every_rank_builds_the_same_set_and_evaluates_a_contiguous_slice(ranks, single):
    ev, _ = single
    full = ev.set.batch
    assert len(ev.set) == 37
    for r in ranks:
        assert r["set"].keys() == full.keys() and all(torch.equal(r["set"][k], full[k]) for k in full)
    # rank 0 then rank 1 is the whole set, in order
    for k in full:
        assert torch.equal(torch.cat([ranks[0]["rows"][k], ranks[1]["rows"][k]]), full[k]), k
    assert [r["batches"] for r in ranks] == [3, 4] and [r["passes"] for r in ranks] == [4, 4]


def test_metrics_are_the_same_at_every_evaluation_and_world_size(ranks, single):
    _, one = single
    assert set(one) == {"val/loss", "val/mlm_loss", "val/sop_loss", "val/mlm_accuracy", "val/sop_accuracy",
                        "val/mlm_accuracy_over_unigram"}
    first, second = ranks[0]["plain"]
    assert first == second  # identical evaluations: same examples, same sums
    assert ranks[1]["plain"][0] == {k: v for k, v in first.items() if k != "val/mlm_accuracy_over_unigram"}
    for got in (first, ranks[0]["zero3"], ranks[1]["zero3"]):
        assert got["val/mlm_accuracy"] == one["val/mlm_accuracy"]  # the same correct/count sums
        assert got["val/sop_accuracy"] == one["val/sop_accuracy"]
        for k in ("val/loss", "val/mlm_loss", "val/sop_loss"):
            assert got[k] == pytest.approx(one[k], rel=1e-6), k  # float summation order only
    assert ranks[0]["zero3"]["val/mlm_accuracy_over_unigram"] == pytest.approx(one["val/mlm_accuracy_over_unigram"])


def test_metrics_equal_full_logit_reference(single):
    ev, one = single
    ref = _reference(ev.set.batch)
    for k, v in ref.items():
        assert one[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert one["val/loss"] == pytest.approx(ref["val/mlm_loss"] + ref["val/sop_loss"], rel=1e-5)
    base = ev.baseline["unigram_mlm_accuracy"]
    assert one["val/mlm_accuracy_over_unigram"] == pytest.approx(ref["val/mlm_accuracy"] / base)
    once = ev.once_metrics()
    assert once["val/masked_tokens"] == int((ev.set.batch["mlm_labels"] != -100).sum())
    assert once["val/sop_pairs"] == 37 and once["val/unigram_mlm_accuracy"] == base
