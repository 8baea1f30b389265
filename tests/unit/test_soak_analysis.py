"""bench/soak.py's analysis on synthetic samples: a leak, a slow-down and a disk that outgrows keep_last are
caught; a flat run passes. (The soak itself is not run in CI: docs/scale-mlflow.md has its figures and command.)"""
from __future__ import annotations

import pytest
from helpers import load_bench

soak = load_bench("soak")


def _samples(rss_mb_per_1000: float = 0.0, slowdown: float = 0.0, checkpoints_on_disk: int = 2,
             steps: int = 5000, every: int = 250) -> list[dict]:
    out = []
    for i, step in enumerate(range(every, steps + 1, every)):
        frac = step / steps
        n_ckpt = min(checkpoints_on_disk, step // 250)
        out.append({
            "step": step, "time": 1000.0 + 0.3 * step, "loadavg_1m": 1.0,
            "ranks": {str(r): {"rss_bytes": int((800 + rss_mb_per_1000 * step / 1000 + (i % 3) * 0.5) * 1e6),
                               "cpu_s": 0.25 * step * (1 + slowdown * frac / 2), "workers_rss_bytes": int(300e6),
                               "workers": 1, "workers_cpu_s": 0.1 * step} for r in range(2)},
            "step_s": 0.3 * (1 + slowdown * frac), "run_dir_bytes": 10_000 + 4 * step, "run_dir_files": 5,
            "checkpoint_bytes": n_ckpt * 15_000_000, "checkpoints": [f"step_{s}" for s in range(250, 250 * n_ckpt + 1, 250)],
            "mlflow_rows": {"metrics": 20 * step // 50 + step, "system_metrics": step}, "mlflow_db_bytes": 100 * step,
            "mlflow_artifact_bytes": n_ckpt * 15_000_000, "mlflow_artifact_files": 4,
        })
    return out


def test_slope_and_drift_are_exact_on_lines():
    assert soak.slope_per_1000([0, 1000, 2000], [5.0, 7.0, 9.0]) == pytest.approx(2.0)
    assert soak._drift([1.0] * 5 + [1.1] * 5) == pytest.approx(0.1)
    assert soak._drift([3.0]) is None


def test_a_flat_run_meets_every_target():
    a = soak.analyse(_samples(), warmup_steps=1000, keep_last=2)
    t = a["targets"]
    assert t["rss_ok"] and t["step_time_ok"] and t["disk_ok"], t
    assert abs(t["rss_growth_mb_per_1000_steps_max"]) < 1
    assert a["mlflow_metric_rows_per_1000_steps"] == pytest.approx(400, rel=0.01)  # system rows left out


def test_a_leak_a_slowdown_and_an_unbounded_disk_are_caught():
    a = soak.analyse(_samples(rss_mb_per_1000=8.0), warmup_steps=1000, keep_last=2)
    assert not a["targets"]["rss_ok"] and a["targets"]["rss_growth_mb_per_1000_steps_max"] == pytest.approx(8, rel=0.1)
    assert not soak.analyse(_samples(slowdown=0.2), warmup_steps=1000, keep_last=2)["targets"]["step_time_ok"]
    assert not soak.analyse(_samples(checkpoints_on_disk=5), warmup_steps=1000, keep_last=2)["targets"]["disk_ok"]


def test_the_report_of_a_budget_stopped_run_names_the_steps_done():
    samples = _samples(steps=1500)
    res = {"steps": 5000, "steps_done": 1500, "ranks": 2, "wall_s": 1740.0, "keep_last": 2, "budget_s": 1740.0,
           "stopped_by_budget": True, "samples": samples, "final_mlflow_artifact_bytes": 31_000_000,
           "analysis": soak.analyse(samples, warmup_steps=500, keep_last=2)}
    text = soak.report(res)
    assert text.startswith("1500 steps (stopped by the 29-minute budget after 1500 of max_steps=5000), 2 ranks")
    rows = [line for line in text.splitlines() if line.startswith("| 1500 |")]
    # the last sample: step time 0.3 s, rank 0's CPU seconds over the last 250 steps / 250 = 0.25, RSS 800 + 1 MB
    assert rows == ["| 1500 | 0.300 | 0.250 | 801, 801 | 2 (30.0 MB) | 1.0 |"], rows
