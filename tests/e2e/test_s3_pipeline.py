"""The README's "your own corpus" path entirely on S3 (moto's S3 server): `data prepare` from s3://raw/ to
s3://prepared/, `data plan` on it, a 2-rank run under the real deepspeed launcher (launch/pretrain_local.sh)
training and validating from the bucket with tracking to an MLflow server whose artifact store is the bucket,
then the same command with `--resume auto` to more steps: every step logged once, the checkpoints in the bucket,
and what `--resume-from <run id>` downloads (through the server) byte-identical to the run's own checkpoint."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from fixtures.mlflow_server import MlflowServer
from helpers import read_metrics
from mlflow import MlflowClient

from albert_dist.cli import main as cli_main
from albert_dist.engine import metric_names as names
from albert_dist.tracking.checkpoints import download_checkpoint
from albert_dist.tracking.tracker import read_run_id

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "pretrain_local.sh"
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
OVERRIDES = ["optimizer.warmup_steps=1", "log_interval_steps=1", "eval_interval_steps=0",
             "checkpoint.save_interval_steps=2", "data.max_seq_length=64", "model.max_position_embeddings=64",
             "engine.train_micro_batch_size_per_gpu=4", "data.eval_examples=8", "progress_bar=false",
             "data.train=[s3://prepared/wiki]", "data.validation=[s3://raw/wiki/wikitext-2-validation.txt]",
             "tracking.experiment_name=s3_e2e", "tracking.flush_interval_s=0.5", "tracking.log_system_metrics=false",
             "data.num_workers=0"]  # loader workers reading a bucket: test_object_store.py::test_exact_resume_from_the_bucket


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _launch(run_dir: Path, log: Path, env: dict, *extra: str) -> int:
    env = {**os.environ, **env, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(os.sys.executable).parent}:{os.environ.get('PATH', '')}"}
    with open(log, "wb") as out:
        return subprocess.run(["bash", str(SCRIPT), "2", RECIPE, *OVERRIDES, *extra], cwd=REPO, env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=400).returncode


def test_prepare_plan_train_and_resume_all_on_s3(s3_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALBERT_DIST_PREPARE_TMP", str(tmp_path / "prepare"))
    for bucket in ("raw", "prepared", "mlflow"):
        s3_server.bucket(bucket)
    sample = REPO / "data" / "sample"
    for name in ["wikitext-2-train-00.txt", "wikitext-2-train-01.txt", "wikitext-2-validation.txt"]:
        s3_server.upload(sample / name, f"s3://raw/wiki/{name}")
    assert cli_main(["data", "prepare", "--input", "s3://raw/wiki/wikitext-2-train-*.txt", "--output", "s3://prepared/wiki",
                        "--target-ranks", "2", "--target-loader-workers", "1"]) == 0
    assert "s3://prepared/wiki" in capsys.readouterr().out
    assert cli_main(["data", "plan", "--config", RECIPE, "--ranks", "2", "data.train=[s3://prepared/wiki]"]) == 0
    assert "manifest" in capsys.readouterr().out

    server = MlflowServer(tmp_path / "mlflow", artifacts_destination="s3://mlflow/artifacts",
                          env={**s3_server.env(), "MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint})
    server.start()
    try:
        env = {**s3_server.env(), "MLFLOW_TRACKING_URI": server.uri}
        run_dir = tmp_path / "run"
        cache = tmp_path / "cache"  # the node cache of the validation source (albert_dist.data.sources.cache)
        assert _launch(run_dir, tmp_path / "first.log", env, "max_steps=2", f"data.cache_dir={cache}") == 0, \
            (tmp_path / "first.log").read_text()[-5000:]
        assert _launch(run_dir, tmp_path / "second.log", env, "max_steps=4", "--resume", "auto",
                       f"data.cache_dir={cache}") == 0, (tmp_path / "second.log").read_text()[-5000:]
        second = (tmp_path / "second.log").read_text()
        assert f"resumed from {run_dir / 'checkpoints'}/step_2 at step 2" in second, second[-5000:]
        # the two ranks of the first run downloaded the validation object once; the resumed run read it from disk
        assert [p.name.split("-", 1)[1] for p in cache.iterdir() if not p.name.endswith(".lock")] == [
            "wikitext-2-validation.txt"]
        assert "cache: downloaded s3://raw/wiki/wikitext-2-validation.txt" not in second
        assert [r["step"] for r in read_metrics(run_dir) if names.TRAIN_LOSS in r] == [1, 2, 3, 4]
        run_id = read_run_id(run_dir)
        client = MlflowClient(server.uri)
        assert sorted(m.step for m in client.get_metric_history(run_id, names.TRAIN_LOSS)) == [1, 2, 3, 4]
        keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket="mlflow")["Contents"]]
        assert any(f"{run_id}/artifacts/checkpoints/step_4/" in k for k in keys), keys
        # what `--resume-from <run id>` fetches (rank 0's download): the step-4 checkpoint, byte for byte
        step, tag_dir = download_checkpoint(client, run_id, str(tmp_path / "fetched"))
        assert step == 4 and _digests(Path(tag_dir)) == _digests(run_dir / "checkpoints" / "step_4")
    finally:
        server.stop()
