"""The main job's path end to end: launch/pretrain_local.sh -> the real `deepspeed` launcher -> 2 CPU ranks.

20 steps of albert-tiny on the bundled corpus (shortened sequences), checkpoints every 5 steps. The whole
process group is sent SIGTERM mid-run (what `scancel` or a preemption does): every rank finishes its step,
the job checkpoints and stops. The same command with `--resume auto` then finishes the run: every step 1..20
logged exactly once, the last checkpoint complete, validation run, the loss lower than at the start.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import read_metrics

from albert_dist.engine import checkpoint as ckpt
from albert_dist.engine import metric_names as names

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "pretrain_local.sh"
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
OVERRIDES = ["max_steps=20", "optimizer.warmup_steps=2", "log_interval_steps=1", "eval_interval_steps=0",
             "checkpoint.save_interval_steps=5", "data.max_seq_length=64", "model.max_position_embeddings=64",
             "engine.train_micro_batch_size_per_gpu=4", "data.eval_examples=8", "tracking.enabled=false",
             "progress_bar=false"]


def _launch(run_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(os.sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.Popen(["bash", str(SCRIPT), "2", RECIPE, *OVERRIDES, *extra], cwd=REPO, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_group_gone(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    proc.wait(timeout=timeout)
    while _group_alive(proc.pid):
        assert time.time() < deadline, "job processes still alive after SIGTERM"
        time.sleep(0.2)


def test_launcher_pretrain_sigterm_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, tmp_path / "first.log")
    try:
        deadline = time.time() + 300
        while not any(r["step"] >= 7 for r in read_metrics(run_dir)):
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-5000:]
            assert time.time() < deadline, "no step 7 within 300 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the job, as scancel does
        # The shell and the launcher die at once; the ranks finish their step and checkpoint first.
        _wait_group_gone(proc, timeout=120)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "first.log").read_text()
    assert "stopped by signal at step" in log, log[-5000:]
    stopped = int(log.split("stopped by signal at step ")[1].split()[0])
    assert 7 <= stopped < 20
    assert ckpt.read_latest(run_dir / "checkpoints") == f"step_{stopped}"

    resumed = _launch(run_dir, tmp_path / "second.log", "--resume", "auto")
    assert resumed.wait(timeout=400) == 0, (tmp_path / "second.log").read_text()[-5000:]
    second = (tmp_path / "second.log").read_text()
    assert f"resumed from {run_dir / 'checkpoints'}/step_{stopped} at step {stopped}" in second
    assert f"outputs in {run_dir}" in second  # the script says where the run's outputs are

    records = read_metrics(run_dir)
    train = [r for r in records if names.TRAIN_LOSS in r]
    assert [r["step"] for r in train] == list(range(1, 21))  # each step once, none missing
    assert train[-1][names.TRAIN_LOSS] < train[0][names.TRAIN_LOSS]
    val = [r for r in records if names.VAL_LOSS in r]
    assert [r["step"] for r in val] == [20] and val[0][names.VAL_MLM_ACCURACY] >= 0.0
    assert ckpt.read_latest(run_dir / "checkpoints") == "step_20"
    assert (run_dir / "config.yaml").is_file() and json.loads((run_dir / "ds_config.json").read_text())[
        "zero_optimization"]["stage"] == 2
