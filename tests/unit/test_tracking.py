"""Unit tests of the tracking building blocks that need no server: secret rules, config flattening, run
references, the buffered sender's retry/ordering/isolation logic (against an in-memory fake client that
fails on demand), checkpoint snapshots, the comparison table, and the parameter counts."""
from __future__ import annotations

import os
import threading
import time

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from albert_dist.tracking.checkpoints import list_files, snapshot
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.params import flatten
from albert_dist.tracking.secrets import MASK, is_secret_name, redact, scrub_text, secret_values
from albert_dist.tracking.sender import BatchSender, is_transient
from albert_dist.tracking.tracker import parse_run_ref


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "HF_TOKEN", "api_key", "tracking.apiKey", "db_password_file", "authToken",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "client_secret",
                                  "MLFLOW_TRACKING_USERNAME"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer_path", "train_tokens", "pad_token_id", "mask_token", "cls_token",
                                  "max_predictions_per_seq", "keys_per_batch", "tokens_per_s", "monkey",
                                  "USERNAME_HINT", "data.tokenizer_path"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


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
    cfg = {"model": {"num_hidden_groups": 2, "act": None, "drop": 0.1, "ckpt": False},
           "data": {"train": [{"paths": ["a", "b"], "weight": 1.0}], "validation": []},
           "tracking": {"api_key": "s3cr3t-value"}}
    assert flatten(cfg) == {
        "model.num_hidden_groups": "2", "model.act": "null", "model.drop": "0.1", "model.ckpt": "false",
        "data.train.0.paths.0": "a", "data.train.0.paths.1": "b", "data.train.0.weight": "1.0",
        "data.validation": "[]", "tracking.api_key": MASK}


def test_flatten_dataclass_matches_dict():
    cfg = TrackingConfig(experiment_name="e")
    flat = flatten({"tracking": cfg})
    assert flat["tracking.experiment_name"] == "e" and flat["tracking.tracking_uri"] == "null"
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
    """Records delivered batches; fails the next `fail_next` calls with a connection error, and rejects
    (permanently, like a 400) any metric whose key is in `reject`."""

    def __init__(self):
        self.metrics, self.params, self.tags = [], [], []
        self.fail_next = 0
        self.reject = set()
        self.calls = 0
        self.lock = threading.Lock()

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        with self.lock:
            self.calls += 1
            if self.fail_next:
                self.fail_next -= 1
                raise MlflowException("API request failed with exception ConnectionRefusedError")
            if any(m.key in self.reject for m in metrics):
                raise MlflowException("bad metric", error_code=INVALID_PARAMETER_VALUE)
            self.metrics += list(metrics)
            self.params += list(params)
            self.tags += list(tags)


def test_transient_classification():
    assert is_transient(MlflowException("connection refused"))  # INTERNAL_ERROR -> 500
    assert is_transient(ConnectionError())
    assert not is_transient(MlflowException("x", error_code=INVALID_PARAMETER_VALUE))


def test_sender_retries_in_order_and_keeps_timestamps():
    client = FakeClient()
    client.fail_next = 3
    sender = BatchSender(client, "r", flush_interval_s=0.05, retry_backoff_s=0.01, max_backoff_s=0.02)
    sender.add_params({"p": "1"})
    expected = []
    for step in range(1, 2501):  # > MAX_METRICS_PER_BATCH: several batches
        sender.add_metrics({"loss": 1.0 / step}, step, timestamp_ms=1000 + step)
        expected.append(("loss", 1.0 / step, 1000 + step, step))
    assert sender.close(timeout_s=30) == 0
    assert [(m.key, m.value, m.timestamp, m.step) for m in client.metrics] == expected
    assert [(p.key, p.value) for p in client.params] == [("p", "1")]
    assert sender.failures == 3 and sender.dropped == 0


def test_sender_isolates_a_permanently_rejected_metric():
    client = FakeClient()
    client.reject = {"bad"}
    sender = BatchSender(client, "r", flush_interval_s=0.05, retry_backoff_s=0.01, max_backoff_s=0.02)
    sender.add_metrics({"loss": 1.0, "bad": 2.0, "acc": 0.5}, 7)
    assert sender.close(timeout_s=10) == 0
    assert sorted((m.key, m.step) for m in client.metrics) == [("acc", 7), ("loss", 7)]
    assert sender.dropped == 1


def test_sender_never_blocks_the_caller_and_reports_undelivered_at_close():
    client = FakeClient()
    client.fail_next = 10**9  # server down for good
    sender = BatchSender(client, "r", flush_interval_s=0.01, retry_backoff_s=0.01, max_backoff_s=0.05)
    t0 = time.monotonic()
    for step in range(1000):
        sender.add_metrics({"loss": 1.0}, step)
    assert time.monotonic() - t0 < 1.0  # adding is an append, whatever the server does
    assert not sender.wait_sent(sender.added, timeout_s=0.2)
    assert sender.close(timeout_s=0.3) == 1000
    assert len(sender.unsent_metrics()) == 1000 and client.metrics == []


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
    from albert_dist.tracking.params import model_param_counts

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
    from types import SimpleNamespace

    from albert_dist.tracking.compare import format_table, table_rows

    def run(rid, name, params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=name), data=SimpleNamespace(params=params))

    runs = [run("a" * 32, "one", {"x": "1", "same": "s"}), run("b" * 32, "two", {"x": "2", "same": "s", "y": "3"})]
    histories = {"a" * 32: {"loss": [(1, 3.0), (2, 1.0), (3, 2.0)], "mlm_accuracy": [(3, 0.25)]},
                 "b" * 32: {"loss": [(1, 4.0), (2, 3.5)]}}
    rows = table_rows(runs, histories)
    assert rows == [["run", "one", "two"], ["run_id", "a" * 32, "b" * 32], ["x", "1", "2"], ["y", "-", "3"],
                    ["loss.final", "2", "3.5"], ["loss.best", "1", "3.5"],
                    ["mlm_accuracy.final", "0.25", "-"], ["mlm_accuracy.best", "0.25", "-"]]
    assert format_table(rows).splitlines()[2].split() == ["x", "1", "2"]


@pytest.mark.parametrize("key,higher", [("loss", False), ("val_mlm_accuracy", True), ("tokens_per_s", True),
                                        ("mfu", True), ("peak_mem_gib_max", False), ("interval_s", False)])
def test_best_direction(key, higher):
    from albert_dist.tracking.compare import higher_is_better

    assert higher_is_better(key) is higher
