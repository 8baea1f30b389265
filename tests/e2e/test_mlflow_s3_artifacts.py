"""MLflow's artifact store in S3: the tests' MLflow server with ``--artifacts-destination s3://...`` on the moto
S3 server (the deployment docs/mlflow.md describes for a user's own S3/MinIO). A checkpoint logged by our
tracker lands in the bucket, and what `--resume-from <run id>` runs (`download_checkpoint`) fetches it back,
byte for byte."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fixtures.mlflow_server import MlflowServer
from mlflow import MlflowClient

from albert_dist.tracking.checkpoints import CHECKPOINTS_ARTIFACT_DIR, complete_checkpoints, download_checkpoint
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.tracker import MLflowTracker

pytestmark = pytest.mark.e2e


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_checkpoints_go_to_s3_and_resume_from_fetches_them(s3_server, tmp_path):
    s3_server.bucket("mlflow")
    server = MlflowServer(tmp_path / "mlflow", artifacts_destination="s3://mlflow/artifacts",
                          env={**s3_server.env(), "MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint})
    server.start()
    try:
        # a DeepSpeed-shaped checkpoint directory: a tag folder with rank files and the `latest` pointer
        ck = tmp_path / "ckpt"
        (ck / "global_step4").mkdir(parents=True)
        for i, size in enumerate((3000, 70_000)):
            (ck / "global_step4" / f"mp_rank_0{i}_model_states.pt").write_bytes(bytes(range(256)) * (size // 256))
        (ck / "latest").write_text("global_step4")
        cfg = TrackingConfig(tracking_uri=server.uri, experiment_name="s3_artifacts", flush_interval_s=0.2)
        tracker = MLflowTracker(cfg, run_dir=str(tmp_path / "run"))
        tracker.log_checkpoint(str(ck / "global_step4"), 4)
        tracker.close("FINISHED")
        client = MlflowClient(server.uri)
        assert [s for s, _ in complete_checkpoints(client, tracker.run_id)] == [4]
        # the files are objects in the bucket (not in the server's local folder)
        keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket="mlflow")["Contents"]]
        stored = [k for k in keys if f"{tracker.run_id}/artifacts/{CHECKPOINTS_ARTIFACT_DIR}/" in k]
        assert any(k.endswith("mp_rank_01_model_states.pt") for k in stored), keys
        assert not (tmp_path / "mlflow" / "artifacts").exists()
        # what --resume-from <run id> does on rank 0
        step, tag_dir = download_checkpoint(client, tracker.run_id, str(tmp_path / "resumed"))
        assert step == 4 and (tmp_path / "resumed" / "latest").read_text().strip() == Path(tag_dir).name
        assert _digests(Path(tag_dir)) == _digests(ck / "global_step4")
    finally:
        server.stop()
