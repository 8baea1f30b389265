"""Chaos soak: one run under a schedule of faults, every one recovered without a person, against an undisturbed run
of the same steps (not in the suite, not in CI; a skeleton: the faults of issue 43's work have their places below).

A tiny ALBERT (the tiny model of tests/fixtures/ranks.py, checkpoints every `--save-every` steps, a log record every
step) on the bundled corpus, 2 CPU ranks under the real launcher: `launch/pretrain_local.sh N RECIPE --max-restarts
K`, which restarts a crash or a hang in place with `--resume auto`. This script watches metrics.jsonl from outside
and, when the run first reaches a fault's step, injects it:

* ``kill9``: SIGKILL of rank `--victim`'s training process (a crashed node); the launch script restarts the run.
* ``preempt``: SIGTERM to the job's process group (what `scancel` or a preemption does): every rank checkpoints the
  step and exits 75; this script then relaunches with `--resume auto`, as a Slurm requeue does.
* ``sigstop`` (needs issue 43's hang watchdog: exit 76, which `--max-restarts` restarts), ``diverge`` (needs its
  testing switch for a non-finite loss, and a rollback or a stop), ``store_outage`` (needs the training data in an
  object store behind a relay that can go down, as tests/e2e/test_object_store_outage.py builds it): not
  implemented here yet; asking for them is an error naming what is missing.

Then: the run's goodput (`albert-dist goodput RUN_DIR --json`), the time each fault cost (the killed attempt's
`lost`/`hung` time plus the next attempt's start-up, checkpoint load and recomputed steps), and the final weights
(`final_model/fp32/model.safetensors`) compared tensor by tensor with the undisturbed run's: on CPU fp32 on the
same number of ranks the resume is exact, so they must be equal (a rollback would skip a window: compare it then
against a run that skips the same window).

    python bench/chaos.py --steps 60 --faults kill9@15,preempt@35     # ~5-10 min on 2 loaded cores
    python bench/chaos.py --steps 60 --faults kill9@15 --json bench/results/chaos.json --keep

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
SCRIPT = ROOT / "launch" / "pretrain_local.sh"
#: fault -> what it needs before it can be injected here (None: implemented)
FAULTS: dict[str, str | None] = {
    "kill9": None, "preempt": None,
    "sigstop": "issue 43's hang watchdog (engine.step_timeout_s, exit 76)",
    "diverge": "issue 43's divergence detection and its testing switch for a non-finite loss",
    "store_outage": "an object-store source behind a relay (tests/e2e/test_object_store_outage.py)",
}
RECIPE = """
model: {vocab_size: 8000, embedding_size: 16, hidden_size: 32, num_hidden_layers: 3, num_hidden_groups: 2,
        num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 32, hidden_dropout_prob: 0.1,
        sharing: all}
data:
  train: [{paths: ["data/sample/wikitext-2-train-*.txt"]}]
  validation: []
  tokenizer_path: data/sample/spiece.model
  max_seq_length: 32
  max_predictions_per_seq: 4
  num_workers: 1
  shard_piece_bytes: 65536
optimizer: {lr: 0.003, warmup_steps: 2}
engine: {zero_stage: 2, train_micro_batch_size_per_gpu: 2, gradient_accumulation_steps: 2,
         peak_tflops_per_device: 1.0}
checkpoint: {save_interval_steps: 10, keep_last: 3}
tracking: {enabled: false}
log_interval_steps: 1
eval_interval_steps: 0
progress_bar: false
"""


def parse_faults(text: str) -> list[tuple[str, int]]:
    """``"kill9@15,preempt@35"`` -> [("kill9", 15), ("preempt", 35)], sorted by step.

    Raises:
        ValueError: an unknown fault, one not implemented yet (naming what it needs), or a bad step.
    """
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, step = item.partition("@")
        if name not in FAULTS:
            raise ValueError(f"--faults: unknown fault {name!r} (choose from {', '.join(FAULTS)})")
        if FAULTS[name] is not None:
            raise ValueError(f"--faults: {name} is not implemented yet: it needs {FAULTS[name]}")
        if not step.isdigit() or int(step) < 1:
            raise ValueError(f"--faults: {item!r}: expected <fault>@<step >= 1>")
        out.append((name, int(step)))
    return sorted(out, key=lambda f: f[1])


def _max_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for line in lines:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(steps, default=0)


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """Rank `rank`'s training process of the job writing to run_dir (`-m albert_dist.cli train`, RANK in its
    environment; not the launcher's processes, not a loader worker)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if f"run_dir={run_dir}".encode() in cmd and b"\0-m\0albert_dist.cli\0train\0" in cmd and b"RANK" in env:
            found[int(proc.name)] = (int(env[b"RANK"]), ppid)
    return next((pid for pid, (r, ppid) in found.items() if r == rank and ppid not in found), None)


def _launch(work: Path, run_dir: Path, ranks: int, steps: int, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(["bash", str(SCRIPT), str(ranks), str(work / "chaos.yaml"), f"max_steps={steps}",
                             *extra], cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def chaos_run(work: Path, ranks: int, steps: int, faults: list[tuple[str, int]], victim: int,
              max_restarts: int) -> list[dict[str, Any]]:
    """The disturbed run in ``work/chaos``; returns the faults as injected (fault, step asked, step seen, time)."""
    run_dir, log = work / "chaos", work / "chaos.log"
    pending, injected = list(faults), []
    proc = _launch(work, run_dir, ranks, steps, log, "--max-restarts", str(max_restarts))
    while True:
        code = proc.poll()
        if code is not None:
            if code == 75 and injected and injected[-1]["fault"] == "preempt" and not injected[-1].get("relaunched"):
                injected[-1]["relaunched"] = True  # what a requeue does
                proc = _launch(work, run_dir, ranks, steps, log, "--max-restarts", str(max_restarts),
                               "--resume", "auto")
                continue
            if code != 0:
                raise RuntimeError(f"the chaos run ended with exit {code}; see {log}")
            return injected
        step = _max_step(run_dir)
        if pending and step >= pending[0][1]:
            name, at = pending.pop(0)
            if name == "kill9":
                pid = _rank_pid(run_dir, victim)
                if pid is None:
                    pending.insert(0, (name, at))
                    time.sleep(0.05)
                    continue
                os.kill(pid, signal.SIGKILL)
            elif name == "preempt":
                os.killpg(proc.pid, signal.SIGTERM)
            injected.append({"fault": name, "step": at, "seen_step": step, "t": time.time()})
            print(f"chaos: {name} at step {step}", flush=True)
        time.sleep(0.05)


def compare_weights(a: Path, b: Path) -> dict[str, Any]:
    """Tensor by tensor: equal, the names that differ and the largest absolute difference."""
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    differ = sorted(k for k in x if k not in y or not (x[k] == y[k]).all())
    max_abs = max(((x[k].float() - y[k].float()).abs().max().item() for k in x if k in y), default=0.0)
    return {"equal": not differ and set(x) == set(y), "tensors": len(x), "differ": differ, "max_abs_diff": max_abs}


def fault_costs(report: dict, injected: list[dict]) -> list[dict[str, Any]]:
    """Seconds each fault cost, from the goodput attempts: attempt i ended by fault i (its lost and hung time),
    attempt i + 1 starting again (start-up, checkpoint load, recomputed steps)."""
    attempts, out = report["attempts"], []
    for i, fault in enumerate(injected):
        if i + 1 >= len(attempts):
            break
        end, again = attempts[i]["badput_s"], attempts[i + 1]["badput_s"]
        cost = (end.get("lost", 0) + end.get("hung", 0) + again.get("startup", 0) + again.get("checkpoint_load", 0)
                + again.get("recomputed", 0))
        out.append({"fault": fault["fault"], "step": fault["seen_step"], "cost_s": cost,
                    "recomputed_steps": attempts[i + 1]["recomputed_steps"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--faults", default="kill9@15,preempt@35", help="<fault>@<step>,... (" + ", ".join(FAULTS) + ")")
    parser.add_argument("--victim", type=int, default=1, help="the rank a kill9 kills (default 1)")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--json", help="write the record here (e.g. bench/results/chaos.json)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.faults)
    except ValueError as err:
        print(f"bench/chaos.py: {err}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=os.environ.get("BENCH_TMPDIR", "/tmp")))
    (work / "chaos.yaml").write_text(RECIPE.replace("save_interval_steps: 10", f"save_interval_steps: {args.save_every}"))
    try:
        started = time.time()
        ref = _launch(work, work / "reference", args.ranks, args.steps, work / "reference.log")
        if ref.wait() != 0:
            raise RuntimeError(f"the undisturbed run failed; see {work / 'reference.log'}")
        reference_s = time.time() - started
        injected = chaos_run(work, args.ranks, args.steps, faults, args.victim,
                             max_restarts=sum(f == "kill9" for f, _ in faults))
        report = json.loads(subprocess.run([sys.executable, "-m", "albert_dist.cli", "goodput", str(work / "chaos"),
                                            "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        report["run_dir"] = "<work directory>/chaos"  # deleted unless --keep: no machine path in the record
        weights = compare_weights(*(work / d / "final_model" / "fp32" / "model.safetensors"
                                    for d in ("chaos", "reference")))
        record = {"steps": args.steps, "ranks": args.ranks, "faults": injected, "reference_wall_s": reference_s,
                  "goodput": report, "fault_costs": fault_costs(report, injected), "final_weights": weights,
                  "load_average": os.getloadavg(), "command": " ".join(["python", "bench/chaos.py", *(argv or sys.argv[1:])])}
        print(json.dumps({k: record[k] for k in ("faults", "fault_costs", "final_weights")}, indent=1))
        print(f"goodput {100 * report['goodput']:.1f}% of {report['wall_s']:.1f} s, {report['restarts']} restarts; "
              f"undisturbed run {reference_s:.1f} s; final weights {'equal' if weights['equal'] else 'DIFFER'}")
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1))
        return 0 if weights["equal"] else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
