"""A tracking server that is down never costs training time, against a real `mlflow server`: down at start
and up mid-run (one run, every step once), never up (the job ends 0, `albert-dist tracking sync` sends it
all later); checkpoint retention in the run; names that tell runs apart; a relative store used from another
working directory.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from fixtures.mlflow_server import MlflowServer
from helpers import run_cli

from albert_dist.tracking.checkpoints import CHECKPOINTS_ARTIFACT_DIR, complete_checkpoints
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.tracker import MLflowTracker, read_run_id

pytestmark = pytest.mark.e2e
LOOP = str(Path(__file__).with_name("mlflow_fake_loop.py"))


def fake_checkpoint(root: Path, step: int) -> str:
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(os.urandom(2048))
    return str(path)


def test_server_down_at_start_then_up_and_never_up_then_sync(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    server = MlflowServer(tmp_path / "server")  # not started yet: nobody listens on its port
    env = dict(os.environ, MLFLOW_TRACKING_URI=server.uri, OMP_NUM_THREADS="1")
    # 1. never up: the whole job runs without a server and ends 0; a checkpoint and metrics stay pending
    never = tmp_path / "never-up"
    t0 = time.monotonic()
    job = subprocess.run([sys.executable, LOOP, "--run-dir", str(never), "--experiment", "offline", "--steps", "6",
                          "--save-every", "3", "--connect-timeout", "1"], env=env, capture_output=True, text=True,
                         timeout=240)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "RUN_ID=None" in job.stdout and "tracking sync" in job.stderr
    assert read_run_id(never) is None and len(json.loads((never / "mlflow_run.json").read_text())["pending"]) == 1
    job_s = time.monotonic() - t0

    # 2. down at start: the tracker gives the server connect_timeout_s, training starts without it
    cfg = TrackingConfig(tracking_uri=server.uri, experiment_name="offline", connect_timeout_s=1.0,
                         flush_interval_s=0.2, retry_backoff_s=0.2, max_backoff_s=1.0, log_system_metrics=False)
    run_dir = tmp_path / "down-at-start"
    t0 = time.monotonic()
    tracker = MLflowTracker(cfg, run_dir=str(run_dir))
    assert tracker.run_id is None and time.monotonic() - t0 < 10
    starter = threading.Thread(target=server.start)
    step, up_at, slowest = 0, None, 0.0
    while up_at is None or step < up_at + 5:
        step += 1
        t1 = time.monotonic()
        tracker.log_metrics({"train/loss": 10.0 / step}, step)
        if step == 4:
            tracker.log_checkpoint(fake_checkpoint(tmp_path / "ck", 4), 4)
            starter.start()
        slowest = max(slowest, time.monotonic() - t1)
        if up_at is None and step > 4 and not starter.is_alive():
            up_at = step  # the server answers from here on
        time.sleep(0.1)
    assert tracker.close("FINISHED") == {"params": 0, "tags": 0, "metric_records": 0, "uploads": 0, "run": False}
    assert slowest < 0.5, f"a tracker call blocked training for {slowest:.2f} s"
    client = MlflowClient(server.uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "down-at-start"
    history = client.get_metric_history(tracker.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 10.0 / s) for s in range(1, step + 1)]
    assert [s for s, _ in complete_checkpoints(client, tracker.run_id)] == [4]

    # 3. the never-up job, sent afterwards: same result as if the server had been there
    sync = run_cli("tracking", "sync", str(never), env=env, timeout=240)
    assert sync.returncode == 0, sync.stdout[-3000:] + sync.stderr[-3000:]
    run_id = read_run_id(never)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "never-up"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == \
        [(s, 10.0 / s) for s in range(1, 7)]
    assert run.data.params["model.num_hidden_groups"] == "2" and "version.torch" in run.data.tags
    assert [s for s, _ in complete_checkpoints(client, run_id)] == [6]  # step 3 was superseded by 6
    exp = client.get_experiment_by_name("offline")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert len(client.search_runs([exp.experiment_id])) == 2
    # a second sync finds nothing to send
    from albert_dist.tracking.sync import sync

    assert not any(sync(str(never)).values()) and len(client.get_metric_history(run_id, "loss")) == 6
    print(f"never-up job took {job_s:.1f} s")
    server.stop()


def test_checkpoint_retention_keeps_newest_and_resumed_from(mlflow_server, tmp_path):
    client = MlflowClient(mlflow_server.uri)
    cfg = TrackingConfig(tracking_uri=mlflow_server.uri, experiment_name="retention", flush_interval_s=0.2,
                         log_system_metrics=False)
    tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "albert-tiny-20260101-120000"), keep_last_checkpoints=2,
                            keep_steps=(2,))
    other = MLflowTracker(cfg, run_dir=str(tmp_path / "albert-tiny-20260101-120500"))
    for step in (2, 4, 6, 8):
        tracker.log_metrics({"train/loss": 1.0 / step}, step)
        tracker.log_checkpoint(fake_checkpoint(tmp_path / "ck", step), step)
        deadline = time.monotonic() + 60
        while step not in tracker.checkpoints_uploaded and time.monotonic() < deadline:
            time.sleep(0.1)
    tracker.close("FINISHED")
    other.close("FINISHED")
    stored = sorted(a.path for a in client.list_artifacts(tracker.run_id, CHECKPOINTS_ARTIFACT_DIR))
    assert stored == [f"{CHECKPOINTS_ARTIFACT_DIR}/step_{s}" for s in (2, 6, 8)]  # 4 deleted; 2 resumed from
    assert [s for s, _ in complete_checkpoints(client, tracker.run_id)] == [8, 6, 2]
    names = {client.get_run(t.run_id).info.run_name for t in (tracker, other)}
    assert names == {"albert-tiny-20260101-120000", "albert-tiny-20260101-120500"}


def test_relative_store_resume_and_compare_from_another_directory(tmp_path, monkeypatch, capsys):
    from albert_dist import cli

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cfg = TrackingConfig(tracking_uri="sqlite:///mlruns.db", experiment_name="cwd", flush_interval_s=0.2,
                         log_system_metrics=False)
    run_dir = tmp_path / "run"
    first = MLflowTracker(cfg, run_dir=str(run_dir))
    for step in (1, 2):
        first.log_metrics({"train/loss": 1.0 / step}, step)
    first.close("KILLED")
    assert json.loads((run_dir / "mlflow_run.json").read_text())["tracking_uri"] == \
        f"sqlite:///{os.path.realpath(tmp_path / 'a' / 'mlruns.db')}"
    monkeypatch.chdir(tmp_path / "b")  # the requeued job starts elsewhere with the same relative config
    second = MLflowTracker(cfg, run_dir=str(run_dir), resume_run_id=read_run_id(run_dir))
    second.log_metrics({"train/loss": 1.0 / 3}, 3)
    second.close("FINISHED")
    assert second.run_id == first.run_id and not (tmp_path / "b" / "mlruns.db").exists()
    assert cli.main(["compare", str(run_dir), "--output", str(tmp_path / "c.png"), "--metrics", "loss"]) == 0
    table = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert table["run_id"] == [first.run_id] and table["train/loss.final"] == [format(1 / 3, ".6g")]
