"""Soak: the quickstart job run for thousands of steps, watched for leaks and drift (not in the suite, not in CI).

albert-tiny on the bundled WikiText-2 sample, 2 ranks under the real launcher (`launch/pretrain_local.sh 2`,
the quickstart recipe configs/pretrain/albert-tiny-wikitext.yaml unchanged except `max_steps`: log every 50
steps, validation and a checkpoint every 250, keep_last 2, 1 loader worker per rank), tracking into a local
MLflow store (SQLite + artifact directory in the soak's work directory; checkpoint artifacts, system metrics
and the final model on, as by default). Every `--sample-every` steps (when the log record of that step is in
metrics.jsonl and, on checkpoint steps, the checkpoint is complete) the soak records, from outside the job:

* RSS of every rank's main process and of its loader workers (/proc/<pid>/status VmRSS), and their CPU seconds;
* step time: global batch x sequence length / `perf/positions_per_s` of the window's log records (the trainer
  leaves evaluation and checkpoint time out), and CPU seconds per step of each rank;
* bytes of the run directory (checkpoints apart) and their number; MLflow's rows (metrics, params, tags), the
  SQLite file and the artifact directory; the load average.

Targets after warm-up (the first `--warmup-steps`, default 20 % of the run, at least 2 samples): RSS growth
< 5 MB per 1,000 steps on every rank (least-squares slope), step-time drift < 5 % (mean of the last fifth of the
samples over the first fifth after warm-up; also in CPU seconds, which a loaded machine disturbs less), disk
bounded by `keep_last` (checkpoints never above keep_last + 1 checkpoints' bytes, the in-flight one).

    python bench/soak.py --budget-min 30                # 5,000 steps or what fits in 30 min, whichever first
    python bench/soak.py --steps 600 --sample-every 100  # smoke test

With `--budget-min` the job gets SIGTERM when the budget is spent (the trainer finishes the step, checkpoints it
and exits 75, the documented preemption code) and the figures cover the steps sampled until then (`steps_done`).
    python bench/soak.py --json soak.json --keep         # keep the work directory (run dir, MLflow store)
    python bench/soak.py --report soak.json              # the tables of an earlier run again

The work directory is under $BENCH_TMPDIR (default /tmp) and deleted at the end unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
TARGET_RSS_MB_PER_1000 = 5.0
TARGET_DRIFT = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------- sampling
def _processes(run_dir: str) -> dict[int, dict[str, Any]]:
    """The job's processes: {pid: {"ppid", "rank"}}, found by `run_dir=<run_dir>` on their command line: the
    launcher's own processes (no RANK in their environment, rank None), the ranks, and their loader workers
    (forked: same command line and environment, parent = a rank)."""
    out = {}
    needle = f"run_dir={run_dir}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(b"albert_dist.cli" in c for c in cmd) or needle not in cmd:
                continue
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
            out[int(entry.name)] = {"ppid": ppid, "rank": int(env[b"RANK"]) if b"RANK" in env else None}
        except (OSError, ValueError):
            continue
    return out


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _tree_bytes(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path` (0, 0 when absent), each inode once (the MLflow uploader stages checkpoint
    files as hard links: no second copy on disk); files vanishing during the walk are skipped."""
    total = files = 0
    seen: set = set()
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
            files += 1
    return total, files


def _mlflow_rows(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        out = {t: con.execute(f"select count(*) from {t}").fetchone()[0]
               for t in ("metrics", "latest_metrics", "params", "tags")}
        # MLflow's system metrics come every system_metrics_interval_s, whatever the step rate
        out["system_metrics"] = con.execute("select count(*) from metrics where key like 'system/%'").fetchone()[0]
        return out
    except sqlite3.Error:
        return {}
    finally:
        con.close()


def sample(step: int, run_dir: Path, work: Path, window: list[dict], step_positions: int) -> dict[str, Any]:
    """One sample of the job at `step` (module docstring); `window` = the log records since the last one."""
    procs = _processes(str(run_dir))
    ranks: dict[str, Any] = {}
    mains = {pid for pid, p in procs.items() if p["rank"] is not None and procs.get(p["ppid"], {}).get("rank") is None}
    for pid in mains:
        p = procs[pid]
        workers = [w for w, q in procs.items() if q["ppid"] == pid]
        try:
            ranks[str(p["rank"])] = {
                "pid": pid, "rss_bytes": _rss_bytes(pid), "cpu_s": _cpu_s(pid),
                "workers": len(workers), "workers_rss_bytes": sum(_rss_bytes(w) for w in workers),
                "workers_cpu_s": sum(_cpu_s(w) for w in workers)}
        except OSError:
            continue
    ckpt_bytes, ckpt_files = _tree_bytes(run_dir / "checkpoints")
    run_bytes, run_files = _tree_bytes(run_dir)
    rates = [r["perf/positions_per_s"] for r in window if r.get("perf/positions_per_s")]
    art_bytes, art_files = _tree_bytes(work / "mlflow-artifacts")
    return {
        "step": step, "time": time.time(), "loadavg_1m": os.getloadavg()[0], "ranks": ranks,
        "step_s": statistics.mean(step_positions / r for r in rates) if rates else None,
        "run_dir_bytes": run_bytes - ckpt_bytes, "run_dir_files": run_files - ckpt_files,
        "checkpoint_bytes": ckpt_bytes,
        "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")),
        "mlflow_rows": _mlflow_rows(work / "mlruns.db"),
        "mlflow_db_bytes": (work / "mlruns.db").stat().st_size if (work / "mlruns.db").exists() else 0,
        "mlflow_artifact_bytes": art_bytes, "mlflow_artifact_files": art_files,
    }


# ------------------------------------------------------------------------------------------- analysis
def slope_per_1000(steps: list[float], values: list[float]) -> float:
    """Least-squares slope of values over steps, per 1,000 steps (0 for fewer than 2 points)."""
    if len(steps) < 2:
        return 0.0
    ms, mv = statistics.mean(steps), statistics.mean(values)
    den = sum((s - ms) ** 2 for s in steps)
    return 1000.0 * sum((s - ms) * (v - mv) for s, v in zip(steps, values)) / den if den else 0.0


def analyse(samples: list[dict], warmup_steps: int, keep_last: int) -> dict[str, Any]:
    """The figures and targets of the module docstring from the samples."""
    post = [s for s in samples if s["step"] > warmup_steps]
    if len(post) < 3:
        post = samples[2:] if len(samples) > 4 else samples
    steps = [s["step"] for s in post]
    out: dict[str, Any] = {"warmup_steps": warmup_steps, "samples_after_warmup": len(post), "ranks": {}}
    for rank in sorted({r for s in post for r in s["ranks"]}):
        pts = [(s["step"], s["ranks"][rank]) for s in post if rank in s["ranks"]]
        xs = [p[0] for p in pts]
        cpu = [(b[1]["cpu_s"] - a[1]["cpu_s"]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:]) if b[0] > a[0]]
        out["ranks"][rank] = {
            "rss_mb": [p[1]["rss_bytes"] / 1e6 for p in pts],
            "rss_growth_mb_per_1000_steps": slope_per_1000(xs, [p[1]["rss_bytes"] / 1e6 for p in pts]),
            "workers_rss_growth_mb_per_1000_steps": slope_per_1000(xs, [p[1]["workers_rss_bytes"] / 1e6 for p in pts]),
            "cpu_s_per_step": cpu,
            "cpu_drift": _drift(cpu),
        }
    step_s = [s["step_s"] for s in post if s["step_s"]]
    out["step_s"] = step_s
    out["step_time_drift"] = _drift(step_s)
    ck = [s["checkpoint_bytes"] for s in samples]
    per_ckpt = max((s["checkpoint_bytes"] / len(s["checkpoints"]) for s in samples if s["checkpoints"]), default=0)
    out["checkpoint_bytes_max"] = max(ck, default=0)
    out["checkpoint_bytes_one"] = per_ckpt
    out["checkpoints_max"] = max((len(s["checkpoints"]) for s in samples), default=0)
    out["run_dir_growth_bytes_per_1000_steps"] = slope_per_1000(steps, [s["run_dir_bytes"] for s in post])
    rows = [s["mlflow_rows"].get("metrics", 0) - s["mlflow_rows"].get("system_metrics", 0) for s in post]
    out["mlflow_metric_rows_per_1000_steps"] = slope_per_1000(steps, rows)  # training/validation metrics
    hours = [(s["time"] - post[0]["time"]) / 3600 for s in post]
    out["mlflow_system_metric_rows_per_hour"] = slope_per_1000(hours, [s["mlflow_rows"].get("system_metrics", 0)
                                                                     for s in post]) / 1000
    out["mlflow_db_bytes_per_1000_steps"] = slope_per_1000(steps, [s["mlflow_db_bytes"] for s in post])
    out["mlflow_artifact_bytes_max"] = max((s["mlflow_artifact_bytes"] for s in samples), default=0)
    out["mlflow_artifact_growth_bytes_per_1000_steps"] = slope_per_1000(steps, [s["mlflow_artifact_bytes"] for s in post])
    out["loadavg_1m"] = [s["loadavg_1m"] for s in samples]
    worst_rss = max((r["rss_growth_mb_per_1000_steps"] for r in out["ranks"].values()), default=0.0)
    out["targets"] = {
        "rss_growth_mb_per_1000_steps_max": worst_rss, "rss_ok": worst_rss < TARGET_RSS_MB_PER_1000,
        "step_time_drift": out["step_time_drift"],
        "step_time_ok": out["step_time_drift"] is not None and abs(out["step_time_drift"]) < TARGET_DRIFT,
        "disk_ok": out["checkpoints_max"] <= keep_last + 1 and (
            per_ckpt == 0 or out["checkpoint_bytes_max"] <= (keep_last + 1) * per_ckpt * 1.01),
    }
    return out


def _drift(values: list[float]) -> Optional[float]:
    """mean(last fifth) / mean(first fifth) - 1 (at least one value each), None for fewer than 2 values."""
    if len(values) < 2:
        return None
    k = max(1, len(values) // 5)
    return statistics.mean(values[-k:]) / statistics.mean(values[:k]) - 1.0


# ------------------------------------------------------------------------------------------- the soak
def soak(steps: int = 5000, sample_every: int = 250, ranks: int = 2, warmup_steps: Optional[int] = None,
         workdir: Optional[str] = None, keep: bool = False, timeout_s: float = 4 * 3600,
         budget_s: Optional[float] = None) -> dict[str, Any]:
    """Run the soak (module docstring); returns samples, analysis, command, wall time and exit code.
    `budget_s`: wall seconds after which the job is stopped with SIGTERM (exit 75 expected, not a failure).

    Raises `ValueError` when `sample_every` is not a multiple of the recipe's log interval (50) and
    `RuntimeError` when the job fails or exceeds `timeout_s` (the job's process group is killed).
    """
    if sample_every % 50 or steps < 2 * sample_every:
        raise ValueError(f"sample_every must be a multiple of 50 (the recipe's log interval) and steps >= "
                         f"2 x sample_every; got {sample_every}, {steps}")
    from mlflow.tracking import MlflowClient

    from albert_dist.config import load_config
    from albert_dist.exit_codes import EXIT_PREEMPTED

    cfg = load_config(ROOT / RECIPE, [f"max_steps={steps}"])
    step_positions = cfg.engine.train_micro_batch_size_per_gpu * cfg.engine.gradient_accumulation_steps * ranks \
        * cfg.data.max_seq_length
    work = Path(tempfile.mkdtemp(prefix="soak-", dir=workdir or os.environ.get("BENCH_TMPDIR")))
    run_dir = work / "run"
    uri = f"sqlite:///{work / 'mlruns.db'}"
    # The experiment with its artifact root in the work directory (MLflow's default is ./mlruns of the cwd).
    MlflowClient(uri).create_experiment("albert_dist-soak", artifact_location=str(work / "mlflow-artifacts"))
    cmd = ["bash", "launch/pretrain_local.sh", str(ranks), RECIPE, f"max_steps={steps}", "progress_bar=false",
           f"tracking.tracking_uri={uri}", "tracking.experiment_name=albert_dist-soak"]
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log_path = work / "job.log"
    t0 = time.time()
    samples: list[dict] = []
    stopped = False
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            metrics, offset, window, due = run_dir / "metrics.jsonl", 0, [], sample_every
            while True:
                done = proc.poll() is not None
                if metrics.exists():
                    with open(metrics) as f:
                        f.seek(offset)
                        chunk = f.read()
                    complete = chunk[:chunk.rfind("\n") + 1]
                    offset += len(complete.encode())
                    for line in complete.splitlines():
                        rec = json.loads(line)
                        if "perf/positions_per_s" in rec:
                            window.append(rec)
                        if rec.get("step", 0) >= due and "perf/positions_per_s" in rec:
                            if due % cfg.checkpoint.save_interval_steps == 0:  # let that step's save finish
                                _wait_for_checkpoint(run_dir, due, proc, timeout_s=600)
                            samples.append(sample(due, run_dir, work, window, step_positions))
                            s = samples[-1]
                            print(f"[soak] step {due}: step {s['step_s'] or float('nan'):.3f} s, RSS "
                                  + ", ".join(f"rank {r} {v['rss_bytes'] / 1e6:.0f} MB" for r, v in sorted(s["ranks"].items()))
                                  + f", run dir {s['run_dir_bytes'] / 1e6:.2f} MB + checkpoints "
                                  f"{s['checkpoint_bytes'] / 1e6:.1f} MB, MLflow metric rows "
                                  f"{s['mlflow_rows'].get('metrics')}, load {s['loadavg_1m']:.1f}", flush=True)
                            window, due = [], due + sample_every
                if done:
                    break
                if budget_s is not None and not stopped and time.time() - t0 > budget_s:
                    os.killpg(proc.pid, signal.SIGTERM)  # the documented stop: finish the step, checkpoint, exit 75
                    stopped = True
                if time.time() - t0 > timeout_s:
                    raise RuntimeError(f"soak: the job ran past {timeout_s:.0f} s")
                time.sleep(1.0)
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    wall = time.time() - t0
    tail = log_path.read_text(errors="replace").splitlines()[-15:]
    here = lambda text: text.replace(str(work), "<work>")  # noqa: E731 - the record names no machine's folder
    result: dict[str, Any] = {
        "steps": steps, "ranks": ranks, "sample_every": sample_every, "command": here(" ".join(cmd)),
        "run_dir_env": "RUN_DIR=<work>/run", "exit_code": proc.returncode, "wall_s": wall, "samples": samples,
        "keep_last": cfg.checkpoint.keep_last, "log_tail": [here(line) for line in tail],
        "budget_s": budget_s, "stopped_by_budget": stopped,
        "steps_done": samples[-1]["step"] if samples else 0,
    }
    if proc.returncode != (EXIT_PREEMPTED if stopped else 0):
        raise RuntimeError(f"soak: the job exited {proc.returncode}:\n" + "\n".join(tail))
    result["final_mlflow_artifact_bytes"] = _tree_bytes(work / "mlflow-artifacts")[0]
    warmup = warmup_steps if warmup_steps is not None else max(sample_every * 2, result["steps_done"] // 5)
    result["analysis"] = analyse(samples, warmup, cfg.checkpoint.keep_last)
    if keep:
        result["workdir"] = str(work)
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


def _wait_for_checkpoint(run_dir: Path, step: int, proc: subprocess.Popen, timeout_s: float) -> None:
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        try:
            if latest.read_text().strip() == f"step_{step}":
                return
        except OSError:
            pass
        time.sleep(0.5)


def report(res: dict[str, Any]) -> str:
    """The soak's figures as Markdown (docs/scale-mlflow.md)."""
    a = res["analysis"]
    t = a["targets"]
    done = res.get("steps_done", res["steps"])
    ended = (f"stopped by the {res['budget_s'] / 60:.0f}-minute budget after {done} of max_steps={res['steps']}"
             if res.get("stopped_by_budget") else f"all {res['steps']}")
    lines = [f"{done} steps ({ended}), {res['ranks']} ranks, {res['wall_s'] / 60:.1f} min wall, load average (1 min) "
             f"{min(a['loadavg_1m']):.1f}-{max(a['loadavg_1m']):.1f} while sampling; warm-up {a['warmup_steps']} steps",
             "", "| figure (after warm-up) | value | target | met |", "|---|---|---|---|"]
    for rank, r in sorted(a["ranks"].items()):
        lines.append(f"| rank {rank} RSS growth (main process; loader worker "
                     f"{r['workers_rss_growth_mb_per_1000_steps']:+.2f}) | {r['rss_growth_mb_per_1000_steps']:+.2f} MB "
                     f"per 1,000 steps (RSS {min(r['rss_mb']):.0f}-{max(r['rss_mb']):.0f} MB) | < 5 | "
                     # the target bounds growth (a leak); a falling slope is the allocator returning memory
                     f"{'yes' if r['rss_growth_mb_per_1000_steps'] < TARGET_RSS_MB_PER_1000 else '**no**'} |")
    for rank, r in sorted(a["ranks"].items()):
        if r["cpu_drift"] is not None:
            lines.append(f"| rank {rank} CPU seconds per step, drift last / first fifth | {r['cpu_drift']:+.1%} | — | — |")
    drift = a["step_time_drift"]
    lines.append(f"| step time (wall), drift last / first fifth | "
                 f"{'n/a' if drift is None else f'{drift:+.1%}'} ({min(a['step_s']):.3f}-{max(a['step_s']):.3f} s) | "
                 f"< 5 % | {'yes' if t['step_time_ok'] else '**no**'} |")
    lines.append(f"| checkpoints on disk (max) | {a['checkpoints_max']} x {a['checkpoint_bytes_one'] / 1e6:.1f} MB, "
                 f"max {a['checkpoint_bytes_max'] / 1e6:.1f} MB | <= keep_last + 1 = {res['keep_last'] + 1} | "
                 f"{'yes' if t['disk_ok'] else '**no**'} |")
    lines.append(f"| run directory without checkpoints | {a['run_dir_growth_bytes_per_1000_steps'] / 1e3:+.1f} kB per "
                 f"1,000 steps | — | — |")
    lines.append(f"| MLflow metric rows: training and validation | {a['mlflow_metric_rows_per_1000_steps']:.0f} per "
                 f"1,000 steps | — | — |")
    lines.append(f"| MLflow metric rows: system metrics (one node) | {a['mlflow_system_metric_rows_per_hour']:.0f} per "
                 f"hour | — | — |")
    lines.append(f"| MLflow SQLite file | {a['mlflow_db_bytes_per_1000_steps'] / 1e6:+.2f} MB per 1,000 steps | — | — |")
    lines.append(f"| MLflow artifacts (checkpoints kept) | max {a['mlflow_artifact_bytes_max'] / 1e6:.1f} MB during the "
                 f"run, {a['mlflow_artifact_growth_bytes_per_1000_steps'] / 1e6:+.2f} MB per 1,000 steps; "
                 f"{res['final_mlflow_artifact_bytes'] / 1e6:.1f} MB at the end (final model included) | — | — |")
    lines += ["", "Every sample (the load average is the machine's, shared with other jobs):", "",
              "| step | step time, s | CPU s per step (rank 0) | RSS MB per rank | checkpoints on disk | load (1 min) |",
              "|---|---|---|---|---|---|"]
    prev = None
    for s in res["samples"]:
        r0 = s["ranks"].get("0")
        cpu = (f"{(r0['cpu_s'] - prev[1]) / (s['step'] - prev[0]):.3f}" if r0 and prev else "—")
        step_s = f"{s['step_s']:.3f}" if s["step_s"] else "—"
        lines.append(f"| {s['step']} | {step_s} | {cpu} | "
                     + ", ".join(f"{v['rss_bytes'] / 1e6:.0f}" for _, v in sorted(s["ranks"].items()))
                     + f" | {len(s['checkpoints'])} ({s['checkpoint_bytes'] / 1e6:.1f} MB) | {s['loadavg_1m']:.1f} |")
        prev = (s["step"], r0["cpu_s"]) if r0 else None
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--sample-every", type=int, default=250)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--budget-min", type=float, help="stop the job (SIGTERM, exit 75) after this many wall minutes")
    p.add_argument("--workdir", help="parent of the work directory (default $BENCH_TMPDIR or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", help="write the result to this file")
    p.add_argument("--report", metavar="JSON", help="run nothing: print the tables of an earlier --json result")
    a = p.parse_args(argv)
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return 0
    sys.path.insert(0, str(ROOT))
    res = soak(steps=a.steps, sample_every=a.sample_every, ranks=a.ranks, warmup_steps=a.warmup_steps,
               workdir=a.workdir, keep=a.keep, budget_s=a.budget_min * 60 if a.budget_min else None)
    print(report(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if all(v for k, v in res["analysis"]["targets"].items() if k.endswith("_ok")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
