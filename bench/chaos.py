"""Chaos soak: one run under a schedule of faults, every one recovered without a person, against an undisturbed run
of the same steps (not in the suite, not in CI: ~6-10 min on 2 loaded cores).

A tiny ALBERT (the tiny model of tests/fixtures/ranks.py, a checkpoint every `--save-every` steps, a log record
every step) on 2 CPU ranks under the real launcher, `launch/pretrain_local.sh N RECIPE --max-restarts K`, which
restarts a crash or a hang in place with `--resume auto`. The training corpus (the bundled WikiText-2 sample's
paragraphs as two parquet shards of 1-row groups, so the loader reads all through the run) is in a local S3 server
(moto's, its own process: tests/fixtures/s3_server.py) behind a relay that can go down
(`fixtures.s3_server.Relay`, as tests/e2e/test_object_store_outage.py makes an outage). This script watches the
run's goodput.jsonl from outside and, once the current attempt has reached a fault's step (`attempt_step`),
injects it:

* ``kill9``: SIGKILL of rank `--victim`'s training process (a crashed node): the launch script restarts the run
  (exit 1, `--max-restarts`).
* ``sigstop``: SIGSTOP of rank `--victim`'s training process (a hung node): the other rank's hang watchdog fires
  after ``engine.step_timeout_s`` (`STEP_TIMEOUT_S`), launch.py SIGKILLs the stopped rank 30 s after its SIGTERM,
  the launch script reports exit 76 and restarts the run (docs/faults.md, Hangs).
* ``store_outage``: the relay in front of the S3 server goes down (port closed, open connections cut); the loader
  retries for ``data.store_retry_s`` (`STORE_RETRY_S`), then every rank checkpoints its step and exits 75; the
  launch script restarts the run (its stop checkpoint's cause is the store), and this script brings the relay back
  up as soon as that attempt's exit is in goodput.jsonl, before the next one reads.
* ``preempt``: SIGTERM to the job's process group (what `scancel` or a preemption does): every rank checkpoints the
  step and exits 75; this script relaunches with `--resume auto`, as a Slurm requeue does.
* ``diverge``: the testing switch ``ALBERT_INJECT_NONFINITE_STEP=N`` (albert_dist/engine/divergence.py) in every
  attempt's environment: step N's loss is NaN, the default policy (rollback) reloads the newest healthy checkpoint
  and skips the data since it. The reference run gets the same switch, so it rolls back the same way: its final
  weights are those of the same steps on the same data, the same window skipped. `parse_faults` refuses a schedule
  in which another fault would change which checkpoint the rollback goes to (a stop checkpoint after it) or would
  make a restarted attempt train step N again (and roll back a second time).

Then: the run's goodput (`albert-dist goodput RUN_DIR --json`), the time each fault cost (`fault_costs`: the wall
time during which the run made no new progress: from the last step before the fault to the first time the run is
back at that step), the rollback each run did (from metrics.jsonl), and the final weights
(`final_model/fp32/model.safetensors`) compared tensor by tensor, bit for bit, with the reference's: on CPU fp32 on
the same number of ranks the resume is exact, so they must be equal. With `--control` (default on) a third run
without the switch shows that the comparison sees the rollback's skipped window (its weights must differ).

    python bench/chaos.py --json bench/results/chaos.json       # the default schedule, DEFAULT_FAULTS
    python bench/chaos.py --steps 60 --faults kill9@15,preempt@35 --no-control
    python bench/chaos.py --slurm --json bench/results/chaos_slurm.json   # on the CI Slurm cluster

With ``--slurm`` the disturbed run is one `sbatch slurm/pretrain.sbatch` job on the cluster .ci/slurm-cluster.sh
starts, and every recovery is the batch script's own requeue (`chaos_run_slurm`); the reference runs stay on the
local launcher, so equal final weights also say a Slurm job trains what the local launcher does.

The work directory is under $BENCH_TMPDIR (default /tmp) and deleted at the end unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the S3 server and relay the tests use (tests/fixtures/s3_server.py)
SCRIPT = ROOT / "launch" / "pretrain_local.sh"
#: the faults, in the order the help lists them
FAULTS = ("kill9", "sigstop", "store_outage", "preempt", "diverge")
#: faults that end an attempt (the others happen inside one)
ENDS_ATTEMPT = frozenset({"kill9", "sigstop", "store_outage", "preempt"})
#: faults the launch script restarts by itself (`--max-restarts`; sbatch: the crash requeue budget); after a
#: preemption this script relaunches (a local run has no scheduler to requeue it)
RESTARTED_BY_SCRIPT = frozenset({"kill9", "sigstop", "store_outage"})
#: steps a fault may land after the step it asked for (the run is watched from outside, a stop finishes its step,
#: a loader rides out part of an outage on what it read ahead): the margin `parse_faults` keeps around a rollback
MARGIN = 3
DEFAULT_FAULTS = "kill9@12,sigstop@22,store_outage@31,preempt@42,diverge@57"
DEFAULT_STEPS = 70
#: the hang watchdog's step allowance, short so the SIGSTOP costs seconds, not the default 300 s
STEP_TIMEOUT_S = 20
#: the loader's retry budget for the store, short so the outage costs seconds, not the default 300 s
STORE_RETRY_S = 5
BUCKET = "s3://chaos/shards"
RECIPE = """
model: {vocab_size: 8000, embedding_size: 16, hidden_size: 32, num_hidden_layers: 3, num_hidden_groups: 2,
        num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 32, hidden_dropout_prob: 0.1,
        sharing: all}
data:
  train: [{paths: ["BUCKET"]}]
  validation: []
  tokenizer_path: data/sample/spiece.model
  max_seq_length: 32
  max_predictions_per_seq: 4
  num_workers: 1
  shuffle_documents: 1
  store_retry_s: STORE_RETRY_S
optimizer: {lr: 0.003, warmup_steps: 2}
engine: {zero_stage: 2, train_micro_batch_size_per_gpu: 2, gradient_accumulation_steps: 2,
         peak_tflops_per_device: 1.0, step_timeout_s: STEP_TIMEOUT_S}
checkpoint: {save_interval_steps: SAVE_EVERY, keep_last: 3}
tracking: {enabled: false}
log_interval_steps: 1
eval_interval_steps: 0
progress_bar: false
"""


def recipe(save_every: int) -> str:
    """The recipe both runs train (`RECIPE` with the bucket, the budgets and the checkpoint cadence filled in)."""
    return (RECIPE.replace("BUCKET", BUCKET).replace("STORE_RETRY_S", str(STORE_RETRY_S))
            .replace("STEP_TIMEOUT_S", str(STEP_TIMEOUT_S)).replace("SAVE_EVERY", str(save_every)))


def parse_faults(text: str, save_every: int, steps: int) -> list[tuple[str, int]]:
    """``"kill9@12,diverge@57"`` -> [("kill9", 12), ("diverge", 57)], sorted by step.

    A ``diverge@D`` rolls back to the newest healthy checkpoint, the newest periodic one at or before step D - 2
    (`rollback_target`: the checkpoint of step D - 1 is first measured by step D's loss, so it counts as diverged);
    the reference run does the same. So that the disturbed run rolls back to the same checkpoint and only once,
    every other fault must land `MARGIN` steps before that checkpoint (no stop checkpoint between it and D) or
    `MARGIN` steps after the first periodic checkpoint at or after D (no restarted attempt trains step D again).

    Raises:
        ValueError: an unknown fault, a bad step, a step not below `steps`, two divergences, or a schedule that
            breaks the rule above (naming the fault and the steps it must avoid).
    """
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, step = item.partition("@")
        if name not in FAULTS:
            raise ValueError(f"--faults: unknown fault {name!r} (choose from {', '.join(FAULTS)})")
        if not step.isdigit() or int(step) < 1:
            raise ValueError(f"--faults: {item!r}: expected <fault>@<step >= 1>")
        if int(step) >= steps:
            raise ValueError(f"--faults: {item!r}: the run has {steps} steps (--steps); a fault must come before the last")
        out.append((name, int(step)))
    diverge = [s for n, s in out if n == "diverge"]
    if len(diverge) > 1:
        raise ValueError(f"--faults: one diverge at most, got {len(diverge)}")
    if diverge:
        d = diverge[0]
        target = rollback_target(d, save_every)
        if target < 1:
            raise ValueError(f"--faults: diverge@{d}: no checkpoint to roll back to (the first is at step "
                             f"{save_every}, --save-every; diverge at step {save_every + 2} or later)")
        after = -(-d // save_every) * save_every
        for name, s in out:
            if name != "diverge" and target - MARGIN < s < after + MARGIN:
                raise ValueError(f"--faults: {name}@{s} would change diverge@{d}'s rollback (to step {target}): put it "
                                 f"at step {target - MARGIN} or before, or {after + MARGIN} or after")
    return sorted(out, key=lambda f: f[1])


def rollback_target(step: int, save_every: int) -> int:
    """The step of the checkpoint a divergence first flagged at `step` rolls back to when checkpoints are periodic
    every `save_every` steps: the newest one at or before ``step - 2`` (0: none).
    Source: docs/faults.md, Divergence ("the checkpoints of steps >= F-1 are renamed step_<N>_diverged")."""
    return max(0, (step - 2) // save_every * save_every)


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file, one a line; a line cut short by a kill (the last one) is skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def attempt_step(events: list[dict]) -> int | None:
    """The step the run's current attempt has trained to, from its goodput events (goodput.jsonl): the step of the
    last ``interval`` after the last ``start``; None when it has none yet (in start-up) or the launch script has
    written its ``exit`` since (the attempt is over, the next one not up yet). A fault is injected only when an
    attempt has reached its step (never in a start-up, where a SIGTERM saves nothing), by that attempt's own step:
    the run's highest step may be an earlier attempt's (steps are faster than a kill lands)."""
    step = None
    for event in events:
        kind = event.get("event")
        if kind in ("start", "exit"):
            step = None
        elif kind == "interval" and isinstance(event.get("step"), int):
            step = event["step"]
    return step


def fault_costs(events: list[dict], injected: list[dict]) -> list[dict[str, Any]]:
    """Seconds each fault cost the run, from its goodput events (`albert_dist.tracking.goodput`: ``start``,
    ``interval`` (one per step here), ``save``, ``end``, ``exit``, each with ``t`` in unix seconds and ``step``).

    The cost of a fault is the wall time during which the run made no new progress because of it: from the last
    step before it (the faulted attempt's last ``interval``; for a divergence, the step at which it was read) to
    the first event at which the run is back at that step (the next attempt's ``start`` when it resumes from a
    checkpoint of that step, else its ``interval`` there; after a rollback, the step trained again). It holds
    detection, the stop, the launcher's exit, the next start-up and checkpoint load, and the steps trained again.
    The i-th attempt-ending fault of `injected` (`ENDS_ATTEMPT`) ended the i-th attempt.

    Returns: one dict per fault of `injected`, in its order: ``fault``, ``step`` (the step it was injected at),
    ``last_step`` (the last step before it), ``cost_s`` (None when the events do not show the recovery) and
    ``recomputed_steps`` (steps trained a second time).
    Raises:
        ValueError: the events hold fewer attempts than the attempt-ending faults need.
    """
    attempts: list[list[dict]] = []
    for event in events:
        if event.get("event") == "start":
            attempts.append([event])
        elif attempts and event.get("event") != "exit":
            attempts[-1].append(event)
    ending = [f for f in injected if f["fault"] in ENDS_ATTEMPT]
    if len(attempts) < len(ending) + 1:
        raise ValueError(f"{len(ending)} faults ended an attempt, but the events hold {len(attempts)} attempts")
    out, k = [], 0
    for fault in injected:
        row: dict[str, Any] = {"fault": fault["fault"], "step": fault.get("seen_step", fault.get("step"))}
        if fault["fault"] in ENDS_ATTEMPT:
            intervals = [e for e in attempts[k] if e.get("event") == "interval"]
            last = intervals[-1] if intervals else attempts[k][0]
            back = next((e for e in attempts[k + 1] if e.get("event") in ("start", "interval")
                         and int(e["step"]) >= int(last["step"])), None)
            resumed = int(attempts[k + 1][0]["step"])
            row.update(last_step=int(last["step"]), recomputed_steps=max(0, int(last["step"]) - resumed))
            k += 1
        else:  # diverge: within an attempt, the first interval whose step is not above the one before is the
            # rollback's first step (across attempts that is a restart)
            intervals = [(n, e) for n, a in enumerate(attempts) for e in a if e.get("event") == "interval"]
            i = next((i for i in range(1, len(intervals)) if intervals[i][0] == intervals[i - 1][0]
                      and int(intervals[i][1]["step"]) <= int(intervals[i - 1][1]["step"])), None)
            intervals = [e for _, e in intervals]
            if i is None:
                row.update(last_step=None, recomputed_steps=0, cost_s=None)
                out.append(row)
                continue
            last = intervals[i - 1]
            back = next((e for e in intervals[i:] if int(e["step"]) >= int(last["step"])), None)
            row.update(last_step=int(last["step"]), recomputed_steps=int(last["step"]) - int(intervals[i]["step"]) + 1)
        row["cost_s"] = None if back is None else float(back["t"]) - float(last["t"])
        out.append(row)
    return out


def rollbacks(run_dir: Path) -> list[dict[str, Any]]:
    """The rollbacks a run logged (metrics.jsonl records with ``train/rollbacks``): the step it went back to, the
    step divergence was first flagged at, and rank 0's skipped micro-batches (first, last)."""
    from albert_dist.engine import metric_names as names

    return [{"to_step": r["step"], "from_step": r.get(names.TRAIN_ROLLBACK_FROM_STEP),
             "skipped_batches": [r.get(names.TRAIN_ROLLBACK_SKIPPED_FIRST), r.get(names.TRAIN_ROLLBACK_SKIPPED_LAST)]}
            for r in read_jsonl(run_dir / "metrics.jsonl") if names.TRAIN_ROLLBACKS in r]


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """Rank `rank`'s training process of the job writing to run_dir (`-m albert_dist.cli train`, RANK or, under
    srun, SLURM_PROCID in its environment; not the launcher's processes, not a loader worker). Slurm's virtual
    nodes of the CI cluster run on this host, so their ranks are found here too."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        env_rank = env.get(b"RANK", env.get(b"SLURM_PROCID"))  # the launcher's env://, or srun's
        if (f"run_dir={run_dir}".encode() in cmd and b"\0-m\0albert_dist.cli\0train\0" in cmd and env_rank is not None
                and not cmd.split(b"\0", 1)[0].endswith(b"srun")):  # srun's own command line names the trainer
            found[int(proc.name)] = (int(env_rank), ppid)
    return next((pid for pid, (r, ppid) in found.items() if r == rank and ppid not in found), None)


def _inject(name: str, run_dir: Path, victim: int, relay: Any, preempt: Any) -> bool:
    """Cause fault `name` now: ``kill9``/``sigstop`` to rank `victim`'s training process, ``preempt`` by calling
    `preempt` (the launcher's own way), ``store_outage`` by taking the relay down. False when the victim's process
    is not there yet (between attempts): the caller tries again."""
    if name in ("kill9", "sigstop"):
        pid = _rank_pid(run_dir, victim)
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL if name == "kill9" else signal.SIGSTOP)
    elif name == "preempt":
        preempt()
    elif name == "store_outage":
        relay.down()
    return True


def _injected(pending: list[tuple[str, int]], injected: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """Move the first pending fault, just caused at the attempt's `step`, to `injected`; returns its record when the
    run now awaits its exit 75 and relaunch or requeue (``preempt``, ``store_outage``), else None."""
    name, at = pending.pop(0)
    injected.append({"fault": name, "step": at, "seen_step": step, "t": time.time()})
    print(f"chaos: {name} at step {step}", flush=True)
    return injected[-1] if name in ("preempt", "store_outage") else None

def _launch(work: Path, run_dir: Path, ranks: int, steps: int, log: Path, env: dict, *extra: str) -> subprocess.Popen:
    env = {**os.environ, **env, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(["bash", str(SCRIPT), str(ranks), str(work / "chaos.yaml"), f"max_steps={steps}",
                             *extra], cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def chaos_run(work: Path, ranks: int, steps: int, faults: list[tuple[str, int]], victim: int, env: dict,
              relay: Any) -> list[dict[str, Any]]:
    """The disturbed run in ``work/chaos``; returns the faults as injected (fault, step asked, step seen, time)."""
    run_dir, log = work / "chaos", work / "chaos.log"
    pending = [f for f in faults if f[0] != "diverge"]
    injected: list[dict[str, Any]] = []
    restarts = sum(f in RESTARTED_BY_SCRIPT for f, _ in faults)
    proc = _launch(work, run_dir, ranks, steps, log, env, "--max-restarts", str(restarts))
    awaiting = None  # the fault whose exit 75 the run waits for (a store outage: the relay comes back then)
    try:
        while True:
            if awaiting is not None and awaiting["fault"] == "store_outage":
                after = [e.get("event") for e in read_jsonl(run_dir / "goodput.jsonl") if e.get("t", 0) > awaiting["t"]]
                if "exit" in after and "exit_t" not in awaiting:  # the attempt is over: the store is back before
                    awaiting["exit_t"] = time.time()              # the script's restart reads
                    relay.up()
                if "exit" in after and "start" in after[after.index("exit"):]:
                    awaiting = None  # the restarted attempt runs: the next fault may come
            code = proc.poll()
            if code is not None:
                if code == 75 and awaiting is not None:  # a preemption (or a store outage past the restart budget)
                    if "exit_t" not in awaiting:
                        awaiting["exit_t"] = time.time()
                        if awaiting["fault"] == "store_outage":
                            relay.up()  # the store is back before the relaunched job starts
                    awaiting = None
                    left = restarts - sum(f["fault"] in RESTARTED_BY_SCRIPT for f in injected)
                    proc = _launch(work, run_dir, ranks, steps, log, env, "--max-restarts", str(left),
                                   "--resume", "auto")
                    continue
                if code != 0:
                    raise RuntimeError(f"the chaos run ended with exit {code}; see {log}")
                return injected
            step = attempt_step(read_jsonl(run_dir / "goodput.jsonl")) if pending and awaiting is None else None
            if step is not None and step >= pending[0][1]:
                if not _inject(pending[0][0], run_dir, victim, relay, lambda: os.killpg(proc.pid, signal.SIGTERM)):
                    time.sleep(0.05)
                    continue
                awaiting = _injected(pending, injected, step)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)



#: the Slurm job's allocation on the CI cluster (.ci/slurm-cluster.sh): 2 tasks on one node, CPU mode, as
#: tests/e2e/test_slurm.py's kill -9 test (a 1-node job leaves the other node for the first excluded one); a time
#: limit far beyond the run, so that the script's `--signal=B:USR1@600` is only the one this script sends
SLURM_ALLOC = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=60"]


def _squeue(job: str) -> tuple[str, str]:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.split()
    return (out[0], out[1] if len(out) > 1 else "") if out else ("", "")


def _nodes_idle() -> bool:
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True).stdout.split()
    return bool(states) and all(s == "idle" for s in states)


def chaos_run_slurm(work: Path, ranks: int, steps: int, faults: list[tuple[str, int]], victim: int, env: dict,
                    relay: Any) -> list[dict[str, Any]]:
    """The disturbed run as one Slurm job (`slurm/pretrain.sbatch`, `SLURM_ALLOC` with `ranks` tasks) on the CI
    cluster, every recovery the batch script's own: a kill -9 or a hang is a crash requeue (the first failed node
    excluded), a store outage the ranks' own exit 75 after a checkpoint, requeued within the same budget
    (ALBERT_MAX_CRASH_REQUEUES, set to the schedule's count of the three), a preemption ``scancel --batch
    --signal=USR1`` (the time-limit warning the script traps: checkpoint, exit 75, requeue). Slurm holds a requeued job ~2.5 min (BeginTime): released here
    once it has been held 3 s and every node is idle (as tests/e2e/test_slurm.py does), after bringing the store
    back. Returns the faults as injected, as `chaos_run`.

    Raises:
        RuntimeError: the job did not end COMPLETED with exit 0 (its output is `work`/chaos.log).
    """
    run_dir, log = work / "chaos", work / "chaos.log"
    crash = sum(f in RESTARTED_BY_SCRIPT for f, _ in faults)
    job_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}, **env,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHON": sys.executable, "ALBERT_SLURM_CPU": "1", "ALBERT_RUN_DIR": str(run_dir),
               "ALBERT_CONFIG": str(work / "chaos.yaml"), "ALBERT_MAX_CRASH_REQUEUES": str(crash),
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    alloc = [a.replace("--ntasks-per-node=2", f"--ntasks-per-node={ranks}") for a in SLURM_ALLOC]
    job = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={log}", *alloc,
                          "slurm/pretrain.sbatch", f"max_steps={steps}"], env=job_env, capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.strip().split(";")[0]
    pending = [f for f in faults if f[0] != "diverge"]
    injected: list[dict[str, Any]] = []
    awaiting, held_since = None, None  # the fault whose requeue is awaited; when the requeued job was first seen held
    try:
        while True:
            state, reason = _squeue(job)
            if not state:
                info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
                if "JobState=COMPLETED" not in info or "ExitCode=0:0" not in info:
                    raise RuntimeError(f"the chaos job {job} did not complete: {info.strip()[:300]}; see {log}")
                return injected
            if state == "PENDING" and reason == "BeginTime":  # requeued, held
                if awaiting is not None:
                    awaiting["exit_t"] = time.time()
                    if awaiting["fault"] == "store_outage":
                        relay.up()  # the store is back before the requeued job starts
                    awaiting = None
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= 3.0 and _nodes_idle():
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
                time.sleep(0.5)
                continue
            held_since = None
            step = attempt_step(read_jsonl(run_dir / "goodput.jsonl")) if pending and awaiting is None else None
            if state == "RUNNING" and step is not None and step >= pending[0][1]:
                preempt = lambda: subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)  # noqa: E731
                if not _inject(pending[0][0], run_dir, victim, relay, preempt):
                    time.sleep(0.05)
                    continue
                awaiting = _injected(pending, injected, step)
            time.sleep(0.05)
    finally:
        if _squeue(job)[0]:
            subprocess.run(["scancel", job], capture_output=True)


def compare_weights(a: Path, b: Path) -> dict[str, Any]:
    """Two safetensors files tensor by tensor: ``equal`` (the same names, each tensor bit for bit: same dtype,
    shape and values), ``tensors`` (in `a`), ``elements``, ``differ`` (names that differ or are in one file only)
    and ``max_abs_diff`` (over the tensors both have with one shape; 0.0 when equal)."""
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    same_shape = [k for k in x if k in y and x[k].shape == y[k].shape]
    differ = sorted({k for k in x.keys() ^ y.keys()}
                    | {k for k in x if k in y and (x[k].dtype != y[k].dtype or x[k].shape != y[k].shape
                                                   or not bool((x[k] == y[k]).all()))})
    max_abs = max(((x[k].double() - y[k].double()).abs().max().item() for k in same_shape if x[k].numel()),
                  default=0.0)
    return {"equal": not differ, "tensors": len(x), "elements": sum(t.numel() for t in x.values()),
            "differ": differ, "max_abs_diff": max_abs}



def _final(work: Path, name: str) -> Path:
    return work / name / "final_model" / "fp32" / "model.safetensors"


def _reference(work: Path, name: str, args: argparse.Namespace, env: dict) -> float:
    started = time.time()
    proc = _launch(work, work / name, args.ranks, args.steps, work / f"{name}.log", env)
    if proc.wait() != 0:
        raise RuntimeError(f"the {name} run failed (exit {proc.returncode}); see {work / (name + '.log')}")
    return time.time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--faults", default=DEFAULT_FAULTS, help="<fault>@<step>,... (" + ", ".join(FAULTS) + ")")
    parser.add_argument("--victim", type=int, default=1, help="the rank a kill9 or sigstop hits (default 1)")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="a third run without the divergence switch, whose weights must differ (default on)")
    parser.add_argument("--slurm", action="store_true",
                        help="the disturbed run as one job on the Slurm cluster (.ci/slurm-cluster.sh start), "
                             "recovered by slurm/pretrain.sbatch's own requeues; the reference runs stay local")
    parser.add_argument("--json", help="write the record here (e.g. bench/results/chaos.json)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    try:
        if args.steps < 2 or args.save_every < 1:
            raise ValueError(f"--steps {args.steps} / --save-every {args.save_every}: expected >= 2 / >= 1")
        faults = parse_faults(args.faults, args.save_every, args.steps)
        if args.slurm and shutil.which("sbatch") is None:
            raise ValueError("--slurm: sbatch not found (start the CI cluster: .ci/slurm-cluster.sh start, as root)")
    except ValueError as err:
        print(f"bench/chaos.py: {err}", file=sys.stderr)
        return 2
    from fixtures.s3_server import S3Server, relayed_shards

    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=os.environ.get("BENCH_TMPDIR", "/tmp")))
    (work / "chaos.yaml").write_text(recipe(args.save_every))
    server = S3Server(process=True)
    relay = None
    try:
        relay, store_env = relayed_shards(server, BUCKET, work / "shards")
        store_env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        diverge = [s for f, s in faults if f == "diverge"]
        env = {**store_env, "ALBERT_INJECT_NONFINITE_STEP": ",".join(map(str, diverge))}
        started = time.time()
        timings = {"reference_wall_s": _reference(work, "reference", args, env)}
        if args.control and diverge:
            timings["control_wall_s"] = _reference(work, "control", args, {**store_env, "ALBERT_INJECT_NONFINITE_STEP": ""})
        chaos_started = time.time()
        injected = (chaos_run_slurm if args.slurm else chaos_run)(work, args.ranks, args.steps, faults, args.victim,
                                                                   env, relay)
        timings["chaos_wall_s"] = time.time() - chaos_started
        for s in diverge:
            injected.append({"fault": "diverge", "step": s, "seen_step": s, "how": "ALBERT_INJECT_NONFINITE_STEP"})
        injected.sort(key=lambda f: f["seen_step"])
        report = json.loads(subprocess.run([sys.executable, "-m", "albert_dist.cli", "goodput", str(work / "chaos"),
                                            "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        report["run_dir"] = "<work>/chaos"  # deleted unless --keep: no machine path in the record
        costs = fault_costs(read_jsonl(work / "chaos" / "goodput.jsonl"), injected)
        weights = compare_weights(_final(work, "chaos"), _final(work, "reference"))
        compared = {
            "what": ("final_model/fp32/model.safetensors of the disturbed run against the reference run's (the same "
                     "recipe, steps, ranks and corpus; the same ALBERT_INJECT_NONFINITE_STEP, no other fault), every "
                     "tensor bit for bit"),
            "rollbacks": {"chaos": rollbacks(work / "chaos"), "reference": rollbacks(work / "reference")},
            "chaos_vs_reference": weights}
        compared["same_rollback"] = compared["rollbacks"]["chaos"] == compared["rollbacks"]["reference"]
        if "control_wall_s" in timings:
            compared["chaos_vs_control"] = compare_weights(_final(work, "chaos"), _final(work, "control"))
            compared["chaos_vs_control"]["differ"] = len(compared["chaos_vs_control"]["differ"])  # a count suffices
        for f in injected:
            f.pop("t", None), f.pop("exit_t", None)
        record = {"launcher": "slurm/pretrain.sbatch" if args.slurm else "launch/pretrain_local.sh",
                  "steps": args.steps, "ranks": args.ranks, "save_every": args.save_every,
                  "step_timeout_s": STEP_TIMEOUT_S, "store_retry_s": STORE_RETRY_S, "faults": injected,
                  **{k: round(v, 1) for k, v in timings.items()}, "total_wall_s": round(time.time() - started, 1),
                  "goodput": report, "fault_costs": costs, "final_weights": compared,
                  "load_average": [round(x, 2) for x in os.getloadavg()],
                  "command": " ".join(["python", "bench/chaos.py", *(argv if argv is not None else sys.argv[1:])])}
        print(json.dumps({k: record[k] for k in ("faults", "fault_costs", "final_weights")}, indent=1))
        ok = weights["equal"] and compared["same_rollback"] and (
            "chaos_vs_control" not in compared or not compared["chaos_vs_control"]["equal"])
        print(f"goodput {100 * report['goodput']:.1f}% of {report['wall_s']:.1f} s, {report['restarts']} restarts; "
              f"reference run {timings['reference_wall_s']:.1f} s; final weights "
              f"{'equal' if weights['equal'] else 'DIFFER'}; {'ok' if ok else 'FAILED'}")
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        return 0 if ok else 1
    finally:
        if relay is not None:
            relay.down()
        server.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
