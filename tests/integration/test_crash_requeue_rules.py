"""slurm/common.sh's crash requeue rules without a cluster: `run_preemptible` around a stand-in training command that
exits with a given code, with stand-in `scontrol` and `sinfo` on PATH that record what they were asked. The real
cluster's run is tests/e2e/test_slurm.py (kill -9 of a rank -> requeue without its node -> COMPLETED).

References: the stand-ins' logs (was the job requeued, which ExcNodeList was set), the count file, the exit code.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")]

REPO = Path(__file__).resolve().parents[2]
JOB = "5"

SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_LOG"
case "$1 $2" in
"-o show") echo "JobId=$SLURM_JOB_ID ExcNodeList=(null) StdOut=$FAKE_OUT" ;;
"show hostnames") tr , '\\n' <<<"$3" ;;
esac
"""
SINFO = """#!/bin/bash
printf '%s\\n' $FAKE_NODES
"""


def _run(tmp_path: Path, status: int, progressed: bool = True, count: str | None = None, nodes: str = "n1 n2 n3",
         num_nodes: int = 1) -> tuple[int, str, str]:
    """`run_preemptible` of a command exiting `status` after an attempt that did (not) record a step past its
    start; returns (code, the batch shell's output, what scontrol was asked)."""
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("sinfo", SINFO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    launch = 1000.0
    events = [{"event": "start", "t": 1010.0, "step": 10, "begin_t": launch, "launch_t": launch, "load_s": 1.0}]
    if progressed:
        events.append({"event": "interval", "t": 1020.0, "step": 13, "from_step": 10, "elapsed_s": 10.0, "phases": {}})
    (run_dir / "goodput.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if count is not None:
        (run_dir / ".crash_requeues").write_text(count)
    out = tmp_path / "job.out"
    out.write_text("earlier attempt\nsrun: error: n3: task 0: Killed\n")  # before this attempt: not its node
    log = tmp_path / "scontrol.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "SLURM_JOB_ID": JOB, "SLURM_JOB_NUM_NODES": str(num_nodes), "SLURM_JOB_PARTITION": "ci",
           "MASTER_ADDR": "127.0.0.1", "FAKE_LOG": str(log), "FAKE_OUT": str(out), "FAKE_NODES": nodes}
    script = (f'source slurm/common.sh; ALBERT_LAUNCH_TIME={launch}; RUN_DIR={run_dir}; '
              f'run_preemptible true -- bash -c \'echo "srun: error: n2: task 1: Killed" >> {out}; exit {status}\'')
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr, log.read_text() if log.exists() else ""


def test_a_killed_rank_after_progress_is_requeued_without_its_node(tmp_path):
    code, output, asked = _run(tmp_path, 137)
    assert code == 0, output
    assert f"requeue {JOB}" in asked.splitlines(), asked
    assert f"update JobId={JOB} ExcNodeList=n2" in asked.splitlines(), asked  # this attempt's failed task's node
    assert (tmp_path / "run" / ".crash_requeues").read_text().split() == [JOB, "1"]
    assert "crash requeue 1 of at most 3" in output
    last = json.loads((tmp_path / "run" / "goodput.jsonl").read_text().splitlines()[-1])
    assert (last["event"], last["status"], last["launch_t"]) == ("exit", 1, 1000.0)


def test_a_node_is_kept_when_the_partition_has_no_other_for_the_job(tmp_path):
    code, output, asked = _run(tmp_path, 137, nodes="n1 n2", num_nodes=2)
    assert code == 0 and f"requeue {JOB}" in asked.splitlines(), output
    assert "ExcNodeList=" not in "".join(line for line in asked.splitlines() if line.startswith("update")), asked
    assert "node n2 (the first failed task's) kept: the partition has 1 usable node(s)" in output, output


@pytest.mark.parametrize("status, progressed, count, why", [
    (1, False, None, "recorded no step past the one it started from"),
    (1, True, f"{JOB} 3", "3 crash requeue(s) of job 5 already"),
])
def test_no_requeue_without_progress_or_past_the_budget(tmp_path, status, progressed, count, why):
    code, output, asked = _run(tmp_path, status, progressed=progressed, count=count)
    assert code == 1 and why in output, output
    assert "requeue" not in asked, asked


@pytest.mark.parametrize("status", [2, 74, 77, 78])
def test_config_save_divergence_and_input_errors_are_never_requeued(tmp_path, status):
    code, output, asked = _run(tmp_path, status)
    assert code == status, output
    assert "requeue" not in asked, asked


def test_a_bad_crash_requeue_budget_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(["bash", "-c", "source slurm/common.sh"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "ALBERT_MAX_CRASH_REQUEUES": "-1", "MASTER_ADDR": "127.0.0.1"})
    assert proc.returncode == 2
    assert proc.stdout.strip().endswith("ALBERT_MAX_CRASH_REQUEUES=-1: expected a whole number >= 0"), proc.stdout
