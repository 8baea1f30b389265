"""A training file that disappears mid-run (issue 46 item 5): one line naming it and what the plan expected,
exit 78 (`EXIT_INPUT_VANISHED`), no DataLoader-worker traceback; from an object store (moto's S3 server) after a
checkpoint of the step the job reached, and `launch/pretrain_local.sh` reports 78 (not a signal's 75); a local
shard deleted: the same line and code, the newest checkpoint intact (a local source is not fetched ahead of the
stop agreement, so no checkpoint is written at the stop).

Before: the object store's case ended in two DataLoader-worker tracebacks (``StoreError: ... does not exist (no
such object)``), exit 1; a local shard deleted was skipped as "damaged" with a warning per piece (the job trains
on without it) and, both shards gone, a worker traceback "got no usable document in a whole epoch", exit 1.

One rank, one loader worker (the worker path is the one that printed tracebacks), the tiny recipe at 32 tokens;
the shards: the bundled sample's paragraphs as parquet of 1-row groups, so reads go on through the run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.s3_server import paragraph_shards
from helpers import clean_env, read_metrics

from albert_dist.engine import metric_names as names
from albert_dist.engine.checkpoint.layout import read_latest, read_meta

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
OVERRIDES = ["max_steps=400", "optimizer.warmup_steps=2", "log_interval_steps=1", "eval_interval_steps=0",
             "checkpoint.save_interval_steps=2", "data.max_seq_length=32", "model.max_position_embeddings=32",
             "engine.train_micro_batch_size_per_gpu=2", "data.eval_examples=8", "tracking.enabled=false",
             "progress_bar=false", "data.num_workers=1", "data.shuffle_documents=1", "data.store_retry_s=4"]



def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir) if names.TRAIN_LOSS in r] if run_dir.exists() else []


def _run_until(cmd: list[str], env: dict, run_dir: Path, log: Path, remove, timeout: float = 300.0) -> int:
    """Start ``cmd``; at step 3 call ``remove()``; return the exit code."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while len(_steps(run_dir)) < 3:
            assert proc.poll() is None, f"ended (exit {proc.returncode}) before step 3:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        remove()
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_an_object_deleted_mid_run_is_exit_78_after_a_checkpoint_in_one_line(s3_server, tmp_path):
    s3_server.bucket("vanish")
    s3_server.upload(paragraph_shards(tmp_path / "shards", 200), "s3://vanish/shards")
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    env = {**os.environ, **s3_server.env(), "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    client = s3_server.client()

    def remove() -> None:
        for i in range(2):
            client.delete_object(Bucket="vanish", Key=f"shards/part-{i}.parquet")

    # through the launch script: its exit mapping must keep 78 although the ranks wrote a stop checkpoint
    code = _run_until(["bash", str(REPO / "launch" / "pretrain_local.sh"), "1", RECIPE, *OVERRIDES,
                       "data.train=[s3://vanish/shards]"], env, run_dir, log, remove)
    text = log.read_text()
    assert code == 78, text[-5000:]
    assert "Traceback" not in text, text[-5000:]
    stopped = _steps(run_dir)[-1]
    assert 3 <= stopped < 400 and _steps(run_dir) == list(range(1, stopped + 1))
    assert read_latest(run_dir / "checkpoints") == f"step_{stopped}"
    assert read_meta(run_dir / "checkpoints" / f"step_{stopped}")["reason"] == "stop"
    (line,) = [x for x in text.splitlines() if "does not exist (no such object)" in x]
    assert "s3://vanish/shards/part-" in line and "the job planned to read row group" in line
    assert "-byte object (version " in line and f"stopped at step {stopped} after a checkpoint; exit 78" in line
    assert "a training file or object is gone (exit 78" in text  # the script's summary, not "stopped by a signal"


def test_a_local_shard_deleted_mid_run_is_exit_78_in_one_line(tmp_path):
    shards = paragraph_shards(tmp_path / "shards", 200)
    run_dir, log = tmp_path / "run", tmp_path / "job.log"

    def remove() -> None:
        shutil.rmtree(shards)

    code = _run_until([sys.executable, "-m", "albert_dist.cli", "train", "--config", RECIPE, *OVERRIDES,
                       f"data.train=[{shards}]", f"run_dir={run_dir}"], clean_env(), run_dir, log, remove)
    text = log.read_text()
    assert code == 78, text[-5000:]
    assert "Traceback" not in text and "damaged" not in text, text[-5000:]
    (line,) = [x for x in text.splitlines() if "no longer exists (FileNotFoundError)" in x]
    assert f"{shards}/part-" in line and "the job planned to read row group" in line and "exit 78" in line
    stopped = _steps(run_dir)[-1]
    assert stopped < 400 and read_latest(run_dir / "checkpoints") == f"step_{stopped - stopped % 2}"
