"""A job started from a working directory outside the checkout, with the recipe's relative data and tokenizer
paths: every path is resolved once when the config is loaded (working directory, then the repository root), so
config.yaml holds absolute paths and the MLflow final model (which copies the tokenizer) is written.

One rank, `python -m albert_dist.cli train`, 2 steps of albert-tiny, a real MLflow server (about 30 s).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from helpers import clean_env, run_cli
from mlflow import MlflowClient

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"


def test_run_from_outside_the_checkout_writes_absolute_paths_and_the_final_model(mlflow_server, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = clean_env(MLFLOW_TRACKING_URI=mlflow_server.uri, CUDA_VISIBLE_DEVICES="",
                    PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = run_cli("train", "--config", str(RECIPE), "run_dir=out", "max_steps=2", "optimizer.warmup_steps=1",
                   "checkpoint.save_interval_steps=0", "eval_interval_steps=0", "data.eval_examples=8",
                   "data.num_workers=0", "log_interval_steps=1", "progress_bar=false",
                   "tracking.experiment_name=outside_checkout", "tracking.flush_interval_s=0.5", env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    run_dir = cwd / "out"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["run_dir"] == str(run_dir)
    assert saved["data"]["tokenizer_path"] == str(REPO / "data" / "sample" / "spiece.model")
    assert saved["data"]["train"][0]["paths"] == [str(REPO / "data" / "sample" / "wikitext-2-train-*.txt")]

    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("outside_checkout")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert "model_export_error" not in run.data.tags, run.data.tags.get("model_export_error")
    hf_files = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "model/hf")}
    assert {"config.json", "spiece.model"} <= hf_files, hf_files
    assert (run_dir / "final_model" / "hf" / "spiece.model").is_file()
