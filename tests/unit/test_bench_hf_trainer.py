"""bench/hf_trainer.py's pure parts (the whole loop vs transformers' Trainer, issue 46): the order the runs take
turns in, samples/s over the timed steps (from a trainer metrics log as the trainer writes it), the time to the
common accuracy, the suite's sizes. Its timing is not tested; its runs are processes (`python bench/hf_trainer.py`)."""
from __future__ import annotations

import inspect
import json

import pytest

from tests.helpers import load_bench

H = load_bench("hf_trainer")
RUN_ALL = load_bench("run_all")


def test_the_runs_take_turns_each_pair_mirroring_the_last():
    assert H.order(1) == ["ours", "peer"]
    assert H.order(2) == ["ours", "peer", "peer", "ours"]
    assert H.order(3) == ["ours", "peer", "peer", "ours", "ours", "peer"]


def test_samples_per_s_counts_only_the_timed_steps_from_the_trainers_metrics_log(tmp_path):
    """Records every 20 steps at 40, 20, 10, 16, 32, 64 samples/s (global batch 32): steps 21-120 take
    20*32/20 + 20*32/10 + 20*32/16 + 20*32/32 + 20*32/64 = 32 + 64 + 40 + 20 + 10 = 166 s, so 3200 / 166."""
    rates = [40.0, 20.0, 10.0, 16.0, 32.0, 64.0]
    lines = [json.dumps({"step": 20 * (i + 1), "timestamp_ms": 0, "train/loss": 9.0, "perf/samples_per_s": r})
             for i, r in enumerate(rates)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    train_s, _ = H.conv.read_metrics(str(tmp_path), 32)
    assert H.samples_per_s(train_s, 20, 120, 32) == pytest.approx(3200 / 166)
    assert H.samples_per_s({20: 10.0, 120: 30.0}, 20, 120, 32) == pytest.approx(160.0)
    with pytest.raises(KeyError):
        H.samples_per_s({20: 10.0}, 20, 120, 32)


def test_time_to_the_accuracy_both_reach():
    ours = [{"step": 40, "train_s": 10.0, "mlm_accuracy": 0.05}, {"step": 80, "train_s": 20.0, "mlm_accuracy": 0.07},
            {"step": 120, "train_s": 30.0, "mlm_accuracy": 0.08}]
    peer = [{"step": 40, "train_s": 25.0, "mlm_accuracy": 0.04}, {"step": 80, "train_s": 50.0, "mlm_accuracy": 0.06},
            {"step": 120, "train_s": 75.0, "mlm_accuracy": 0.065}]
    out = H.time_to_target({"ours": ours, "peer": peer})
    assert out == {"target_mlm_accuracy": 0.065, "ours_steps": 80, "ours_train_s": 20.0, "peer_steps": 120,
                   "peer_train_s": 75.0, "ratio_peer_over_ours": 3.75}


def test_the_suite_passes_sizes_run_accepts_and_run_refuses_bad_ones():
    sizes = RUN_ALL.SUITE_ARGS["hf_trainer"]
    assert set(sizes) <= set(inspect.signature(H.run).parameters)
    assert sizes["steps"] % sizes["curve_every"] == 0 and 0 < sizes["warmup"] < sizes["steps"]
    assert "hf_trainer" in RUN_ALL.discover()
    with pytest.raises(ValueError, match="steps a multiple of curve_every"):
        H.run(repeats=1, steps=100, warmup=20, curve_every=40)
