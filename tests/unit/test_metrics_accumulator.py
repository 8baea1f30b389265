"""MetricAccumulator (albert_dist.engine.metrics): the record from named slots, against sums done by hand."""
from types import SimpleNamespace

import pytest
import torch

from albert_dist.engine.metrics import MetricAccumulator


def _out(mlm_sum, sop_sum, mlm_correct, mlm_count, sop_correct, sop_count, mlm_dropped=0):
    t = lambda v, dt=torch.float32: torch.tensor(v, dtype=dt)  # noqa: E731
    return SimpleNamespace(mlm_loss_sum=t(mlm_sum), sop_loss_sum=t(sop_sum), mlm_correct=t(mlm_correct, torch.int64),
                           mlm_count=t(mlm_count, torch.int64), sop_correct=t(sop_correct, torch.int64),
                           sop_count=t(sop_count, torch.int64), mlm_dropped=t(mlm_dropped, torch.int64))


def test_record_from_two_micro_steps_and_two_steps():
    acc = MetricAccumulator(torch.device("cpu"))
    mask_a = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # 5 tokens, 8 positions, 2 samples
    mask_b = torch.tensor([[1, 1, 1, 1]])  # 4 tokens, 4 positions, 1 sample
    acc.add_micro_step(_out(12.0, 1.5, 3, 6, 1, 2), mask_a)
    acc.add_micro_step(_out(8.0, 0.5, 1, 4, 1, 1, mlm_dropped=3), mask_b)
    acc.add_step(2.0)
    acc.add_step(torch.tensor(4.0))
    acc.add_step(None)  # no norm available: counts as a step, adds nothing
    record = acc.reduce()
    assert record["mlm_loss"] == pytest.approx(20.0 / 10)  # per masked token of the interval
    assert record["sop_loss"] == pytest.approx(2.0 / 3)  # per labelled sequence
    assert record["loss"] == pytest.approx(2.0 + 2.0 / 3)
    assert record["mlm_accuracy"] == pytest.approx(4 / 10) and record["sop_accuracy"] == pytest.approx(2 / 3)
    assert record["grad_norm"] == pytest.approx(6.0 / 3)
    assert record["mlm_dropped"] == 3.0  # labels no loss saw: summed, for the trainer to refuse
    ratio = record["positions_per_s"] / record["tokens_per_s"]
    assert ratio == pytest.approx(12 / 9) and record["samples_per_s"] / record["tokens_per_s"] == pytest.approx(3 / 9)
    assert acc.reduce()["mlm_accuracy"] == 0.0  # reset after reduce
