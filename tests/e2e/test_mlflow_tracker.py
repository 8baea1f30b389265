"""MLflowTracker against a real `mlflow server`: partial checkpoint uploads ignored, a server outage that
loses nothing and never blocks, a requeued attempt continuing its run, credentials that appear nowhere, and
`albert-dist compare`. Deterministic metrics (loss = 10 / step) so every logged value can be checked.

tests/e2e/test_mlflow_train.py runs the real trainer (one run per 2-rank job, params, checkpoint artifacts,
--resume-from after kill -9, HF export).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from albert_dist.tracking.checkpoints import (CHECKPOINTS_ARTIFACT_DIR, MARKER_NAME, checkpoint_artifact_path,
                                              complete_checkpoints)
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.tracker import MLflowTracker

pytestmark = pytest.mark.e2e


def fast_retry_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's HTTP layer would retry a refused connection for ~4 min; make the tracker's own loop do it."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def test_partial_checkpoint_upload_is_never_taken_for_complete(mlflow_server, tmp_path):
    client = MlflowClient(mlflow_server.uri)
    exp_id = client.create_experiment("partial")
    run_id = client.create_run(exp_id).info.run_id
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "a.pt").write_bytes(b"a" * 100)
    (ck / "b.pt").write_bytes(b"b" * 50)
    # step 2: files but no marker (upload died); step 3: marker lists a file that is not there
    client.log_artifacts(run_id, str(ck), checkpoint_artifact_path(2))
    client.log_artifact(run_id, str(ck / "a.pt"), checkpoint_artifact_path(3))
    (tmp_path / MARKER_NAME).write_text(json.dumps({"step": 3, "tag": "x", "files": {"a.pt": 100, "b.pt": 50}}))
    client.log_artifact(run_id, str(tmp_path / MARKER_NAME), checkpoint_artifact_path(3))
    # step 1: complete
    client.log_artifacts(run_id, str(ck), checkpoint_artifact_path(1))
    (tmp_path / MARKER_NAME).write_text(json.dumps({"step": 1, "tag": "x", "files": {"a.pt": 100, "b.pt": 50}}))
    client.log_artifact(run_id, str(tmp_path / MARKER_NAME), checkpoint_artifact_path(1))
    assert [s for s, _ in complete_checkpoints(client, run_id)] == [1]
    assert {a.path for a in client.list_artifacts(run_id, CHECKPOINTS_ARTIFACT_DIR)} == \
        {f"{CHECKPOINTS_ARTIFACT_DIR}/step_{i}" for i in (1, 2, 3)}


def test_server_outage_loses_no_metric_step_and_never_stalls(mlflow_server_factory, tmp_path, monkeypatch):
    fast_retry_env(monkeypatch)
    server = mlflow_server_factory()
    cfg = TrackingConfig(tracking_uri=server.uri, experiment_name="outage", flush_interval_s=0.2,
                         retry_backoff_s=0.5, max_backoff_s=2.0, close_timeout_s=120.0)
    tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "run"))
    client = MlflowClient(server.uri)
    step, slowest = 0, 0.0

    def train_step() -> None:
        nonlocal step, slowest
        step += 1
        t0 = time.monotonic()
        tracker.log_metrics({"loss": 10.0 / step}, step)
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.2)

    for _ in range(5):
        train_step()
    deadline = time.monotonic() + 30
    while len(client.get_metric_history(tracker.run_id, "loss")) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    server.stop()
    outage_start = time.monotonic()
    ck = tmp_path / "ck" / "step_8"
    restart = threading.Thread(target=lambda: (time.sleep(8), server.start()))
    restart.start()  # ~8 s down + ~12-20 s start = the outage
    while restart.is_alive():
        train_step()
        if step == 8:
            ck.mkdir(parents=True)
            (ck / "model.pt").write_bytes(os.urandom(4096))
            t0 = time.monotonic()
            tracker.log_checkpoint(str(ck), 8)
            slowest = max(slowest, time.monotonic() - t0)
    restart.join()
    outage_s = time.monotonic() - outage_start
    for _ in range(3):
        train_step()
    tracker.close("FINISHED")
    assert outage_s >= 8, outage_s  # the server was down for the 8 s before its restart, at least
    assert slowest < 1.0, f"a tracker call blocked training for {slowest:.2f} s"
    history = client.get_metric_history(tracker.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 10.0 / s) for s in range(1, step + 1)]
    assert step > 20
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert [s for s, _ in complete_checkpoints(client, tracker.run_id)] == [8]


SECRETS = {
    "MLFLOW_TRACKING_USERNAME": "user-7f3a9c",
    "MLFLOW_TRACKING_PASSWORD": "pw-Zq81mX0c",
    "AWS_SECRET_ACCESS_KEY": "aws-5ecret-Kk2",
    "HF_TOKEN": "hf_tok_Y6uu2",
}


def test_credentials_appear_nowhere_in_the_run(mlflow_server, tmp_path, monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    password = SECRETS["MLFLOW_TRACKING_PASSWORD"]
    uri = mlflow_server.uri.replace("http://", f"http://{SECRETS['MLFLOW_TRACKING_USERNAME']}:{password}@")
    cfg = TrackingConfig(tracking_uri=mlflow_server.uri, experiment_name="secrets", flush_interval_s=0.2)
    run_dir = tmp_path / "run"
    tracker = MLflowTracker(cfg, run_dir=str(run_dir), tags={"launch.command": f"train --token {password}"})
    tracker.log_params({"tracking": {"tracking_uri": uri, "api_key": "cfg-key-9981"},
                        "data": {"note": f"made with {SECRETS['HF_TOKEN']}"}})
    run_dir.mkdir(exist_ok=True)
    (run_dir / "config.yaml").write_text(f"tracking:\n  tracking_uri: {uri}\n  password: cfg-pw-5512\n")
    (run_dir / "ds_config.json").write_text(json.dumps({"auth_token": "cfg-tok-1234",
                                                        "comment": SECRETS["AWS_SECRET_ACCESS_KEY"]}))
    tracker.log_artifact(str(run_dir / "config.yaml"), "config")
    tracker.log_artifact(str(run_dir / "ds_config.json"), "config")
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker.close("FINISHED")

    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(tracker.run_id)
    assert run.data.tags["slurm.job_id"] == "4242"
    assert run.data.params["tracking.api_key"] == "***"
    dump = json.dumps({"params": run.data.params, "tags": run.data.tags, "metrics": run.data.metrics,
                       "name": run.info.run_name})
    artifacts = client.download_artifacts(tracker.run_id, "", str(tmp_path / "dl"))
    files = [p for p in Path(artifacts).rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"config.yaml", "ds_config.json"}
    dump += "".join(p.read_text() for p in files)
    for secret in [*SECRETS.values(), "cfg-key-9981", "cfg-pw-5512", "cfg-tok-1234"]:
        assert secret not in dump, secret
    # the files still carry their non-secret content
    assert f"127.0.0.1:{mlflow_server.port}" in dump


def test_compare_prints_differing_params_and_writes_png(mlflow_server, tmp_path, monkeypatch, capsys):
    from albert_dist import cli

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri)
    exp_id = client.create_experiment("compare")
    runs = []
    for groups, slope in ((1, 1.0), (2, 2.0)):
        run_id = client.create_run(exp_id, run_name=f"g{groups}").info.run_id
        client.log_param(run_id, "model.num_hidden_groups", str(groups))
        client.log_param(run_id, "model.hidden_size", "64")
        for step in range(1, 6):
            client.log_metric(run_id, "train/loss", 10.0 - slope * step, step=step)
            client.log_metric(run_id, "train/mlm_accuracy", 0.1 * slope * step, step=step)
            client.log_metric(run_id, "train/lr", 1e-3 / step, step=step)
        client.log_metric(run_id, "val/loss", 3.0 + groups, step=5)  # one validation point
        client.set_terminated(run_id)
        runs.append(run_id)
    png = tmp_path / "curves.png"
    assert cli.main(["compare", *runs, "--output", str(png)]) == 0
    out = capsys.readouterr().out
    assert "model.num_hidden_groups" in out and "model.hidden_size" not in out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert table["run"] == ["g1", "g2"] and table["model.num_hidden_groups"] == ["1", "2"]
    assert table["train/loss.final"] == ["5", "0"] and table["train/loss.best"] == ["5", "0"]
    assert table["train/mlm_accuracy.final"] == ["0.5", "1"] and table["train/mlm_accuracy.best"] == ["0.5", "1"]
    assert table["val/loss.final"] == ["4", "5"] and "train/lr.final" in table and "train/lr.best" not in table
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # an unknown metric is an error that lists the known ones
    assert cli.main(["compare", *runs, "--metrics", "nosuch", "--output", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "train/loss" in err and "mlm_accuracy" in err and not (tmp_path / "x.png").exists()
    # --experiment selects the same two runs
    png2 = tmp_path / "exp.png"
    assert cli.main(["compare", "--experiment", "compare", "--output", str(png2), "--metrics", "loss", "train/lr"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["run_id"] == runs and rows["run"] == ["g1", "g2"]
    assert png2.stat().st_size > 1000


def test_requeued_attempt_continues_recorded_run_and_resends_spooled_metrics(mlflow_server, tmp_path, monkeypatch):
    """A Slurm requeue: attempt 1 dies with metrics it never sent; attempt 2 (same run directory, `--resume
    auto`) continues the run recorded there and re-sends them from the local spool."""
    from albert_dist.tracking.tracker import read_run_id

    run_dir = str(tmp_path / "run")
    from albert_dist.tracking.sender import RunSender

    # Attempt 1 is killed before its sender sends anything: no timing can promise that (its first send may
    # still be under way when metrics are logged), so the dying attempt's sender never sends, for certain;
    # every later sender (attempt 2's) sends as usual.
    real_drain, dying = RunSender._drain, []
    monkeypatch.setattr(RunSender, "_drain", lambda self: None if not dying or self is dying[0] else real_drain(self))
    never = TrackingConfig(tracking_uri=mlflow_server.uri, experiment_name="requeue", flush_interval_s=3600.0)
    first = MLflowTracker(never, run_dir=run_dir)
    dying.append(first._sender)
    for step in range(1, 6):
        first.log_metrics({"loss": 10.0 / step}, step)  # buffered, never flushed: the job is killed
    client = MlflowClient(mlflow_server.uri)
    assert client.get_metric_history(first.run_id, "loss") == []
    cfg = TrackingConfig(tracking_uri=mlflow_server.uri, experiment_name="requeue", flush_interval_s=0.2)
    second = MLflowTracker(cfg, run_dir=run_dir, resume_run_id=read_run_id(run_dir))
    assert second.run_id == first.run_id
    for step in range(3, 9):  # resumed from a checkpoint at step 2: steps 3-5 are re-run
        second.log_metrics({"loss": 10.0 / step}, step)
    second.close("FINISHED")
    assert second.skipped_steps == 3
    history = client.get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 10.0 / s) for s in range(1, 9)]
    assert client.get_run(first.run_id).info.status == "FINISHED"
    assert len(client.search_runs([client.get_experiment_by_name("requeue").experiment_id])) == 1
