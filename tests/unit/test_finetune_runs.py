"""`DownstreamRuns` in a local MLflow store (in process, no server): child runs of a scored run, one per
fine-tune, an earlier identical fine-tune replaced rather than doubled."""
from __future__ import annotations

import pytest

pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(uri, client, experiment id) of one SQLite store (its creation is most of these tests' time)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlruns.db'}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("pretrain")


def test_the_same_fine_tune_logged_again_replaces_its_child_run(store):
    from albert_dist.tracking.finetune_runs import DownstreamRuns

    uri, client, experiment = store
    parent = client.create_run(experiment).info.run_id
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


def test_the_headline_keeps_the_setup_named_by_its_tag(store):
    """downstream/<task>/<metric> on the scored run is one setup's: the first logged, named by the tag
    downstream/<task>/setup; another setup leaves it as it is (it was whichever ran last, unnamed)."""
    from albert_dist.tracking.finetune_runs import DownstreamRuns

    uri, client, experiment = store
    parent = client.create_run(experiment).info.run_id
    runs = DownstreamRuns(uri, parent, None, None)
    assert runs.log_summary("sst2", {"accuracy": 0.8}, 500, "train=67349 lr=0.0001")
    assert not runs.log_summary("sst2", {"accuracy": 0.6}, 500, "train=200 lr=0.0001")  # a quick look
    assert runs.log_summary("sst2", {"accuracy": 0.85}, 1000, "train=67349 lr=0.0001")  # the next checkpoint
    assert runs.log_summary("rte", {"accuracy": 0.55}, 500, "train=200 lr=0.0001")  # each task its own
    history = client.get_metric_history(parent, "downstream/sst2/accuracy")
    assert [(m.step, m.value) for m in history] == [(500, 0.8), (1000, 0.85)]
    tags = client.get_run(parent).data.tags
    assert (tags["downstream/sst2/setup"], tags["downstream/rte/setup"]) == ("train=67349 lr=0.0001",
                                                                             "train=200 lr=0.0001")
