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


QUANTITIES = ("loss", "mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy", "grad_norm", "mlm_dropped")


def _step(acc: MetricAccumulator, k: int, rank: int) -> None:
    """Optimiser step k of a rank: two micro-steps of distinct values, a norm."""
    mask = torch.tensor([[1] * (3 + (k + rank) % 2) + [0] * (1 - (k + rank) % 2)] * 2)
    acc.add_micro_step(_out(1.7 * k + rank, 0.3 * k, k % 3, 5 + rank, k % 2, 2), mask)
    acc.add_micro_step(_out(0.9 * k, 0.1 + rank, 1, 4, 1, 2), mask)
    acc.add_step(0.5 + 0.1 * k)


def test_an_interval_saved_mid_window_and_restored_gives_the_uninterrupted_record():
    """A checkpoint between log steps: steps 1-2 saved (`local_state`), restored into a new accumulator (a
    resumed job), steps 3-4 added: the record equals that of one accumulator that saw steps 1-4."""
    whole, before = MetricAccumulator(torch.device("cpu")), MetricAccumulator(torch.device("cpu"))
    for k in (1, 2):
        _step(whole, k, 0)
        _step(before, k, 0)
    saved = [before.local_state()]
    resumed = MetricAccumulator(torch.device("cpu"))
    resumed.restore(saved, rank=0, world_size=1)
    for k in (3, 4):
        _step(whole, k, 0)
        _step(resumed, k, 0)
    want, got = whole.reduce(), resumed.reduce()
    assert all(got[q] == want[q] for q in QUANTITIES), (got, want)  # same sums in the same order: bit-equal
    assert got["samples_per_s"] / got["tokens_per_s"] == pytest.approx(want["samples_per_s"] / want["tokens_per_s"])
    empty = MetricAccumulator(torch.device("cpu"))
    empty.restore([], rank=0, world_size=1)  # a checkpoint from before intervals were saved: a fresh interval
    _step(empty, 3, 0)
    assert empty.reduce()["grad_norm"] == pytest.approx(0.8)


def test_an_interval_saved_by_two_ranks_restored_on_one_sums_both():
    """On another number of ranks, rank 0 takes both saved ranks' sums and every rank the global fields: the
    one-rank record of steps 1-3 equals the two-rank interval's totals (what `reduce`'s all-reduce would sum)."""
    ranks = [MetricAccumulator(torch.device("cpu")) for _ in range(2)]
    for k in (1, 2):
        for r, acc in enumerate(ranks):
            _step(acc, k, r)
    saved = [acc.local_state() for acc in ranks]
    one = MetricAccumulator(torch.device("cpu"))
    one.restore(saved, rank=0, world_size=1)
    _step(one, 3, 0)
    got = one.reduce()
    # by hand: mlm loss sums of both ranks' steps 1-2 and rank 0's step 3 over their masked tokens
    mlm_sum = sum(1.7 * k + r + 0.9 * k for k in (1, 2) for r in (0, 1)) + (1.7 * 3 + 0.9 * 3)
    mlm_count = sum(5 + r + 4 for k in (1, 2) for r in (0, 1)) + 9
    assert got["mlm_loss"] == pytest.approx(mlm_sum / mlm_count, rel=1e-6)
    assert got["grad_norm"] == pytest.approx((0.6 + 0.7 + 0.8) / 3)  # global: per step, not per rank
    other = MetricAccumulator(torch.device("cpu"))
    other.restore(saved, rank=1, world_size=3)  # rank 1 of 3: no per-rank sums, the global ones
    assert other.reduce()["mlm_loss"] == 0.0
    with pytest.raises(ValueError, match="fields"):
        other.restore([{"sums": [0.0] * 3, "seconds": 0.0}], rank=0, world_size=1)


def test_a_batch_without_mask_counts_every_position_as_a_token():
    """The maskless form of an unpadded batch (None and its shape) gives the record of its all-ones mask."""
    with_mask, without = MetricAccumulator(torch.device("cpu")), MetricAccumulator(torch.device("cpu"))
    padded = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for acc, full in ((with_mask, torch.ones(2, 3, dtype=torch.long)), (without, None)):
        acc.add_micro_step(_out(3.0, 1.0, 1, 2, 1, 2), padded)
        acc.add_micro_step(_out(2.0, 1.0, 1, 2, 1, 2), full, (2, 3))
        acc.add_step(1.0)
    a, b = with_mask.reduce(), without.reduce()
    assert b["positions_per_s"] / b["tokens_per_s"] == pytest.approx(12 / 9)  # 3 + 6 tokens of 12 positions
    assert a["positions_per_s"] / a["tokens_per_s"] == pytest.approx(12 / 9)
    assert all(a[q] == b[q] for q in QUANTITIES)
    with pytest.raises(ValueError, match="shape"):
        without.add_micro_step(_out(1.0, 1.0, 1, 1, 1, 1), None)


class _Clock:
    """perf_counter for the accumulator: moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_data_wait_per_step_and_share_of_the_interval(monkeypatch):
    """3 steps in 10 s of training (2 s of evaluation excluded) that waited 0.5 + 1.0 + 1.5 s: 1 s per step,
    a share of 0.3; the interval saved mid-way keeps its wait; a saved state without one restores as 0."""
    clock = _Clock()
    monkeypatch.setattr("albert_dist.engine.metrics.time.perf_counter", clock)
    acc = MetricAccumulator(torch.device("cpu"))
    for wait in (0.5, 1.0):
        acc.add_data_wait(wait)
        acc.add_step(1.0)
    clock.now += 6.0
    resumed = MetricAccumulator(torch.device("cpu"))
    resumed.restore([acc.local_state()], rank=0, world_size=1)
    resumed.add_data_wait(1.5)
    resumed.add_step(1.0)
    clock.now += 6.0
    resumed.exclude(2.0)
    record = resumed.reduce()
    assert record["data_wait_s"] == pytest.approx(1.0) and record["data_wait_share"] == pytest.approx(0.3)
    assert resumed.reduce()["data_wait_s"] == 0.0  # reset with the interval
    old = {k: v for k, v in acc.local_state().items() if k != "data_wait_s"}  # a checkpoint from before
    resumed.restore([old], rank=0, world_size=1)
    assert resumed.reduce()["data_wait_s"] == 0.0


def test_data_wait_is_the_mean_over_ranks(monkeypatch):
    """Reduced over two ranks with the same interval (the all-reduce doubles every slot): the wait per step is
    one rank's, not twice it, while the per-rank sums (samples) double."""
    import albert_dist.engine.metrics as metrics

    clock = _Clock()
    monkeypatch.setattr("albert_dist.engine.metrics.time.perf_counter", clock)
    monkeypatch.setattr(metrics, "is_multi_rank", lambda: True)
    monkeypatch.setattr(metrics.dist, "all_reduce", lambda t: t.mul_(2))
    monkeypatch.setattr(metrics.dist, "get_world_size", lambda: 2)
    acc = MetricAccumulator(torch.device("cpu"))
    acc.add_micro_step(_out(1.0, 1.0, 1, 1, 1, 1), torch.ones(2, 3, dtype=torch.long))
    acc.add_data_wait(0.25)
    acc.add_step(1.0)
    clock.now += 1.0
    record = acc.reduce()
    assert record["data_wait_s"] == pytest.approx(0.25) and record["data_wait_share"] == pytest.approx(0.25)
    assert record["samples_per_s"] == pytest.approx(4.0) and record["grad_norm"] == pytest.approx(1.0)
