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

from albert_dist.engine.checkpoint.layout import read_latest, read_meta
from albert_dist.engine import metric_names as names

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "pretrain_local.sh"
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
OVERRIDES = ["max_steps=20", "optimizer.warmup_steps=2", "log_interval_steps=1", "eval_interval_steps=0",
             "checkpoint.save_interval_steps=5", "data.max_seq_length=64", "model.max_position_embeddings=64",
             "engine.train_micro_batch_size_per_gpu=4", "data.eval_examples=8", "tracking.enabled=false",
             "progress_bar=false"]


def _launch(run_dir: Path, log: Path, *extra: str, ctrl_c: bool = False) -> subprocess.Popen:
    """launch/pretrain_local.sh in its own process group (the test signals the group as a terminal would).
    ctrl_c: SIGINT at its default disposition, as under a terminal (a CI runner started in the background
    passes it on ignored, and bash cannot trap a signal ignored when it started)."""
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(os.sys.executable).parent}:{os.environ.get('PATH', '')}"}
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if ctrl_c else None
    return subprocess.Popen(["bash", str(SCRIPT), "2", RECIPE, *OVERRIDES, *extra], cwd=REPO, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=preexec)


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
    assert read_latest(run_dir / "checkpoints") == f"step_{stopped}"

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
    assert read_latest(run_dir / "checkpoints") == "step_20"
    assert (run_dir / "config.yaml").is_file() and json.loads((run_dir / "ds_config.json").read_text())[
        "zero_optimization"]["stage"] == 2


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, log: Path, step: int) -> None:
    deadline = time.time() + 300
    while not any(r["step"] >= step for r in read_metrics(run_dir)):
        assert proc.poll() is None, log.read_text()[-5000:]
        assert time.time() < deadline, f"no step {step} within 300 s"
        time.sleep(0.2)


def _rank_pid(run_dir: Path, rank: int) -> int:
    """The pid of rank `rank` of the job writing to run_dir (not a DataLoader worker: its parent is no rank)."""
    ranks = {}
    for proc_dir in Path("/proc").iterdir():
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().split(b"\0")
            environ = dict(kv.split(b"=", 1) for kv in (proc_dir / "environ").read_bytes().split(b"\0") if b"=" in kv)
            ppid = int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if f"run_dir={run_dir}".encode() in cmdline and b"albert_dist.cli" in cmdline and b"RANK" in environ:
            ranks[int(proc_dir.name)] = (int(environ[b"RANK"]), ppid)
    return next(pid for pid, (r, ppid) in ranks.items() if r == rank and ppid not in ranks)


def test_launcher_ctrl_c_checkpoints_the_step_then_kill_9_of_a_rank_is_exit_1(tmp_path):
    """The issue's two launcher cases. Ctrl-C (SIGINT to the process group) under launch/pretrain_local.sh 2:
    every rank finishes its step, the job checkpoints that step ("reason": "stop") and exits 75, with no
    traceback (before: rank 1 died of KeyboardInterrupt, no checkpoint at the interrupt, 3 tracebacks, and the
    last interval checkpoint announced as the stop's). Then, resumed: kill -9 of rank 1: the job ends with exit
    1 (the launcher's 247 mapped, the signal named), and rank 0 never announces a checkpoint it cannot write."""
    run_dir = tmp_path / "run"
    first_log = tmp_path / "first.log"
    no_interval = ["max_steps=200", "checkpoint.save_interval_steps=0"]
    proc = _launch(run_dir, first_log, *no_interval, ctrl_c=True)
    try:
        _wait_for_step(proc, run_dir, first_log, 3)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _wait_group_gone(proc, timeout=120)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    log = first_log.read_text()
    assert proc.returncode == 75, log[-5000:]
    stopped = int(log.split("every rank stops after step ")[1].split(":")[0])
    assert 3 <= stopped < 200
    assert log.count(f"stopped by signal at step {stopped} after a checkpoint") == 2, log[-5000:]  # both ranks
    assert read_latest(run_dir / "checkpoints") == f"step_{stopped}"
    meta = read_meta(run_dir / "checkpoints" / f"step_{stopped}")
    assert (meta["reason"], meta["stop_cause"]) == ("stop", "signal")
    assert f"(SIGINT: every rank stopped after writing checkpoint step_{stopped}" in log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-5000:]

    second_log = tmp_path / "second.log"
    resumed = _launch(run_dir, second_log, *no_interval, "--resume", "auto")
    try:
        _wait_for_step(resumed, run_dir, second_log, stopped + 2)
        killed_at = time.time()
        os.kill(_rank_pid(run_dir, 1), signal.SIGKILL)
        _wait_group_gone(resumed, timeout=120)
        ended_s = time.time() - killed_at
    finally:
        if resumed.poll() is None or _group_alive(resumed.pid):
            os.killpg(resumed.pid, signal.SIGKILL)
    log = second_log.read_text()
    assert f"resumed from {run_dir / 'checkpoints'}/step_{stopped} at step {stopped}" in log
    assert resumed.returncode == 1, log[-5000:]
    assert "(a rank was killed by signal 9 (SIGKILL), e.g. the kernel's OOM killer (see dmesg) or a kill -9; " \
           "the launcher exited 247)" in log, log[-5000:]
    assert "pretraining failed (exit 1)" in log
    assert "every rank stops after step" not in log and "then checkpoint and exit" not in log, log[-5000:]
    assert read_latest(run_dir / "checkpoints") == f"step_{stopped}"  # nothing was claimed or written
    assert ended_s < 60, ended_s  # DeepSpeed's launcher: SIGTERM to the others, SIGKILL 30 s later at most


def test_two_jobs_started_together_on_one_run_dir_exactly_one_trains(tmp_path):
    """The issue's double start (a double `sbatch`, a requeue racing a manual restart), through the real launcher:
    before, both exited 0, each deleting the other's checkpoints, every step logged twice from two trajectories.
    Now one trains; the other is refused before any process group (exit 2, the holder named)."""
    run_dir = tmp_path / "run"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    jobs = [_launch(run_dir, log, "max_steps=4", "--resume", "auto") for log in logs]
    try:
        codes = [job.wait(timeout=400) for job in jobs]
    finally:
        for job in jobs:
            if _group_alive(job.pid):
                os.killpg(job.pid, signal.SIGKILL)
    texts = [log.read_text() for log in logs]
    assert sorted(codes) == [0, 2], (codes, texts[0][-3000:], texts[1][-3000:])
    winner, loser = (texts[0], texts[1]) if codes[0] == 0 else (texts[1], texts[0])
    assert f"run directory {run_dir} is in use by another job: pid " in loser, loser[-3000:]
    assert "pretraining did not start" in loser and "process group up" not in loser
    assert "is in use" not in winner
    train = [r["step"] for r in read_metrics(run_dir, names.TRAIN_LOSS)]
    assert train == [1, 2, 3, 4]  # one trajectory, each step once
    assert read_latest(run_dir / "checkpoints") == "step_4"
