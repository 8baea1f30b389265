"""albert_dist.engine.stragglers: the interval's aggregation, the 3-interval rule and the busy clock, against
hand-computed values (the 2-rank job with a rank slowed from outside: tests/distributed/test_stragglers.py)."""
from __future__ import annotations

import time

import pytest

from albert_dist.engine import metric_names as names
from albert_dist.engine.stragglers import BusyClock, SlowRankRule, StragglerMonitor, summarize


def test_summarize_takes_max_median_and_the_slowest_rank_of_each_figure():
    record = summarize([0.1, 0.3, 0.2], [0.01, 0.0, 0.05])
    assert record == {names.PERF_STEP_TIME_S_MAX: 0.3, names.PERF_STEP_TIME_S_MEDIAN: 0.2,
                      names.PERF_SLOWEST_RANK: 1.0, names.PERF_DATA_WAIT_S_MAX: 0.05,
                      names.PERF_DATA_WAIT_S_MEDIAN: 0.01, names.PERF_DATA_WAIT_SLOWEST_RANK: 2.0}


def test_summarize_median_of_an_even_count_is_the_mean_of_the_middle_two_and_a_tie_names_the_lowest_rank():
    record = summarize([0.1, 0.4, 0.2, 0.4], [0.0, 0.0, 0.0, 0.0])
    assert record[names.PERF_STEP_TIME_S_MEDIAN] == pytest.approx(0.3)  # (0.2 + 0.4) / 2
    assert record[names.PERF_SLOWEST_RANK] == 1.0
    assert record[names.PERF_DATA_WAIT_SLOWEST_RANK] == 0.0
    assert summarize([0.7], [0.2])[names.PERF_STEP_TIME_S_MEDIAN] == 0.7


@pytest.mark.parametrize("step_s, wait_s", [([], []), ([0.1, 0.2], [0.1])])
def test_summarize_refuses_missing_figures(step_s, wait_s):
    with pytest.raises(ValueError, match="one step time and one data wait per rank"):
        summarize(step_s, wait_s)


def test_a_rank_is_named_after_three_slow_intervals_in_a_row_and_again_after_three_more():
    rule = SlowRankRule()
    fast, slow = [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.3, 1.0]  # median 1.0: bar 1.25, rank 2 over it
    assert [rule.update(slow), rule.update(slow)] == [[], []]
    assert rule.update(slow) == [2] and rule.streak == [0, 0, 3, 0]
    assert rule.update(fast) == [] and rule.streak == [0, 0, 0, 0]  # the run is broken
    assert [rule.update(slow) for _ in range(6)] == [[], [], [2], [], [], [2]]


def test_the_bar_is_strictly_over_1_25_times_the_median_with_two_ranks_the_mean():
    rule = SlowRankRule()
    # 2 ranks: median (1.0 + 1.6) / 2 = 1.3, bar 1.625: 1.6 is under it; (1.0 + 1.7) / 2 = 1.35, bar 1.6875: over
    assert [rule.update([1.0, 1.6]) for _ in range(3)] == [[], [], []]
    assert [rule.update([1.0, 1.7]) for _ in range(3)] == [[], [], [1]]
    rule = SlowRankRule()
    assert [rule.update([1.0, 1.0, 1.25]) for _ in range(3)] == [[], [], []]  # equal to the bar is not over it
    rule = SlowRankRule(factor=2.0, intervals=1)
    assert rule.update([1.0, 1.0, 2.01, 3.0]) == []  # median 1.505: bar 3.01; 3.0 is under
    assert rule.update([1.0, 1.0, 1.0, 2.5]) == [3]  # median 1.0: bar 2.0


@pytest.mark.parametrize("kwargs, field", [({"factor": 1.0}, "factor"), ({"intervals": 0}, "intervals")])
def test_the_rule_refuses_a_bar_that_names_everyone(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SlowRankRule(**kwargs)


def test_the_busy_clock_counts_a_busy_loop_and_not_a_sleep():
    clock = BusyClock()
    try:
        assert clock.has_run_delay  # Linux with schedstats, as CI's machine
        start, wall = clock(), time.perf_counter()
        while time.perf_counter() - wall < 0.2:  # runnable all along: on a CPU or queued for one
            pass
        busy, wall = clock() - start, time.perf_counter() - wall
        assert 0.8 * wall <= busy <= wall + 0.01
        start = clock()
        time.sleep(0.2)  # what a rank waiting in a gloo collective does
        assert clock() - start < 0.05  # the wake-up's wait for a CPU counts: a few ms on a loaded machine
    finally:
        clock.close()


def test_one_rank_monitor_reports_its_mean_step_time_and_data_wait_per_step():
    ticks = iter([0.0, 0.1, 1.0, 1.3, 5.0, 5.5])
    monitor = StragglerMonitor(0, 1, clock=lambda: next(ticks))
    monitor.start_compute()
    monitor.end_step(0.02)  # compute 0.1
    monitor.start_compute()
    monitor.end_step(0.04)  # compute 0.3
    record = monitor.interval(step=2)
    assert record[names.PERF_STEP_TIME_S_MAX] == pytest.approx((0.02 + 0.1 + 0.04 + 0.3) / 2)
    assert record[names.PERF_STEP_TIME_S_MEDIAN] == record[names.PERF_STEP_TIME_S_MAX]
    assert record[names.PERF_DATA_WAIT_S_MAX] == pytest.approx(0.03)
    assert record[names.PERF_SLOWEST_RANK] == 0.0 == record[names.PERF_DATA_WAIT_SLOWEST_RANK]
    monitor.start_compute()
    monitor.end_step(0.0)  # compute 0.5: the next interval starts afresh
    assert monitor.interval(step=3)[names.PERF_STEP_TIME_S_MAX] == pytest.approx(0.5)
    monitor.close()
    monitor.close()


def test_straggler_metric_names_are_the_issues():
    assert (names.PERF_STEP_TIME_S_MAX, names.PERF_STEP_TIME_S_MEDIAN, names.PERF_SLOWEST_RANK) == (
        "perf/step_time_s_max", "perf/step_time_s_median", "perf/slowest_rank")
    assert names.best_direction(names.PERF_SLOWEST_RANK) is None
    assert names.best_direction(names.PERF_STEP_TIME_S_MAX) == "min"


def test_on_cuda_the_compute_figure_is_the_training_forwards_event_time(monkeypatch):
    """The CUDA path's wiring without a GPU: torch.cuda.Event replaced by one whose clock is a counter (1 ms per
    record), so a pair around each training-mode forward reads 1 ms; evaluation forwards record nothing."""
    import itertools

    import torch

    ticks = itertools.count()

    class FakeEvent:
        def __init__(self, enable_timing: bool = False):
            assert enable_timing

        def record(self):
            self.ms = next(ticks)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return float(end.ms - self.ms)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    model = torch.nn.Linear(2, 2)
    monitor = StragglerMonitor(0, 1, device=torch.device("cuda"), module=model)
    for _ in range(2):  # two steps of two micro-batches
        monitor.start_compute()
        model(torch.zeros(1, 2))
        model(torch.zeros(1, 2))
        monitor.end_step(0.5)
    model.eval()
    model(torch.zeros(1, 2))  # an evaluation: not a step's
    record = monitor.interval(step=2)
    assert record[names.PERF_STEP_TIME_S_MAX] == pytest.approx(0.5 + 2e-3)  # per step: 2 forwards of 1 ms
    monitor.close()
    model.train()
    model(torch.zeros(1, 2))  # hooks removed
    assert monitor.interval(step=3)[names.PERF_STEP_TIME_S_MAX] == 0.0


def test_on_cuda_the_monitor_needs_the_model():
    import torch

    with pytest.raises(ValueError, match="module"):
        StragglerMonitor(0, 1, device=torch.device("cuda"))
