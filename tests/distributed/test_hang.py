"""A stopped rank ends the job within a bound, named, with stacks, exit 76, and the run resumes (issue 43, hangs).

A real 2-rank job of the tiny config through the app's main (`albert_dist.apps.pretrain.main.main`: its exit codes), rank 1
SIGSTOPped after a few steps: rank 0 must end within ``engine.step_timeout_s`` + 150 s with EXIT_HUNG, one line
naming rank 1, its host and its last step and phase, its threads' stacks under the run directory; then
`--resume auto` continues from the newest checkpoint. Before the watchdog, rank 0 waited in a gloo collective for
the process-group timeout (1,800 s) and exited 1 without naming anyone.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from albert_dist.exit_codes import EXIT_HUNG
from albert_dist.job.watchdog import rank_report
from fixtures.ranks import CONFIG, Job

pytestmark = pytest.mark.distributed

STEP_TIMEOUT_S = 8.0
BOUND_S = STEP_TIMEOUT_S + 150.0


def test_a_sigstopped_rank_is_named_stacks_written_exit_76_then_resume_auto_continues(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    common = [f"engine.step_timeout_s={STEP_TIMEOUT_S:g}", "checkpoint.save_interval_steps=3", "checkpoint.keep_last=2"]
    job = Job(2, config, run_dir, ["--run"], [*common, "max_steps=100000"])
    try:
        deadline = time.time() + 240
        report = None
        while time.time() < deadline:  # a few steps on rank 1, past a checkpoint
            report = rank_report(run_dir, 1)
            if report is not None and report.step >= 4:
                break
            assert all(p.poll() is None for p in job.procs), job.log_tail()
            time.sleep(0.05)
        assert report is not None and report.step >= 4, job.log_tail()
        stopped_pid = job.procs[1].pid
        os.kill(stopped_pid, signal.SIGSTOP)
        stopped_at = time.time()
        code = job.procs[0].wait(timeout=BOUND_S)
        elapsed = time.time() - stopped_at
        print(f"SIGSTOP of rank 1 at step {report.step} to rank 0's exit {code}: {elapsed:.1f} s")
    finally:
        job.kill()  # SIGKILL: rank 1 too, stopped
    log0 = Path(job.logs[0].name).read_text(errors="replace")
    assert code == EXIT_HUNG, f"rank 0 exited {code}\n{job.log_tail()}"
    assert elapsed <= BOUND_S and elapsed >= STEP_TIMEOUT_S, elapsed
    line = next((l for l in log0.splitlines() if "hang: no progress" in l), None)
    assert line is not None, log0[-3000:]
    m = re.search(r"rank 1 \(host (\S+), pid (\d+)\) at step (\d+), phase (\w+)", line)
    assert m, line
    host, pid, step, phase = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    assert (host, pid) == (socket.gethostname(), stopped_pid), line
    assert report.step <= step <= report.step + 2, (report, line)  # stopped within a step or two of the read
    assert phase in ("data", "forward_backward", "optimizer_step", "logging", "checkpoint_save", "stop_agreement")
    assert "stopped reporting" in line and "rank 0 (" not in line, line
    stacks = list(run_dir.glob("watchdog/*/stacks.rank0.txt"))
    assert len(stacks) == 1, list(run_dir.rglob("*"))
    text = stacks[0].read_text()
    assert "Thread 0x" in text and "most recent call first" in text, text[:2000]
    assert re.search(r'File ".*albert_dist/(apps/pretrain/trainer|engine/.*|distributed/.*)\.py"', text), text[:3000]
    assert not list(run_dir.glob("watchdog/*/stacks.rank1.txt"))  # the stopped rank wrote nothing
    # --resume auto continues from the newest checkpoint the hung job left
    newest = (run_dir / "checkpoints" / "latest").read_text().strip()
    newest_step = int(newest.removeprefix("step_"))
    assert newest_step >= 3
    offset = len(Path(job.logs[0].name).read_bytes())  # the resumed job appends to the same log
    resumed = Job(2, config, run_dir, ["--run"], [*common, f"max_steps={newest_step + 2}", "checkpoint.resume=auto"])
    codes = resumed.wait(timeout=240)
    assert codes == [0, 0], f"{codes}\n{resumed.log_tail()}"
    log0 = Path(resumed.logs[0].name).read_bytes()[offset:].decode(errors="replace")
    assert re.search(rf"resumed from \S+/{newest} at step {newest_step}\b", log0), log0[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{newest_step + 2}"


def test_a_sigstopped_rank_0_which_serves_the_rendezvous_store_blocks_neither_the_watchdog_nor_the_exit(tmp_path):
    """Rank 0 serves the job's TCPStore: stopped, it would block any store call of the others. The watchdog uses
    files, so rank 1 still names it and exits 76 within the bound."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    job = Job(2, config, run_dir, ["--run"], [f"engine.step_timeout_s={STEP_TIMEOUT_S:g}", "max_steps=100000",
                                              "checkpoint.save_interval_steps=0"])
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            report = rank_report(run_dir, 0)
            if report is not None and report.step >= 3:
                break
            assert all(p.poll() is None for p in job.procs), job.log_tail()
            time.sleep(0.05)
        os.kill(job.procs[0].pid, signal.SIGSTOP)
        stopped_at = time.time()
        code = job.procs[1].wait(timeout=BOUND_S)
        elapsed = time.time() - stopped_at
    finally:
        job.kill()
    log1 = Path(job.logs[1].name).read_text(errors="replace")
    assert code == EXIT_HUNG and elapsed <= BOUND_S, f"rank 1 exited {code} after {elapsed:.0f} s\n{job.log_tail()}"
    assert re.search(rf"ERROR .*hang: no progress .* stopped reporting: rank 0 \(host {re.escape(socket.gethostname())}, "
                     rf"pid {job.procs[0].pid}\) at step \d+, phase \w+", log1), log1[-3000:]
    assert list(run_dir.glob("watchdog/*/stacks.rank1.txt"))
