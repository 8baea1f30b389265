"""`--resume auto` of a run directory whose MLflow run went on elsewhere (issue 46 item 4): a job A stopped at step
3, its MLflow run continued from another directory B with ``--resume-from <run id>`` and finished at step 6, then
``--resume auto`` in A. MLflow keeps the first value of a (metric, step), so A's new records from step 4 on could
never reach the run: the job is refused with one line (what happened, how to go on), exit 2, and the run is left
as B made it (its history equals A's then B's metrics.jsonl). The way out the line names (a new MLflow run for A:
remove A's mlflow_run.json) gives a run whose history equals A's metrics.jsonl, every record.

Before: A's resume "continued" the FINISHED run with no word, exit 0, and none of its records from step 4 on
reached it (metrics.jsonl and MLflow disagreed).

Real `albert-dist train` processes (1 rank, the tiny recipe at 16 tokens) and a local SQLite MLflow store.
"""
from __future__ import annotations

import json

import pytest
from helpers import read_metrics, run_cli

pytestmark = pytest.mark.integration
pytest.importorskip("mlflow")

RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
SHORT = ["engine.zero_stage=0", "engine.train_micro_batch_size_per_gpu=1", "data.max_seq_length=16",
         "data.max_predictions_per_seq=2", "data.num_workers=0", "data.eval_examples=2", "progress_bar=false",
         "log_interval_steps=1", "eval_interval_steps=0", "tracking.log_system_metrics=false",
         "tracking.log_model=false", "optimizer.warmup_steps=1"]
KEY = "train/loss"


def _train(uri: str, run_dir, max_steps: int, *extra: str):
    return run_cli("train", "--config", RECIPE, *SHORT, f"tracking.tracking_uri={uri}", f"run_dir={run_dir}",
                   f"max_steps={max_steps}", *extra)


def _history(uri: str, run_id: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, KEY))


def _local(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r[KEY]) for r in read_metrics(run_dir, KEY)]


def test_resume_auto_of_a_run_continued_elsewhere_is_refused_and_loses_no_record(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    a, b = tmp_path / "a", tmp_path / "b"
    first = _train(uri, a, 3)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = json.loads((a / "mlflow_run.json").read_text())["run_id"]
    went_on = _train(uri, b, 6, "--resume-from", run_id)
    assert went_on.returncode == 0, went_on.stderr[-3000:]
    before = _history(uri, run_id)
    assert [s for s, _ in before] == list(range(1, 7))
    assert before == sorted(_local(a) + [r for r in _local(b) if r[0] > 3])  # A's steps, then B's

    again = _train(uri, a, 6, "--resume", "auto")
    said = again.stdout + again.stderr
    assert again.returncode == 2, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    lines = [x for x in said.splitlines() if f"MLflow run {run_id}" in x and "went on without this directory" in x]
    assert len(lines) == 1, said[-3000:]
    line = lines[0]
    assert str(b.resolve()) in line and "step 6" in line and "step 3" in line and "mlflow_run.json" in line
    assert _history(uri, run_id) == before  # untouched
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["run_dir"] == str(b.resolve())

    (a / "mlflow_run.json").unlink()  # the way on the line names: A trains on into a new MLflow run
    own = _train(uri, a, 6, "--resume", "auto")
    assert own.returncode == 0, own.stderr[-3000:]
    new_id = json.loads((a / "mlflow_run.json").read_text())["run_id"]
    assert new_id != run_id
    assert [s for s, _ in _local(a)] == list(range(1, 7))
    assert _history(uri, new_id) == _local(a)  # every record of A's metrics.jsonl, once
