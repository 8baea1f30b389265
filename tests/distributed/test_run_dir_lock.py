"""One job per run directory (issue 20), with the real app (`python -m albert_dist.cli train`) on 2 gloo ranks.

A second job on a run directory another job holds is refused before any process group: exit 2 on every rank,
one line naming the directory and the holder's pid and host; its rank 1 learns of rank 0's refusal through the
rendezvous store and does not wait for a process group. The holder killed with SIGKILL (a crash, an OOM kill),
its lock is the kernel's to release: `--resume auto` then takes it and continues from the last checkpoint.
"""
from __future__ import annotations

import json
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from albert_dist.engine.checkpoint.layout import read_latest
from albert_dist.engine.checkpoint.choose import choose_checkpoint
from albert_dist.job.lock import LOCK_FILE
from fixtures.ranks import CONFIG, Job
from helpers import REPO, rank_env, start_ranks

pytestmark = pytest.mark.distributed

CLI = [sys.executable, "-m", "albert_dist.cli", "train"]


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(l)["step"] for l in path.read_text().splitlines() if l.endswith("}") and "train/loss" in l]


def test_a_second_job_is_refused_before_any_process_group_and_a_crashed_holder_leaves_no_lock(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    holder = Job(2, config, run_dir, [], ["max_steps=200", "checkpoint.save_interval_steps=2"], command=CLI)
    try:
        deadline = time.time() + 240
        while not (run_dir / "checkpoints" / "latest").is_file():
            assert all(p.poll() is None for p in holder.procs), holder.log_tail()
            assert time.time() < deadline, holder.log_tail()
            time.sleep(0.2)
        record = json.loads((run_dir / LOCK_FILE).read_text())
        assert record["pid"] == holder.procs[0].pid and record["host"] == socket.gethostname()

        second_dir = tmp_path / "second"  # the second job's logs go beside it; its run_dir is the holder's
        second = Job(2, config, second_dir, ["--resume", "auto"], [f"run_dir={run_dir}"], command=CLI)
        started = time.time()
        codes = second.wait(timeout=120)
        took = time.time() - started
        logs = [Path(log.name).read_text() for log in second.logs]
        assert codes == [2, 2], (codes, second.log_tail())
        refusal = (f"run directory {run_dir} is in use by another job: pid {holder.procs[0].pid} on host "
                   f"{socket.gethostname()}")
        assert f"albert-dist train: {refusal}" in logs[0], logs[0][-2000:]
        # one line for the job: rank 1, told by rank 0's verdict, does not repeat it (a launcher merges the output)
        assert "albert-dist train:" not in logs[1], logs[1][-2000:]
        assert not any("process group up" in log or "Traceback" in log for log in logs), second.log_tail()
        assert took < 60, took  # no rank waits for a process group that will not come
        assert all(p.poll() is None for p in holder.procs), holder.log_tail()  # the holder trains on
    finally:
        holder.kill()  # SIGKILL: a crash, the lock left to the kernel
    assert [p.returncode for p in holder.procs] == [-signal.SIGKILL] * 2
    saved = choose_checkpoint("auto", run_dir / "checkpoints").step
    assert _steps(run_dir) == sorted(set(_steps(run_dir)))  # one trajectory: no step logged twice

    resumed = Job(2, config, run_dir, ["--resume", "auto"], [f"max_steps={saved + 2}"], command=CLI)
    codes = resumed.wait(timeout=240)
    assert codes == [0, 0], resumed.log_tail()
    assert f"resumed from {run_dir / 'checkpoints'}/step_{saved} at step {saved}" in resumed.log_tail()
    assert read_latest(run_dir / "checkpoints") == f"step_{saved + 2}"
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == resumed.procs[0].pid


def test_without_run_dir_rank_0_names_and_locks_one_directory_both_ranks_write(tmp_path):
    """No run_dir: rank 0's preflight names runs/<recipe>-<UTC time> under the working directory and locks it before
    the process group; rank 1 receives the name, so the one directory holds both ranks' checkpoint shards."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    logs = [open(tmp_path / f"rank{rank}.log", "wb") for rank in range(2)]
    overrides = [f"data.train=[{{paths: [{REPO}/data/sample/wikitext-2-train-*.txt]}}]",
                 f"data.tokenizer_path={REPO}/data/sample/spiece.model", "max_steps=3"]
    procs = start_ranks([*CLI, "--config", str(config), *overrides], 2, logs=logs, cwd=tmp_path, fork=True,
                        env=rank_env())
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
        for log in logs:
            log.close()
    assert codes == [0, 0], "\n".join(Path(log.name).read_text()[-2000:] for log in logs)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny-20")
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == procs[0].pid
    shards = sorted(f.name for f in (run_dir / "checkpoints" / "step_3").glob("zero_pp_rank_*optim_states.pt"))
    assert [name[:len("zero_pp_rank_0")] for name in shards] == ["zero_pp_rank_0", "zero_pp_rank_1"], shards
