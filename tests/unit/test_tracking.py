"""Unit tests of the tracking building blocks that need no server: secret rules, config flattening, run
references, store URIs, the sender's replay of metrics.jsonl (order, timestamps, skipped steps, isolation,
outage) and the uploader's final errors (against an in-memory fake client that fails on demand), checkpoint
snapshots, the comparison table, and the parameter counts."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
import requests
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from albert_dist.tracking.base import JsonlTracker, read_metric_log
from albert_dist.tracking.checkpoints import list_files, snapshot, stage_checkpoint
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.params import flatten
from albert_dist.tracking.secrets import MASK, is_secret_name, redact, scrub_text, secret_values
from albert_dist.tracking.sender import RunSender, is_transient
from albert_dist.tracking.tracker import absolute_uri, parse_run_ref


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "HF_TOKEN", "api_key", "tracking.apiKey", "db_password_file", "authToken",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "client_secret",
                                  "MLFLOW_TRACKING_USERNAME"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer_path", "train_tokens", "pad_token_id", "mask_token", "cls_token",
                                  "max_predictions_per_seq", "keys_per_batch", "tokens_per_s", "monkey",
                                  "USERNAME_HINT", "data.tokenizer_path", "PWD", "OLDPWD", "pwd"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_working_directory_paths_and_short_values_are_not_masked():
    env = {"PWD": "/home/alice/albert", "OLDPWD": "/home/alice", "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp.json",
           "HF_TOKEN": "hf_1234", "MLFLOW_TRACKING_PASSWORD": "s3cret-pw"}  # hf_1234: 7 characters
    values = secret_values(env)
    assert values == ["s3cret-pw"]
    tag = "run_dir: /home/alice/albert/runs/albert-tiny-20260101 (creds /etc/gcp.json, hf_1234, s3cret-pw)"
    assert scrub_text(tag, values) == f"run_dir: /home/alice/albert/runs/albert-tiny-20260101 (creds /etc/gcp.json, hf_1234, {MASK})"


def test_redact_masks_secret_keys_and_env_values_and_uri_userinfo():
    env = {"MLFLOW_TRACKING_PASSWORD": "hunter2-xyz", "HOME": "/root", "X_TOKEN": "abc"}  # "abc": too short
    values = secret_values(env)
    assert values == ["hunter2-xyz"]
    got = redact({"a": {"api_key": "k-123", "note": "pw hunter2-xyz here", "n": 3, "empty_key": None},
                  "uri": "https://bob:pw1@host:5000/x", "l": ["hunter2-xyz"]}, values)
    assert got == {"a": {"api_key": MASK, "note": f"pw {MASK} here", "n": 3, "empty_key": None},
                   "uri": "https://host:5000/x", "l": [MASK]}
    assert scrub_text("see http://u:p@h/p and hunter2-xyz", values) == f"see http://h/p and {MASK}"


def test_flatten_gives_stable_dotted_names():
    cfg = {"model": {"num_hidden_groups": 2, "act": None, "drop": 0.1, "ckpt": False},  # None: not logged
           "data": {"train": [{"paths": ["a", "b"], "weight": 1.0}], "validation": []},
           "tracking": {"api_key": "s3cr3t-value"}}
    assert flatten(cfg) == {
        "model.num_hidden_groups": "2", "model.drop": "0.1", "model.ckpt": "false",
        "data.train.0.paths.0": "a", "data.train.0.paths.1": "b", "data.train.0.weight": "1.0",
        "data.validation": "[]", "tracking.api_key": MASK}


def test_flatten_dataclass_matches_dict():
    cfg = TrackingConfig(experiment_name="e")
    flat = flatten({"tracking": cfg})
    assert flat["tracking.experiment_name"] == "e" and "tracking.tracking_uri" not in flat
    assert flat["tracking.flush_interval_s"] == "5.0"


@pytest.mark.parametrize("ref", ["0123456789abcdef0123456789abcdef", "runs:/0123456789abcdef0123456789abcdef",
                                 "runs:/0123456789abcdef0123456789abcdef/checkpoints"])
def test_parse_run_ref(ref):
    assert parse_run_ref(ref) == "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("ref", ["", "abc", "runs:/", "models:/x/1", "0123456789ABCDEF0123456789ABCDEF0"])
def test_parse_run_ref_rejects(ref):
    with pytest.raises(ValueError, match="not an MLflow run id"):
        parse_run_ref(ref)


@pytest.mark.parametrize("field,value", [("experiment_name", ""), ("flush_interval_s", 0.0),
                                         ("close_timeout_s", -1.0), ("max_backoff_s", 0.5)])
def test_tracking_config_rejects(field, value):
    with pytest.raises(ValueError, match=f"tracking.{field}"):
        TrackingConfig(**{field: value})


class FakeClient:
    """Records delivered batches and artifacts; fails the next `fail_next` calls with a connection error,
    rejects (permanently, like a 400) any metric whose key is in `reject`, and answers 413 for artifact files
    larger than `max_artifact_bytes`."""

    def __init__(self):
        self.metrics, self.params, self.tags, self.artifacts = [], [], [], []
        self.fail_next = 0
        self.reject = set()
        self.max_artifact_bytes = 10**9
        self.lock = threading.Lock()

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                raise MlflowException("API request failed with exception ConnectionRefusedError")
            if any(m.key in self.reject for m in metrics):
                raise MlflowException("bad metric", error_code=INVALID_PARAMETER_VALUE)
            self.metrics += list(metrics)
            self.params += list(params)
            self.tags += list(tags)

    def log_artifact(self, run_id, local_path, artifact_path=None):
        size = os.path.getsize(local_path)
        if size > self.max_artifact_bytes:
            response = requests.Response()
            response.status_code = 413
            raise requests.HTTPError("413 Client Error: Request Entity Too Large", response=response)
        self.artifacts.append(f"{artifact_path}/{os.path.basename(local_path)}")


def fake_run(last_steps=None, params=None):
    """What `open_run` returns: an MLflow Run as far as the sender reads it."""
    metrics = [Metric(k, 0.0, 0, s) for k, s in (last_steps or {}).items()]
    return SimpleNamespace(info=SimpleNamespace(run_id="r", artifact_uri="file:///nowhere"),
                           data=SimpleNamespace(params=params or {}, _metric_objs=metrics))


def make_sender(client, run_dir, run=None, **kw):
    """A RunSender whose run opens through ``client`` (so ``client.fail_next`` fails the opening too)."""
    def open_run(c):
        c.log_batch("r")
        return run or fake_run()

    kw = {"flush_interval_s": 0.05, "retry_backoff_s": 0.01, "max_backoff_s": 0.02, **kw}
    return RunSender(client, str(run_dir), open_run, **kw).start()


def test_transient_classification():
    def http_error(status):
        response = requests.Response()
        response.status_code = status
        return requests.HTTPError(f"{status}", response=response)

    assert is_transient(MlflowException("connection refused"))  # INTERNAL_ERROR -> 500
    assert is_transient(requests.ConnectionError()) and is_transient(ConnectionRefusedError())
    assert is_transient(http_error(503)) and is_transient(http_error(429)) and is_transient(http_error(408))
    assert not is_transient(http_error(413)) and not is_transient(http_error(403))
    assert not is_transient(MlflowException("x", error_code=INVALID_PARAMETER_VALUE))
    assert not is_transient(ValueError("a bug is not an outage"))


def test_sender_replays_the_metric_log_in_order_with_its_steps_and_timestamps(tmp_path):
    local = JsonlTracker(tmp_path)
    for step in range(1, 1201):  # > one log_batch (1000 metrics)
        local.log_metrics({"train/loss": 1.0 / step}, step)
    expected = [("train/loss", 1.0 / r["step"], r["timestamp_ms"], r["step"]) for r in read_metric_log(tmp_path)]
    client = FakeClient()
    client.fail_next = 3  # the server is down for the first attempts
    sender = make_sender(client, tmp_path)
    sender.add_params({"p": "1"})
    assert sender.close(timeout_s=30) == {"params": 0, "tags": 0, "metric_records": 0}
    assert [(m.key, m.value, m.timestamp, m.step) for m in client.metrics] == expected
    assert [(p.key, p.value) for p in client.params] == [("p", "1")]


def test_sender_skips_steps_the_run_holds_and_records_changed_params_as_tags(tmp_path):
    local = JsonlTracker(tmp_path)
    for step in (1, 2, 3, 2, 3, 4):  # a resumed attempt re-ran steps 2-3
        local.log_metrics({"train/loss": float(step), "val/loss": float(step)}, step)
    client = FakeClient()
    sender = make_sender(client, tmp_path, run=fake_run({"train/loss": 1}, params={"a": "1", "b": "2"}))
    sender.add_params({"a": "1", "b": "3", "c": "4"})
    assert sender.close(timeout_s=10)["metric_records"] == 0
    assert [(m.key, m.step) for m in client.metrics if m.key == "train/loss"] == [("train/loss", s) for s in (2, 3, 4)]
    assert [m.step for m in client.metrics if m.key == "val/loss"] == [1, 2, 3, 4]
    assert sender.skipped == 1 + 2 + 2  # train/loss 1 (on the server), both keys' re-run 2 and 3
    assert [(p.key, p.value) for p in client.params] == [("c", "4")]
    assert [(t.key, t.value) for t in client.tags] == [("param_changed.b", "3")]


def test_sender_isolates_a_permanently_rejected_metric(tmp_path):
    JsonlTracker(tmp_path).log_metrics({"loss": 1.0, "bad": 2.0, "acc": 0.5}, 7)
    client = FakeClient()
    client.reject = {"bad"}
    sender = make_sender(client, tmp_path)
    assert sender.close(timeout_s=10)["metric_records"] == 0
    assert sorted((m.key, m.step) for m in client.metrics) == [("acc", 7), ("loss", 7)]
    assert sender.dropped == 1


def test_sender_with_the_server_down_reports_what_is_left(tmp_path):
    local = JsonlTracker(tmp_path)
    client = FakeClient()
    client.fail_next = 10**9  # down for good
    sender = make_sender(client, tmp_path)
    for step in range(1, 101):
        local.log_metrics({"loss": 1.0}, step)
    assert not sender.opened.wait(0.3) and sender.run is None and sender.error is None
    t0 = time.monotonic()
    assert sender.close(timeout_s=0.3) == {"params": 0, "tags": 0, "metric_records": 100}
    assert time.monotonic() - t0 < 3.0 and client.metrics == []


def test_metric_log_reader_ignores_a_partial_last_line(tmp_path):
    JsonlTracker(tmp_path).log_metrics({"loss": 1.0}, 1)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "loss"')  # being written, or cut by a kill
    records = list(read_metric_log(tmp_path))
    assert [r["step"] for r in records] == [1] and records[0]["_end"] == len((tmp_path / "metrics.jsonl")
                                                                              .read_text().splitlines()[0]) + 1


def test_jsonl_tracker_cuts_back_to_the_resumed_step(tmp_path):
    local = JsonlTracker(tmp_path)
    for step in range(1, 6):
        local.log_metrics({"loss": float(step)}, step)
    JsonlTracker(tmp_path, resumed_step=3)
    assert [r["step"] for r in read_metric_log(tmp_path)] == [1, 2, 3]
    JsonlTracker(tmp_path, resumed_step=0)  # a fresh job in an old run directory
    assert list(read_metric_log(tmp_path)) == []
    local.log_params({"derived": {"unique_parameters": 10}})  # build_tracker's counts, then the trainer's config
    local.log_params({"model": {"a": 1}, "derived": {"world_size": 2}})
    assert json.loads((tmp_path / "params.json").read_text()) == {
        "model": {"a": 1}, "derived": {"unique_parameters": 10, "world_size": 2}}


def test_refused_upload_is_final_for_that_file_and_the_rest_continue(tmp_path, caplog):
    caplog.set_level("INFO", logger="albert_dist")
    client = FakeClient()
    client.max_artifact_bytes = 1000
    sender = make_sender(client, tmp_path)
    ck = tmp_path / "ck" / "step_2"
    ck.mkdir(parents=True)
    (ck / "big.pt").write_bytes(b"x" * 5000)
    (ck / "small.pt").write_bytes(b"y" * 10)
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"z" * 500)
    sender.submit(stage_checkpoint(str(ck), 2))
    sender.submit({"staging": str(model), "dest": "model/hf"})
    t0 = time.monotonic()
    sender.close(timeout_s=30)
    assert sender.pending_uploads == []  # nothing left pending: the 413 is not retried
    assert time.monotonic() - t0 < 10
    assert client.artifacts == ["checkpoints/step_2/small.pt", "model/hf/weights.bin"]  # no COMPLETE.json
    assert sender.completed == [] and sender.failed == ["checkpoints/step_2/big.pt"]
    assert "checkpoints/step_2/big.pt (5000 bytes)" in caplog.text
    assert "artifact weights.bin uploaded to model/hf (1 files, 0.0 MB" in caplog.text  # a few files are named


def test_a_checkpoint_waiting_behind_an_upload_is_dropped_for_a_newer_one(tmp_path):
    """Only the newest checkpoint matters: one queued behind a running upload is dropped when a newer one is
    queued; one queued behind params only (quick items) is uploaded."""
    class SlowClient(FakeClient):
        def __init__(self):
            super().__init__()
            self.running, self.gate = threading.Event(), threading.Event()

        def log_artifact(self, run_id, local_path, artifact_path=None):
            if artifact_path.startswith("model"):  # the upload the checkpoints queue behind
                self.running.set()
                self.gate.wait(30)
            super().log_artifact(run_id, local_path, artifact_path)

    def checkpoint(step):
        path = tmp_path / "ck" / f"step_{step}"
        path.mkdir(parents=True)
        (path / "model.pt").write_bytes(b"w" * 8)
        return stage_checkpoint(str(path), step)

    client = SlowClient()
    sender = make_sender(client, tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"z" * 8)
    sender.submit({"staging": str(model), "dest": "model/hf"})
    assert client.running.wait(10)
    sender.submit(checkpoint(2))
    sender.submit(checkpoint(4))  # step 2 waits behind the model upload: dropped
    assert [job["step"] for job in sender.pending_uploads if "step" in job] == [4]
    client.gate.set()
    deadline = time.monotonic() + 10
    while sender.pending_uploads and time.monotonic() < deadline:  # nothing is uploading now
        time.sleep(0.01)
    sender.add_params({"p": "1"})
    sender.submit(checkpoint(6))
    sender.submit(checkpoint(8))  # step 6 waits behind params at most: kept
    sender.close(timeout_s=30)
    assert sender.pending_uploads == [] and sender.completed == [4, 6, 8] and sender.failed == ["checkpoints/step_2"]
    assert not (tmp_path / "ck" / ".mlflow_upload_step_2").exists()
    assert [a for a in client.artifacts if a.endswith("COMPLETE.json")] == \
        [f"checkpoints/step_{s}/COMPLETE.json" for s in (4, 6, 8)]


@pytest.mark.parametrize("uri,expected", [
    ("sqlite:///rel/m.db", "sqlite:///{cwd}/rel/m.db"), ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),
    ("mlruns", "file://{cwd}/mlruns"), ("file:./mlruns", "file://{cwd}/mlruns"),
    ("file:///abs/mlruns", "file:///abs/mlruns"), ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("databricks", "databricks")])
def test_relative_store_uris_are_made_absolute(uri, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_uri(uri) == expected.format(cwd=os.path.realpath(tmp_path))


def test_snapshot_survives_deletion_of_the_original(tmp_path):
    src = tmp_path / "step_4"
    (src / "sub").mkdir(parents=True)
    (src / "a.pt").write_bytes(b"x" * 10)
    (src / "sub" / "b.pt").write_bytes(b"y" * 3)
    snapshot(str(src), str(tmp_path / "snap"))
    for p in (src / "a.pt", src / "sub" / "b.pt"):
        os.remove(p)  # the engine's keep_last rotation
    assert list_files(str(tmp_path / "snap")) == {"a.pt": 10, "sub/b.pt": 3}
    assert (tmp_path / "snap" / "a.pt").read_bytes() == b"x" * 10


def test_model_param_counts_match_closed_form():
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.config import AlbertConfig
    from albert_dist.model.sharing import block_parameter_counts, parameter_count
    from albert_dist.model.sharing import model_param_counts

    cfg = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=5, num_hidden_groups=2,
                       inner_group_num=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    counts = model_param_counts(AlbertForPreTraining(cfg))
    attn, ffn = block_parameter_counts(cfg)
    unique = parameter_count(cfg)
    assert counts["unique_parameters"] == unique
    # 5 layers x 2 inner blocks executed, 2 groups x 2 inner blocks stored
    assert counts["total_parameters"] == unique + (5 * 2 - 2 * 2) * (attn + ffn)
    assert counts["group_0_parameters"] == counts["group_1_parameters"] == 2 * (attn + ffn)


def test_compare_table_rows():
    import pandas as pd

    from albert_dist.tracking.compare import format_table, run_labels, table_rows

    a, b = "a" * 32, "b" * 32
    df = pd.DataFrame({"run_id": [a, b], "tags.mlflow.runName": ["one", "two"],
                       "params.model.num_hidden_groups": ["1", "2"], "params.same": ["s", "s"],
                       "params.y": [None, "3"], "metrics.train/loss": [2.0, 3.5], "metrics.train/lr": [1e-4, 2e-4],
                       "metrics.val/mlm_accuracy": [0.25, float("nan")], "metrics.mem/peak_gib_rank0": [1.0, 1.0],
                       "metrics.val/unigram_mlm_accuracy": [0.05, 0.06],
                       "metrics.system/cpu_utilization_percentage": [50.0, 60.0]})
    histories = {a: {"train/loss": [(1, 3.0), (2, 1.0), (3, 2.0)], "val/mlm_accuracy": [(3, 0.25)]},
                 b: {"train/loss": [(1, 4.0), (2, 3.5)]}}
    rows = table_rows(df, histories)
    assert rows == [["run", "one", "two"], ["run_id", a, b], ["model.num_hidden_groups", "1", "2"], ["y", "-", "3"],
                    ["train/loss.final", "2", "3.5"], ["train/loss.best", "1", "3.5"],
                    ["train/lr.final", "0.0001", "0.0002"],  # no best for a learning rate
                    ["val/mlm_accuracy.final", "0.25", "-"], ["val/mlm_accuracy.best", "0.25", "-"],
                    ["val/unigram_mlm_accuracy", "0.05", "0.06"]]  # a constant of the set: no final/best
    assert format_table(rows).splitlines()[2].split() == ["model.num_hidden_groups", "1", "2"]
    assert run_labels(df) == ["one (num_hidden_groups=1, y=-)", "two (num_hidden_groups=2, y=3)"]


def test_compare_plot_draws_each_runs_unigram_baseline(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from albert_dist.tracking import compare

    a, b = "a" * 32, "b" * 32
    df = pd.DataFrame({"run_id": [a, b], "tags.mlflow.runName": ["one", "two"],
                       "metrics.val/unigram_mlm_accuracy": [0.05, float("nan")]})
    histories = {a: {"val/mlm_accuracy": [(10, 0.1), (20, 0.12)]}, b: {"val/mlm_accuracy": [(10, 0.09)]}}
    drawn = []
    real_savefig = plt.Figure.savefig

    def savefig(fig, path, **kw):
        for ax in fig.axes:
            drawn.extend((ax.get_title(), tuple(line.get_ydata())) for line in ax.get_lines())
        return real_savefig(fig, path, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    compare.plot_curves(df, histories, ["mlm_accuracy"], str(tmp_path / "c.png"))
    ys = [y for _, y in drawn]
    assert (0.05, 0.05) in ys  # run one's baseline; run two logged none, so no line for it
    assert sum(1 for y in ys if len(set(y)) == 1 and len(y) == 2) == 1
    assert "unigram baseline" in drawn[0][0]
    assert (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.parametrize("key,direction", [("train/loss", "min"), ("val/mlm_accuracy", "max"),
                                           ("perf/tokens_per_s", "max"), ("perf/mfu", "max"),
                                           ("mem/peak_gib_max", None), ("train/lr", None), ("train/grad_norm", None),
                                           ("val/mlm_accuracy_over_unigram", "max"), ("system/cpu_utilization_percentage", None)])
def test_best_direction(key, direction):
    from albert_dist.engine.metric_names import best_direction

    assert best_direction(key) == direction


class HangingServerClient(FakeClient):
    """An `MlflowClient` stand-in whose server answered at start and then stopped answering: every later
    call fails with a connection error, ending the run hangs."""

    tracking_uri = "http://127.0.0.1:9"

    def __init__(self, tracking_uri=None):
        super().__init__()
        self.down = False

    def get_experiment_by_name(self, name):
        return SimpleNamespace(experiment_id="1", tags={"mlflow.experimentKind": "custom_model_development"})

    def create_run(self, experiment_id, run_name=None):
        return SimpleNamespace(info=SimpleNamespace(run_id="f" * 32, experiment_id="1", artifact_uri="x"),
                               data=SimpleNamespace(params={}, tags={}, _metric_objs=[]))

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        if self.down:
            raise requests.ConnectionError("connection refused")
        super().log_batch(run_id, metrics, params, tags)

    def log_artifact(self, run_id, local_path, artifact_path=None):
        raise requests.ConnectionError("connection refused")

    def set_terminated(self, run_id, status=None):
        time.sleep(3600)


def test_stop_signal_close_is_bounded_and_says_what_is_left(tmp_path, monkeypatch, caplog):
    import mlflow

    from albert_dist.tracking.tracker import MLflowTracker, read_state

    client = HangingServerClient()
    monkeypatch.setattr(mlflow, "MlflowClient", lambda tracking_uri=None: client)
    cfg = TrackingConfig(tracking_uri="http://127.0.0.1:9", experiment_name="e", close_timeout_s=600.0,
                         flush_interval_s=0.05, retry_backoff_s=0.05, max_backoff_s=0.2, log_system_metrics=False)
    tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "run"))
    assert tracker.run_id == "f" * 32
    deadline = time.monotonic() + 30
    while not client.tags and time.monotonic() < deadline:  # the start's tags sent (by the sender thread: late on a
        time.sleep(0.01)                                    # loaded machine, then left over: "tags": 12)
    client.down = True  # the server goes away mid-run
    for step in range(1, 4):
        tracker.log_metrics({"train/loss": 1.0 / step}, step)
    tracker.log_checkpoint(fake_checkpoint_dir(tmp_path), 3)
    t0 = time.monotonic()
    left = tracker.close("KILLED")  # SIGTERM: the job must exit within its grace period
    assert time.monotonic() - t0 < 8.0
    assert left == {"params": 0, "tags": 0, "metric_records": 3, "uploads": 1, "run": True}
    assert "3 metric records" in caplog.text and "checkpoints/step_3" in caplog.text and "tracking sync" in caplog.text
    state = read_state(tmp_path / "run")
    assert state["status"] == "KILLED" and [j["step"] for j in state["pending"]] == [3]
    assert os.path.isdir(state["pending"][0]["staging"])  # kept for the next attempt / tracking sync


def fake_checkpoint_dir(root):
    path = root / "ck" / "step_3"
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(b"w" * 64)
    return str(path)


def test_a_sqlite_store_keeps_its_artifacts_beside_it_whatever_the_working_directory(tmp_path, monkeypatch):
    """docs/mlflow.md: artifacts in mlruns/ beside the store (MLflow's default would be the job's cwd/mlruns)."""
    from mlflow import MlflowClient

    from albert_dist.tracking.tracker import MLflowTracker

    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{store / 'mlruns.db'}"
    cfg = TrackingConfig(tracking_uri=uri, experiment_name="beside", log_system_metrics=False, flush_interval_s=0.1)
    tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "run"))
    note = tmp_path / "note.txt"
    note.write_text("hello")
    tracker.log_artifact(str(note), "notes")
    assert tracker.close("FINISHED")["uploads"] == 0
    exp = MlflowClient(uri).get_experiment_by_name("beside")
    assert exp.artifact_location == (store / "mlruns").as_uri()
    assert list((store / "mlruns").rglob("notes/note.txt")) and not (elsewhere / "mlruns").exists()


def test_checkpoint_retention_draws_no_download_bars_into_the_log(tmp_path, monkeypatch, capfd):
    """Retention reads every checkpoint's COMPLETE.json back; MLflow's per-download tqdm bars stayed out of
    the job's log (they were three per save), and the newest checkpoints are kept."""
    from mlflow import MlflowClient

    from albert_dist.tracking.tracker import MLflowTracker

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    cfg = TrackingConfig(tracking_uri=uri, experiment_name="bars", log_system_metrics=False, flush_interval_s=0.05)
    tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "run"), keep_last_checkpoints=2)
    for step in (1, 2, 3):
        path = tmp_path / "ck" / f"step_{step}"
        path.mkdir(parents=True)
        (path / "model.pt").write_bytes(b"w" * 64)
        tracker.log_checkpoint(str(path), step)
        deadline = time.monotonic() + 30
        while tracker._sender.pending_uploads and time.monotonic() < deadline:  # saves come one at a time
            time.sleep(0.02)
    assert tracker.close("FINISHED")["uploads"] == 0
    kept = [a.path for a in MlflowClient(uri).list_artifacts(tracker.run_id, "checkpoints")]
    assert kept == ["checkpoints/step_2", "checkpoints/step_3"]
    assert "Downloading artifacts" not in capfd.readouterr().err


def test_object_store_credentials_are_masked(monkeypatch):
    """AWS/GCS credentials: by variable (AWS_ACCESS_KEY_ID, whose last word is "id", included), by form (an
    access key id in any text; the signing parameters of presigned S3 and GCS URLs). Examples are AWS's and
    Google's documented sample values."""
    key_id, secret = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLETOKEN")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GS_SECRET_ACCESS_KEY",
                 "GS_ACCESS_KEY_ID"):
        assert is_secret_name(name), name
    assert not is_secret_name("AWS_ENDPOINT_URL") and not is_secret_name("AWS_DEFAULT_REGION")
    text = (f"id=testing-key-id secret={secret} token=FwoGZXIvYXdzEXAMPLETOKEN other={key_id} "
            f"https://b.s3.amazonaws.com/k?X-Amz-Credential={key_id}%2F20261202%2Fus-east-1&X-Amz-Signature=abc123 "
            "https://storage.googleapis.com/b/o?X-Goog-Signature=deadbeef&X-Goog-Date=20261202 "
            "endpoint http://127.0.0.1:9000")
    out = scrub_text(text)
    for leaked in ("testing-key-id", secret, "FwoGZXIvYXdzEXAMPLETOKEN", key_id, "abc123", "deadbeef"):
        assert leaked not in out, leaked
    assert "X-Goog-Date=20261202" in out and "endpoint http://127.0.0.1:9000" in out
    assert redact({"env": {"AWS_ACCESS_KEY_ID": "x"}})["env"]["AWS_ACCESS_KEY_ID"] == MASK


class DirArtifactClient:
    """An MLflow client as far as checkpoint reading goes: artifacts are the files under ``root``."""

    def __init__(self, root):
        self.root = root

    def list_artifacts(self, run_id, path):
        from mlflow.entities import FileInfo

        base = self.root / path
        return [FileInfo(f"{path}/{p.name}", p.is_dir(), None if p.is_dir() else p.stat().st_size)
                for p in sorted(base.iterdir())] if base.is_dir() else []

    def download_artifacts(self, run_id, path, dst):
        src, out = self.root / path, os.path.join(dst, os.path.basename(path))
        (shutil.copytree if src.is_dir() else shutil.copy)(src, out)
        return out


def test_download_of_a_missing_step_lists_the_steps_the_run_holds(tmp_path):
    """``--step N`` of a run that lacks it names the retained steps (docs/finetune.md says so); an incomplete
    upload (its marker names a missing file) is not one of them."""
    from albert_dist.tracking.checkpoints import CHECKPOINTS_ARTIFACT_DIR, MARKER_NAME, download_checkpoint

    for step, complete in ((250, True), (500, True), (750, False)):
        d = tmp_path / "store" / CHECKPOINTS_ARTIFACT_DIR / f"step_{step}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(b"x" * step)
        files = {"model.pt": step} if complete else {"model.pt": step, "optim.pt": 1}
        (d / MARKER_NAME).write_text(json.dumps({"files": files, "tag": f"global_step{step}"}))
    client = DirArtifactClient(tmp_path / "store")
    with pytest.raises(FileNotFoundError, match=r"\(step 300\) .*it holds steps 250, 500$"):
        download_checkpoint(client, "r", str(tmp_path / "dl"), 300)
    step, tag_dir = download_checkpoint(client, "r", str(tmp_path / "dl"), None)
    assert step == 500 and os.path.getsize(os.path.join(tag_dir, "model.pt")) == 500


def test_log_checkpoints_off_keeps_checkpoints_out_of_the_run_and_other_artifacts_in(tmp_path):
    """`tracking.log_checkpoints=false` (checkpoints stay on the job's file system only): a saved checkpoint is
    not uploaded under checkpoints/, a config file still is; with the default (true) the same save is uploaded."""
    from mlflow import MlflowClient

    from albert_dist.tracking.tracker import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    note = tmp_path / "config.yaml"
    note.write_text("seed: 1\n")
    uploaded = {}
    for log_checkpoints in (False, True):
        cfg = TrackingConfig(tracking_uri=uri, experiment_name="ck", log_system_metrics=False, flush_interval_s=0.05,
                             log_checkpoints=log_checkpoints)
        tracker = MLflowTracker(cfg, run_dir=str(tmp_path / f"run-{log_checkpoints}"))
        root = tmp_path / f"ck-{log_checkpoints}"
        root.mkdir()
        tracker.log_checkpoint(fake_checkpoint_dir(root), 3)
        tracker.log_artifact(str(note), "config")
        assert tracker.close("FINISHED")["uploads"] == 0
        client = MlflowClient(uri)
        uploaded[log_checkpoints] = sorted(a.path for a in client.list_artifacts(tracker.run_id))
    assert uploaded == {False: ["config"], True: ["checkpoints", "config"]}


def test_sync_of_a_run_that_recorded_no_status_takes_it_from_the_newest_checkpoint(tmp_path):
    """`albert-dist tracking sync` of a run made with tracking.enabled=false (no mlflow_run.json): a run that
    reached its final checkpoint ends FINISHED in MLflow (it ended KILLED before), a stop checkpoint's KILLED."""
    import mlflow

    from albert_dist.tracking.sync import job_status, sync

    def run_dir(name, reason):
        d = tmp_path / name
        tag = d / "checkpoints" / "step_5"
        tag.mkdir(parents=True)
        (tag / "albert_dist.json").write_text(json.dumps({"step": 5, "world_size": 1, "zero_stage": 0,
                                                          "config_hash": "x", "reason": reason}))
        (d / "checkpoints" / "latest").write_text("step_5")
        (d / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 1.5}) + "\n")
        return d

    assert job_status(str(run_dir("stopped", "stop"))) == "KILLED"
    assert job_status(str(run_dir("interval", "interval"))) == "KILLED"  # died after an interval save
    assert job_status(str(tmp_path / "none")) == "KILLED"  # no checkpoint at all
    finished = run_dir("finished", "final")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert not any(sync(str(finished), tracking_uri=uri, timeout_s=30).values())
    (run,) = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("albert_dist")
                                                  .experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["loss"] == 1.5


def test_compare_against_a_local_store_that_does_not_exist_names_it_and_creates_nothing(tmp_path):
    """`albert-dist compare RUN_ID` with no store: MLflow created an empty mlruns.db and said the run was not
    found; now the missing store is named and no file is made."""
    from albert_dist.tracking.compare import compare

    store = tmp_path / "nowhere" / "mlruns.db"
    with pytest.raises(ValueError, match=f"no MLflow store at {store}"):
        compare(["0123456789abcdef0123456789abcdef"], None, f"sqlite:///{store}", [], str(tmp_path / "c.png"))
    assert not store.exists() and not store.parent.exists()
