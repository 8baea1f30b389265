"""`DownstreamRuns` in a local MLflow store (in process, no server): child runs of a scored run, one per
fine-tune, an earlier identical fine-tune replaced rather than doubled."""
from __future__ import annotations

import pytest

pytest.importorskip("mlflow")


def test_the_same_fine_tune_logged_again_replaces_its_child_run(tmp_path):
    from mlflow import MlflowClient

    from albert_dist.tracking.finetune_runs import DownstreamRuns

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("pretrain")).info.run_id
    runs = DownstreamRuns(uri, parent, None, None)
    params = {"task": "sst2", "seed": 1, "lr": 1e-3, "checkpoint_step": 500, "init": "pretrained"}
    first = runs.log_child("sst2-step500-seed1-pretrained", {**params, "model": "/runs/a"}, {"accuracy": 0.7})
    # the same checkpoint named by its run id: the same fine-tune, so it replaces the first child
    second = runs.log_child("sst2-step500-seed1-pretrained", {**params, "model": f"runs:/{parent}"},
                            {"accuracy": 0.71})
    # another learning rate is another fine-tune: kept beside it
    third = runs.log_child("sst2-step500-seed1-pretrained", {**params, "lr": 1e-4, "model": "/runs/a"},
                           {"accuracy": 0.6})
    children = client.search_runs([runs.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(c.info.run_id for c in children) == sorted([second, third])
    assert client.get_run(first).info.lifecycle_stage == "deleted"
    assert {c.info.run_id: c.data.metrics["accuracy"] for c in children} == {second: 0.71, third: 0.6}
