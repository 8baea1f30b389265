"""`launch/pretrain_local.sh --max-restarts N` with a real kill -9, and `albert-dist goodput RUN_DIR --json` on what
the killed and the restarted attempt left (the issue's recovery and goodput checks, on the tiny config).

One job: the real deepspeed launcher, one CPU rank (the cheapest job a kill -9 ends), the tiny model of
tests/fixtures/ranks.py, a checkpoint every 10 steps, a log line every step. The test kills the rank once step 12 is
logged; the script must restart it in place from the newest checkpoint and finish. References the assertions use:
the console lines the job printed (the last `step N/M` of the killed attempt, the `resumed from ... at step C` of the
restart), the script's exit code, the clock of the test around the whole script, and the checkpoints on disk.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.ranks import CONFIG
from helpers import REPO, clean_env, read_metrics, run_cli

pytestmark = pytest.mark.integration

SCRIPT = REPO / "launch" / "pretrain_local.sh"
MAX_STEPS = 150  # ~20 steps/s on one core: the kill lands well before the end


def _rank_pid(run_dir: Path) -> int | None:
    """The training process of the job writing to run_dir (`python -u -m albert_dist.cli train ...`: not the
    launcher's processes, whose command lines name the module after `--module`)."""
    found = {}
    for proc_dir in Path("/proc").iterdir():
        try:
            cmdline = (proc_dir / "cmdline").read_bytes()
            ppid = int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if f"run_dir={run_dir}".encode() in cmdline and b"\0-m\0albert_dist.cli\0train\0" in cmdline:
            found[int(proc_dir.name)] = ppid
    return next((pid for pid, ppid in found.items() if ppid not in found), None)


def test_kill_9_then_max_restarts_resumes_in_place_and_goodput_accounts_for_it(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(CONFIG.replace("max_steps: 8", f"max_steps: {MAX_STEPS}").replace("num_workers: 1",
                      "num_workers: 0").replace("save_interval_steps: 3", "save_interval_steps: 10"))
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    env = clean_env(RUN_DIR=str(run_dir), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    proc = subprocess.Popen(["bash", str(SCRIPT), "1", str(recipe), "--max-restarts", "2"], cwd=REPO, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any(r["step"] >= 12 for r in read_metrics(run_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        pid = _rank_pid(run_dir)
        assert pid is not None, log.read_text()[-4000:]
        os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=300)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 0, text[-5000:]
    killed, restarted = text.split("restart 1 in place with --resume auto", 1)
    assert "(a rank was killed by signal 9 (SIGKILL)" in killed, text[-5000:]
    killed_at = max(int(s) for s in re.findall(rf"step +(\d+)/{MAX_STEPS} \| loss", killed))
    resumed = [int(s) for s in re.findall(r"resumed from \S+/step_(\d+) at step \d+", restarted)]
    assert len(resumed) == 1 and resumed[0] % 10 == 0 and 10 <= resumed[0] <= killed_at, text[-5000:]
    assert "pretraining finished" in restarted and (run_dir / "checkpoints" / "latest").read_text() == \
        f"step_{MAX_STEPS}"

    proc = run_cli("goodput", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["restarts"] == 1
    assert report["recomputed_steps"] == killed_at - resumed[0], (killed_at, resumed, report)
    assert report["steps"] == MAX_STEPS
    parts = report["productive_s"] + sum(report["badput_s"].values())
    assert parts == pytest.approx(report["wall_s"], rel=1e-9)
    # every attempt lies inside the script's run: the sum is below the test's clock, and most of it
    assert 0.6 * took < report["wall_s"] <= took, (took, report)
    assert report["productive_s"] > 0 and report["badput_s"]["startup"] > 0
    assert report["badput_s"]["checkpoint_load"] > 0 and report["badput_s"]["checkpoint_save"] > 0
    assert report["badput_s"]["lost"] > 0  # the kill: from the attempt's last event to the launcher's exit
    assert (report["badput_s"]["recomputed"] > 0) == (killed_at > resumed[0])
    assert [a["status"] for a in report["attempts"]] == [1, 0]
    # printed at the end of the job, and in metrics.jsonl (what MLflow gets) at the last step
    assert "goodput " in restarted and "productive of" in restarted
    last = [r for r in read_metrics(run_dir, "goodput/restarts")]
    assert last and last[-1]["step"] == MAX_STEPS and last[-1]["goodput/restarts"] == 1.0


def test_a_negative_restart_budget_is_one_line_and_exit_2(tmp_path):
    env = clean_env(RUN_DIR=str(tmp_path / "run"),
                    PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(SCRIPT), "2", "--max-restarts", "-1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"{SCRIPT}: --max-restarts=-1: expected a whole number of restarts >= 0"], proc.stderr
    assert not (tmp_path / "run").exists()
