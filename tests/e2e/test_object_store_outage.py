"""The `objstore-outage` bar: a 2-rank job training from S3 (moto's server, through a relay that can go down)
under launch/pretrain_local.sh, with a loader worker per rank, outlasts an outage shorter than
``data.store_retry_s``; an outage longer than it ends the job with exit 75 after a checkpoint of the step it
reached and one line naming the URL (no traceback); ``--resume auto`` then completes the run with every step
logged once.

The outage is the endpoint going away: the relay closes its port (connection refused) and cuts every open
connection (a request in flight fails), then listens again on the same port in front of the same objects, as a
restarted S3 server or a healed network does. The run is short (40 steps, outages at steps 3 and 10) and the
budget 4 s, so that the test is cheap: its cost is two starts of two ranks (the default budget is 300 s,
albert_dist.data.config.DataConfig.store_retry_s).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.s3_server import relayed_shards
from helpers import clean_env, read_metrics, start_ranks

from albert_dist.engine import metric_names as names
from albert_dist.engine.checkpoint.layout import read_latest, read_meta

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "pretrain_local.sh"
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
OVERRIDES = ["max_steps=40", "optimizer.warmup_steps=2", "log_interval_steps=1", "eval_interval_steps=0",
             "checkpoint.save_interval_steps=1000", "data.max_seq_length=32", "model.max_position_embeddings=32",
             "engine.train_micro_batch_size_per_gpu=2", "data.eval_examples=8", "tracking.enabled=false",
             "progress_bar=false", "data.train=[s3://outage/shards]", "data.num_workers=1",
             "data.shuffle_documents=1", "data.store_retry_s=4"]



def _launch(run_dir: Path, log: Path, env: dict, *extra: str) -> subprocess.Popen:
    env = {**os.environ, **env, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(os.sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.Popen(["bash", str(SCRIPT), "2", RECIPE, *OVERRIDES, *extra], cwd=REPO, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait(what: str, check, proc: subprocess.Popen, log: Path, timeout: float = 400.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before {what}:\n" + log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n" + log.read_text()[-4000:]
        time.sleep(0.05)


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir) if names.TRAIN_LOSS in r] if run_dir.exists() else []


def test_an_outage_shorter_than_the_budget_is_outlasted_a_longer_one_is_exit_75_then_resume(s3_server, tmp_path):
    relay, env = relayed_shards(s3_server, "s3://outage/shards", tmp_path / "shards")
    run_dir, first = tmp_path / "run", tmp_path / "first.log"
    proc = _launch(run_dir, first, env)
    try:
        # 1: down at step 3 until a worker has retried a read (a request failed), then back: outlasted
        _wait("step 3", lambda: len(_steps(run_dir)) >= 3, proc, first)
        relay.down()
        _wait("a retried read", lambda: "failed (attempt 1, " in first.read_text(), proc, first)
        relay.up()
        # 2: down at step 10 for longer than data.store_retry_s: every rank checkpoints its step and exits 75
        _wait("step 10", lambda: len(_steps(run_dir)) >= 10, proc, first)
        relay.down()
        assert proc.wait(timeout=400) == 75, first.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    log = first.read_text()
    assert "Traceback" not in log, log[-5000:]
    stopped = _steps(run_dir)[-1]
    assert 10 <= stopped < 40 and _steps(run_dir) == list(range(1, stopped + 1))
    assert read_latest(run_dir / "checkpoints") == f"step_{stopped}"
    meta = read_meta(run_dir / "checkpoints" / f"step_{stopped}")
    assert (meta["reason"], meta["stop_cause"]) == ("stop", "store")
    # the launch script names the store's give-up (it said "stopped by a signal")
    assert "pretraining stopped: the object store stayed unavailable, after writing a checkpoint (exit 75)" in log
    assert "stopped by a signal" not in log, log[-3000:]
    # the rank whose loader gave up names the object and the budget in one line; the other rank says why it stops
    gave_up = [line for line in log.splitlines() if "kept failing for" in line]
    assert gave_up and all("s3://outage/shards/part-" in line and "data.store_retry_s=4" in line
                           and f"stopped at step {stopped} after a checkpoint; exit 75" in line for line in gave_up)

    relay.up()  # the store is back: --resume auto completes the run (the two ranks started directly: the
    # launcher's processes cost as much again as the ranks' start on 2 cores, and its exit code was checked above)
    cmd = [sys.executable, "-m", "albert_dist.cli", "train", "--config", RECIPE, f"run_dir={run_dir}", *OVERRIDES,
           "--resume", "auto"]
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    ranks = start_ranks(cmd, 2, env=clean_env(**env), logs=[open(log, "wb") for log in logs], cwd=REPO)
    try:
        codes = [rank.wait(timeout=400) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
        relay.down()
    second = "".join(log.read_text() for log in logs)
    assert codes == [0, 0] and "Traceback" not in second, second[-5000:]
    assert f"resumed from {run_dir / 'checkpoints'}/step_{stopped} at step {stopped}" in second
    assert _steps(run_dir) == list(range(1, 41))  # every step logged once
