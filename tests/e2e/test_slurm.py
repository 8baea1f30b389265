"""slurm/pretrain.sbatch and slurm/deepspeed.sbatch on a real Slurm cluster of two nodes (CPU mode, gloo).

The cluster is the one .ci/slurm-cluster.sh starts (two virtual nodes n1, n2 on this machine); without
`sinfo` or without two nodes up, every test here skips and says why. Jobs run a few optimiser steps of the
tiny recipe; MLflow tracks into a SQLite store in the test's temporary directory.

References the assertions use: Slurm's own view of the job (`scontrol show job`: state, exit code, restart
count), each task's discovery printed by the job (`albert-dist dist`), the files the
run writes (checkpoints, mlflow_run.json) and the MLflow store read back through MlflowClient.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.s3_server import relayed_shards
from helpers import read_metrics

from albert_dist.distributed.slurm import port_from_job_id
from albert_dist.engine import metric_names as names
from albert_dist.engine.checkpoint.layout import read_meta

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: a few steps of the tiny recipe; each Slurm job stays well under a minute on an idle 2-core machine
TINY = ["optimizer.warmup_steps=1", "log_interval_steps=1", "eval_interval_steps=0", "data.eval_examples=8",
        "progress_bar=false", "tracking.log_model=false"]
#: CPU mode: one task per node, no GPUs (the scripts' #SBATCH lines ask for 8 GPUs per node); a time limit
#: well beyond the scripts' `--signal=B:USR1@600` (a shorter one would signal the job as it starts)
CPU_ALLOC = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=30"]


def _nodes_up() -> int:
    out = subprocess.run(["sinfo", "-h", "-t", "idle,mix,alloc,completing", "-o", "%D"], capture_output=True,
                         text=True, timeout=30)
    return sum(int(x) for x in out.stdout.split()) if out.returncode == 0 else 0


@pytest.fixture(scope="module")
def cluster():
    if shutil.which("sinfo") is None:
        pytest.skip("sinfo not found: no Slurm here (CI starts a 2-node cluster with .ci/slurm-cluster.sh start)")
    if _nodes_up() < 2:
        pytest.skip("fewer than 2 Slurm nodes up (start them with .ci/slurm-cluster.sh start, as root)")


class Jobs:
    """Submits sbatch jobs for one test, waits for them, reads them back; cancels leftovers at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.ids: list[str] = []
        self.run_dir = tmp_path / "run"
        self.tracking_uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k not in (
                        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        self.env.update({
            # the venv's tools first (DeepSpeed's CPU op build uses whichever `ninja` comes first)
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHON": sys.executable,
            "ALBERT_DIST": str(BIN / "albert-dist"), "ALBERT_SLURM_CPU": "1", "ALBERT_RUN_DIR": str(self.run_dir),
            "MLFLOW_TRACKING_URI": self.tracking_uri, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        })
        self.out = tmp_path / "job.out"

    def submit(self, script: str, overrides: list[str], sbatch_args: list[str] = (), env: dict | None = None) -> str:
        cmd = ["sbatch", "--parsable", f"--chdir={REPO}", f"--output={self.out}", *CPU_ALLOC, *sbatch_args,
               script, *overrides]
        proc = subprocess.run(cmd, env=self.env | (env or {}), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        job_id = proc.stdout.strip().split(";")[0]
        self.ids.append(job_id)
        return job_id

    def state(self, job_id: str) -> tuple[str, str]:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True)
        parts = out.stdout.split()
        return (parts[0], parts[1] if len(parts) > 1 else "") if parts else ("", "")

    def wait(self, job_id: str, timeout_s: float, release_requeued: bool = False) -> dict[str, str]:
        """Wait until the job left the queue; returns `scontrol show job`'s fields.

        release_requeued: a requeued job is held ~2.5 min (reason BeginTime, measured on Slurm 22.05) before
        it may start again; set its start time to now instead of waiting — but not at once: released within
        the same second, slurmctld re-allocated the job while slurmd was still killing it and failed it ("Job
        credential revoked", seen in CI). slurmd revokes the killed attempt's credentials and compares creation
        times in whole seconds, so a credential made within that second counts as revoked: release only after
        the job has been held for a few seconds and every node is idle.
        """
        deadline = time.monotonic() + timeout_s
        held_since = None
        while time.monotonic() < deadline:
            state, reason = self.state(job_id)
            if not state:
                return self.show(job_id)
            if release_requeued and state == "PENDING" and reason == "BeginTime":
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= 3.0 and _all_nodes_idle():
                    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
            else:
                held_since = None
            time.sleep(0.5)
        pytest.fail(f"job {job_id} still queued after {timeout_s} s:\n{self.output()[-4000:]}")

    def show(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                             check=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else "(no job output)"

    def cancel_all(self) -> None:
        for job_id in self.ids:
            subprocess.run(["scancel", job_id], capture_output=True)


def _all_nodes_idle() -> bool:
    """True when every node of the cluster is idle (none allocated, completing or draining)."""
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True).stdout.split()
    return bool(states) and all(s == "idle" for s in states)


@pytest.fixture
def jobs(cluster, tmp_path):
    j = Jobs(tmp_path)
    yield j
    j.cancel_all()


def _dist_records(output: str) -> list[dict]:
    return [json.loads(line[5:]) for line in output.splitlines() if line.startswith("DIST {")]


def _mlflow_runs(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    return client, client.search_runs(exp_ids)


def _assert_completed(info: dict[str, str], output: str, restarts: int) -> None:
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", str(restarts)), \
        output[-6000:]


def _assert_checkpoint(run_dir: Path, step: int, world: int) -> None:
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == f"step_{step}"
    shards = sorted(p.name for p in (ckpt / f"step_{step}").glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]  # every rank wrote


def test_pretrain_sbatch_two_nodes(jobs):
    job = jobs.submit("slurm/pretrain.sbatch", TINY + ["max_steps=4", "checkpoint.save_interval_steps=2"])
    info = jobs.wait(job, timeout_s=420)
    output = jobs.output()
    _assert_completed(info, output, restarts=0)

    # each task's own discovery: two ranks on distinct nodes, one rendezvous at n1's NodeAddr
    dist = _dist_records(output)
    assert sorted((d["rank"], d["node_rank"]) for d in dist) == [(0, 0), (1, 1)], output[-4000:]
    for d in dist:
        assert (d["world_size"], d["num_nodes"], d["local_world_size"], d["source"]) == (2, 2, 1, "slurm")
        assert (d["master_addr"], d["master_port"]) == ("127.0.0.1", port_from_job_id(int(job)))
    assert "rank 0/2 (local 0/1, node 0/2)" in output  # the trainer's process group on rank 0

    _assert_checkpoint(jobs.run_dir, step=4, world=2)
    client, runs = _mlflow_runs(jobs.tracking_uri)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.run_id == json.loads((jobs.run_dir / "mlflow_run.json").read_text())["run_id"]
    assert run.info.status == "FINISHED"
    assert run.data.tags.get("slurm.job_id") == job
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.TRAIN_LOSS)] == [1, 2, 3, 4]


def test_pretrain_sbatch_preempted_requeued_resumed(jobs):
    max_steps = 16
    # no periodic checkpoint: the only one before the end is the one the signal causes
    job = jobs.submit("slurm/pretrain.sbatch", TINY + [f"max_steps={max_steps}", "checkpoint.save_interval_steps=0"])
    deadline = time.monotonic() + 360
    while not re.search(r"step +[2-9]\d*/\d+ \| loss ", jobs.output()):  # the console line of step >= 2
        assert jobs.state(job)[0] in ("PENDING", "RUNNING"), f"job ended before step 2:\n{jobs.output()[-4000:]}"
        assert time.monotonic() < deadline, f"no step 2 after 360 s:\n{jobs.output()[-4000:]}"
        time.sleep(0.2)
    # what `--signal=B:USR1@T` does at T seconds before the time limit: SIGUSR1 to the batch shell only
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    info = jobs.wait(job, timeout_s=420, release_requeued=True)
    output = jobs.output()
    _assert_completed(info, output, restarts=1)

    stopped = set(re.findall(r"stopped by signal at step (\d+) after a checkpoint", output))  # every rank says it
    assert len(stopped) == 1, output[-6000:]
    stop_step = int(stopped.pop())
    assert 2 <= stop_step < max_steps
    assert f"requeueing job {job} (restart 1)" in output
    assert f"job {job} restart 1 on" in output  # the requeued run of the same job
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", output)
    assert [(Path(p).name, int(s)) for p, s in resumed] == [(f"step_{stop_step}", stop_step)], output[-6000:]
    assert (jobs.run_dir / "checkpoints" / f"step_{stop_step}").is_dir()
    _assert_checkpoint(jobs.run_dir, step=max_steps, world=2)

    # one MLflow run across both attempts, every step logged exactly once
    client, runs = _mlflow_runs(jobs.tracking_uri)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_id == json.loads((jobs.run_dir / "mlflow_run.json").read_text())["run_id"]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, names.TRAIN_LOSS)]
    assert sorted(steps) == list(range(1, max_steps + 1)), steps


@pytest.mark.parametrize("launcher", ["slurm", "nossh"])
def test_deepspeed_sbatch_two_nodes(jobs, launcher):
    job = jobs.submit("slurm/deepspeed.sbatch", TINY + ["max_steps=3", "checkpoint.save_interval_steps=0"],
                      env={"ALBERT_DS_LAUNCHER": launcher})
    info = jobs.wait(job, timeout_s=420)
    output = jobs.output()
    _assert_completed(info, output, restarts=0)
    assert (jobs.run_dir / "hostfile").read_text() == "n1 slots=1\nn2 slots=1\n"
    # slurm: ranks are srun tasks (Slurm variables); nossh: DeepSpeed's per-node launcher sets RANK etc.
    source = {"slurm": "slurm", "nossh": "deepspeed"}[launcher]
    assert re.search(rf"rank 0/2 \(local 0/1, node 0/2\) master 127\.0\.0\.1:{port_from_job_id(int(job))} "
                     rf"via {source}", output), output[-4000:]
    _assert_checkpoint(jobs.run_dir, step=3, world=2)
    client, runs = _mlflow_runs(jobs.tracking_uri)
    assert [r.info.status for r in runs] == ["FINISHED"]


SIGNAL_SCRIPT = """#!/bin/bash
#SBATCH --time=1 --signal=B:USR1@58
echo "start $(date +%s.%N)"
trap 'echo "usr1 $(date +%s.%N)"; exit 0' USR1
for i in $(seq 900); do sleep 0.1; done
echo "no signal"
exit 3
"""


def test_signal_before_time_limit_reaches_batch_shell(jobs):
    """`--signal=B:USR1@58` with a 60 s limit: the batch shell's trap runs before the limit (measured: Slurm
    checks every ~30 s, so it comes 2-32 s after the start, not at 2 s)."""
    script = jobs.tmp / "signal.sbatch"
    script.write_text(SIGNAL_SCRIPT)
    job = jobs.submit(str(script), [], sbatch_args=["--nodes=1", "--time=1"])
    info = jobs.wait(job, timeout_s=120)
    output = jobs.output()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output
    start = float(re.search(r"start (\S+)", output).group(1))
    usr1 = float(re.search(r"usr1 (\S+)", output).group(1))
    assert 0 < usr1 - start < 58, output


def test_pretrain_sbatch_kill_9_of_a_rank_requeues_without_its_node_and_completes(jobs):
    """The issue's kill -9 of rank 1, on Slurm, in a 1-node job of 2 tasks: srun reports 128 + 9; the batch script
    names the signal, excludes the node (the partition keeps the other one for a 1-node job) and requeues the job,
    whose next run resumes from the newest checkpoint on the other node and completes (before: FAILED, exit 1).
    The resume takes the run directory's lock again (the dead job's is the kernel's)."""
    max_steps = 16
    job = jobs.submit("slurm/pretrain.sbatch", TINY + [f"max_steps={max_steps}", "checkpoint.save_interval_steps=2"],
                      sbatch_args=["--nodes=1", "--ntasks-per-node=2"])
    deadline = time.monotonic() + 360
    while not (jobs.run_dir / "checkpoints" / "latest").is_file():
        assert jobs.state(job)[0] in ("PENDING", "RUNNING"), f"job ended early:\n{jobs.output()[-4000:]}"
        assert time.monotonic() < deadline, f"no checkpoint after 360 s:\n{jobs.output()[-4000:]}"
        time.sleep(0.2)
    rank1 = None
    for proc_dir in Path("/proc").iterdir():  # the virtual nodes share this host: find rank 1's process
        try:
            environ = (proc_dir / "environ").read_bytes().split(b"\0")
            cmdline = (proc_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if (b"albert_dist.cli" in cmdline and f"SLURM_JOB_ID={job}".encode() in environ
                and b"SLURM_PROCID=1" in environ and f"run_dir={jobs.run_dir}".encode() in cmdline):
            ppid = int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if b"albert_dist.cli" not in (Path("/proc") / str(ppid) / "cmdline").read_bytes():  # not a worker
                rank1 = int(proc_dir.name)
    assert rank1 is not None, jobs.output()[-4000:]
    os.kill(rank1, 9)
    info = jobs.wait(job, timeout_s=420, release_requeued=True)
    output = jobs.output()
    _assert_completed(info, output, restarts=1)
    assert "a rank was killed by signal 9 (SIGKILL)" in output and "srun exited 137" in output, output[-6000:]
    assert f"requeueing job {job} (crash requeue 1 of at most 3; restart 1)" in output, output[-6000:]
    first = re.search(rf"job {job} restart 0 on (n\d)", output).group(1)
    assert f"node {first} (the first failed task's) excluded from the requeued job: ExcNodeList={first}" in output
    assert info["ExcNodeList"] == first and info["NodeList"] != first, info  # Slurm's own view
    assert re.search(rf"job {job} restart 1 on {info['NodeList']}", output), output[-6000:]
    resumed = re.findall(r"resumed from \S+/step_(\d+) at step", output)
    assert len(resumed) == 1 and 2 <= int(resumed[0]) < max_steps, output[-6000:]
    _assert_checkpoint(jobs.run_dir, step=max_steps, world=2)
    assert (jobs.run_dir / ".crash_requeues").read_text().split() == [job, "1"]
    report = json.loads(subprocess.run([sys.executable, "-m", "albert_dist.cli", "goodput", str(jobs.run_dir),
                                        "--json"], capture_output=True, text=True, check=True).stdout)
    assert report["restarts"] == 1 and [a["status"] for a in report["attempts"]] == [1, 0], report


def test_pretrain_sbatch_store_outage_past_the_budget_requeues_keeps_the_nodes_and_completes(jobs, s3_server, tmp_path):
    """The training corpus in S3 (moto's server behind a relay that can go down), the store down past
    `data.store_retry_s`: the ranks checkpoint and exit 75 by themselves (no SIGUSR1 to the batch shell); the
    script requeues the job within ALBERT_MAX_CRASH_REQUEUES with every node kept, and the requeued run, the store
    back, completes with every step logged once. Before, the job ended FAILED with exit 75 for a person to resubmit
    (found by `bench/chaos.py --slurm`)."""
    relay, env = relayed_shards(s3_server, "s3://outage/shards", tmp_path / "shards")
    max_steps = 40  # reads go on through the run: the outage, at step 4 or a few later, meets some
    job = jobs.submit("slurm/pretrain.sbatch", TINY + [
        f"max_steps={max_steps}", "checkpoint.save_interval_steps=0", "data.train=[s3://outage/shards]",
        "data.num_workers=1", "data.shuffle_documents=1", "data.store_retry_s=4", "data.max_seq_length=32",
        "model.max_position_embeddings=32", "engine.train_micro_batch_size_per_gpu=2"], env=env)
    steps = lambda: [r["step"] for r in read_metrics(jobs.run_dir) if names.TRAIN_LOSS in r] \
        if (jobs.run_dir / "metrics.jsonl").exists() else []  # noqa: E731
    try:
        deadline = time.monotonic() + 360
        while len(steps()) < 4:
            assert jobs.state(job)[0] in ("PENDING", "RUNNING"), f"job ended before step 4:\n{jobs.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no step 4 after 360 s:\n{jobs.output()[-4000:]}"
            time.sleep(0.1)
        relay.down()
        while jobs.state(job)[0] != "PENDING":  # requeued (or left the queue: failed below)
            assert jobs.state(job)[0], f"job left the queue after the outage:\n{jobs.output()[-6000:]}"
            assert time.monotonic() < deadline + 120, f"not requeued:\n{jobs.output()[-4000:]}"
            time.sleep(0.2)
        relay.up()  # the store is back before the requeued run starts
        info = jobs.wait(job, timeout_s=420, release_requeued=True)
    finally:
        relay.down()
    output = jobs.output()
    _assert_completed(info, output, restarts=1)
    assert "the ranks stopped after their object store stayed unavailable (exit 75" in output, output[-6000:]
    assert f"exit 75: requeueing job {job} (store requeue 1 of at most 3; restart 1)" in output, output[-6000:]
    assert "ExcNodeList" not in output and "excluded" not in output  # the store is no node's fault
    resumed = re.findall(r"resumed from \S+/(step_\d+) at step (\d+)", output)
    assert len(resumed) == 1, output[-6000:]
    stop_tag, stop_step = resumed[0][0], int(resumed[0][1])
    assert 4 <= stop_step < max_steps
    assert read_meta(jobs.run_dir / "checkpoints" / stop_tag)["stop_cause"] == "store"
    assert steps() == list(range(1, max_steps + 1))  # every step logged once across both attempts
