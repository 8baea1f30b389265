"""Run every benchmark in ``bench/`` and write one ``bench/results.json``, the table in docs/benchmarks.md and a plot.

    python bench/run_all.py                      # what `make bench` runs (< 10 min on 2 CPU cores)
    python bench/run_all.py --only resume zero   # a subset (results.json then holds only that subset)
    MLFLOW_TRACKING_URI=sqlite:///mlruns.db python bench/run_all.py   # also log the suite to MLflow

A benchmark is a module ``bench/<name>.py`` with a top-level ``run(repeats: int, ...) -> dict`` (found by
parsing the file, so discovery imports nothing). Each one runs in its own child process (a fresh interpreter:
no DeepSpeed/process-group state leaks between benchmarks, a hung one is killed at its timeout with its
whole process group) with ``OMP_NUM_THREADS=1`` unless the caller set it. Its returned dict is stored as is
under ``benchmarks.<name>.result``; every number in it is summarized under ``benchmarks.<name>.summary`` as
``{"min", "median", "max", "n"}`` keyed by its dotted path: a list of numbers counts as one value per repeat,
a dict with ``min``/``median``/``max`` is taken as already summarized, a scalar has n = 1. Ratios are
therefore summarized over per-repeat ratios when a benchmark returns them per repeat.

The suite is one MLflow run (experiment ``albert_dist-bench``): params are the machine facts and the sizes
passed to each benchmark, metrics ``<bench>/<dotted key>/{min,median,max}``, artifacts results.json and the
plot, so runs of the suite on different commits or machines can be compared side by side.
"""
from __future__ import annotations

import argparse
import ast
import collections
import datetime as dt
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))  # report.py beside this file; bench/ is scripts, not a package

import report  # noqa: E402

log = logging.getLogger("bench")

#: Sizes passed to each benchmark by the suite, chosen so the whole suite stays under 10 minutes on 2 CPU
#: cores. Keys are keyword arguments of that benchmark's run(); only those its signature accepts are passed.
SUITE_ARGS: dict[str, dict[str, Any]] = {
    "model_step": {"repeats": 2},
    "data_pipeline": {"repeats": 3},
    "zero": {"repeats": 2},
    "lamb": {"repeats": 2},
    "checkpoint_io": {"repeats": 3},
    "resume": {"repeats": 3},
    # read amplification on 40 MB corpora, one slot's throughput 128 MB vs 16 MB, 1-step runs over 2,000 files,
    # a 1,024 x 8-slot plan (~2 min); --full sizes in docs/data.md
    "data_scale": {"repeats": 1, "full": False},
    # ours (matched recipe) vs the peer as the standalone 1,000-step run (bench/convergence.py), on 60 steps and
    # 200 scored blocks (~80 s); at 60 steps both sit near the unigram floor: it checks the harness end to end
    # albert-base, bf16 (the like-with-like cells of DeepSpeed's estimators), ZeRO-2/3 on 1 and 4 ranks, and its
    # activations at S=512 (~90 s on idle cores); `python bench/memory_scale.py --full` measures every preset
    "memory_scale": {"presets": ["albert-base"], "stages": [2, 3], "worlds": [1, 4], "precisions": ["bf16"],
                     "activation_presets": ["albert-base"], "seqs": [512]},
    "convergence": {"steps": 60, "report_steps": [30, 60], "curve_every": 30, "score_blocks": 200,
                    "recipes": ["matched"]},
}
DEFAULT_ARGS: dict[str, Any] = {"repeats": 3}
#: Seconds a benchmark may run before it is killed (its entry then says "timed out").
DEFAULT_TIMEOUT_S = 300.0
#: Seconds the whole suite may take (issue 8: under 10 minutes on 2 CPU cores); a benchmark gets at most what
#: is left, and one that would get less than MIN_START_S is not started ("not run").
DEFAULT_BUDGET_S = 570.0
MIN_START_S = 20.0

#: Modules in bench/ that are not benchmarks even if they grew a `run` (the runner and the renderer).
NOT_BENCHMARKS = {"run_all", "report"}


def discover(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Names of the modules in ``bench_dir`` that define a top-level ``run`` function, sorted.

    Files starting with ``_`` or ``test_`` and :data:`NOT_BENCHMARKS` are skipped. A file that does not parse
    is reported as a benchmark too, so that its failure shows in the results instead of vanishing.
    """
    names = []
    for path in sorted(bench_dir.glob("*.py")):
        name = path.stem
        if name in NOT_BENCHMARKS or name.startswith(("_", "test_")):
            continue
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError:
            names.append(name)
            continue
        if any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
            names.append(name)
    return names


# ---------------------------------------------------------------------------------------------- summaries
def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def summarize(result: Any, prefix: str = "") -> dict[str, dict[str, float]]:
    """``{dotted key: {"min", "median", "max", "n"}}`` for every number in a benchmark's result.

    A list of numbers is one value per repeat; a dict holding ``min``, ``median`` and ``max`` is already a
    summary (its ``n`` kept if given), and so are sibling keys ``<x>_min``, ``<x>_median``, ``<x>_max`` (summary
    of ``<x>``; n from a sibling ``repeats`` key, else 0 = unknown); a scalar gives n = 1; NaN/inf values are
    dropped from lists. Lists of non-numbers and strings are not summarized, nor a top-level ``summary`` dict
    (a benchmark's own summary of lists that are summarized here anyway).
    """
    out: dict[str, dict[str, float]] = {}
    if isinstance(result, dict):
        if all(k in result for k in ("min", "median", "max")) and all(
                _is_number(result[k]) for k in ("min", "median", "max")):
            n = result.get("n", result.get("repeats", 0))
            out[prefix] = {"min": float(result["min"]), "median": float(result["median"]),
                           "max": float(result["max"]), "n": int(n) if _is_number(n) else 0}
            return out
        # Flat `<x>_min`, `<x>_median`, `<x>_max` siblings are one summary of `<x>`.
        triples = {k[: -len("_median")] for k, v in result.items() if k.endswith("_median") and _is_number(v)}
        triples = {b for b in triples if _is_number(result.get(f"{b}_min")) and _is_number(result.get(f"{b}_max"))}
        n = result.get("repeats")
        for base in sorted(triples):
            out[f"{prefix}.{base}" if prefix else base] = {
                "min": float(result[f"{base}_min"]), "median": float(result[f"{base}_median"]),
                "max": float(result[f"{base}_max"]), "n": int(n) if _is_number(n) else 0}
        grouped = {f"{b}_{s}" for b in triples for s in ("min", "median", "max")}
        for k, v in result.items():
            if k not in grouped and not (k == "summary" and not prefix):
                out.update(summarize(v, f"{prefix}.{k}" if prefix else str(k)))
    elif _is_number(result):
        out[prefix] = {"min": float(result), "median": float(result), "max": float(result), "n": 1}
    elif isinstance(result, (list, tuple)) and result and all(_is_number(v) for v in result):
        vals = [float(v) for v in result if math.isfinite(float(v))]
        if vals:
            out[prefix] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}
    return out


def _json_safe(x: Any) -> Any:
    """``x`` with NaN/inf as None and unknown objects as strings, so results.json is strict JSON."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (str, int, bool)):
        return x
    if hasattr(x, "item"):  # numpy / torch scalars
        return _json_safe(x.item())
    return str(x)


# ---------------------------------------------------------------------------------------------- machine
def machine_facts() -> dict[str, Any]:
    """CPU model, cores, memory, GPU, library versions, date and git commit of the machine running the suite."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        mem_gib = psutil.virtual_memory().total / 2**30
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        mem_gib, physical = float("nan"), None
    try:
        cores_used = len(os.sched_getaffinity(0))
    except AttributeError:
        cores_used = os.cpu_count()
    versions = {}
    for dist in ("torch", "deepspeed", "datasets", "transformers", "mlflow", "sentencepiece", "torchdata",
                 "albert_dist"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    gpu = None
    try:  # only a name; the CPU suite never puts work on a GPU
        import torch

        if torch.cuda.is_available():
            gpu = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except ImportError:
        pass

    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu_model": cpu, "cpu_count": os.cpu_count(), "cpu_physical_cores": physical,
        "cpu_cores_used": cores_used, "memory_gib": round(mem_gib, 1), "gpu": gpu,
        "os": platform.platform(), "python": platform.python_version(), "versions": versions,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": (commit + ("-dirty" if dirty else "")) if commit else None,
    }


# ---------------------------------------------------------------------------------------------- running
def _child(module_path: str, kwargs_json: str, out_path: str) -> int:
    """Child-process entry: import the benchmark file, call ``run(**kwargs)``, write its dict as JSON."""
    sys.path.insert(0, str(ROOT))
    name = Path(module_path).stem
    # Its plain name (bench/ is on PYTHONPATH): spawned ranks/workers unpickle its functions by that name.
    spec = importlib.util.spec_from_file_location(name, module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look the module up there
    spec.loader.exec_module(module)
    kwargs = json.loads(kwargs_json)
    params = inspect.signature(module.run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {k: v for k, v in kwargs.items() if takes_any or k in params}
    ignored = sorted(set(kwargs) - set(accepted))
    if ignored:
        log.warning("%s.run() takes no %s; not passed", name, ignored)
    result = module.run(**accepted)
    if not isinstance(result, dict):
        raise TypeError(f"bench/{name}.py run() returned {type(result).__name__}, expected dict")
    Path(out_path).write_text(json.dumps({"kwargs": accepted, "result": _json_safe(result)}))
    return 0


def run_one(name: str, kwargs: dict[str, Any], timeout_s: float, bench_dir: Path = BENCH_DIR) -> dict[str, Any]:
    """Run ``<bench_dir>/<name>.py``'s ``run(**kwargs)`` in a child process; its entry for results.json.

    The entry: ``status`` ('ok' | 'skipped' | 'failed' | 'timed out'), ``wall_s``, ``kwargs``, ``result``,
    ``summary`` (see :func:`summarize`), and ``error`` with the last output lines when it did not succeed.
    A benchmark reports 'skipped' by returning ``{"skipped": "<reason>"}`` (e.g. a module it needs is absent).
    The child's output is echoed line by line with a ``[name]`` prefix.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    paths = [str(ROOT), str(bench_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        out_path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(bench_dir / f"{name}.py"),
               json.dumps(kwargs), out_path]
        t0 = time.perf_counter()
        # Own session: a timeout kills the benchmark and every rank/worker it started, nothing else.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        tail: collections.deque[str] = collections.deque(maxlen=30)

        def pump() -> None:
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                print(f"[{name}] {line}", end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:  # Ctrl-C / SIGTERM of the runner: its own session must not outlive it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        reader.join(timeout=5)
        wall = time.perf_counter() - t0
        entry: dict[str, Any] = {"wall_s": round(wall, 2), "kwargs": kwargs}
        if timed_out:
            entry.update(status="timed out", error=f"killed after {timeout_s:.0f} s\n" + "\n".join(tail))
        elif proc.returncode != 0 or not os.path.exists(out_path):
            entry.update(status="failed", error=f"exit code {proc.returncode}\n" + "\n".join(tail))
        else:
            payload = json.loads(Path(out_path).read_text())
            result = payload["result"]
            entry.update(kwargs=payload["kwargs"], result=result, summary=summarize(result))
            entry["status"] = "skipped" if result.get("skipped") else "ok"
    return entry


def log_to_mlflow(results: dict[str, Any], tracking_uri: str, experiment: str, artifacts: list[Path]) -> str:
    """Log one suite run to MLflow (params: machine + sizes, metrics: every summary); returns the run id."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    m = results["machine"]
    run = client.create_run(exp_id, run_name=f"bench {m.get('git_commit')} {m['date_utc']}",
                            tags={"albert_dist.kind": "bench-suite"})
    rid = run.info.run_id
    try:
        params = {"cpu_model": m["cpu_model"], "cpu_cores_used": m["cpu_cores_used"], "memory_gib": m["memory_gib"],
                  "gpu": m["gpu"], "git_commit": m["git_commit"], "python": m["python"],
                  **{f"version.{k}": v for k, v in m["versions"].items()}}
        tags = {}
        for name, entry in results["benchmarks"].items():
            tags[f"status.{name}"] = entry["status"]
            for k, v in entry.get("kwargs", {}).items():
                params[f"{name}.{k}"] = v
        now = int(time.time() * 1000)
        metrics = [Metric("suite/wall_s", results["wall_s"], now, 0)]
        for name, entry in results["benchmarks"].items():
            metrics.append(Metric(f"{name}/wall_s", entry["wall_s"], now, 0))
            for key, s in entry.get("summary", {}).items():
                for stat in ("min", "median", "max"):
                    metric_key = f"{name}/{key}/{stat}"[:250]
                    metrics.append(Metric(metric_key, s[stat], now, 0))
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            client.log_batch(rid, metrics=metrics[i:i + 1000])
        client.log_batch(rid, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        for path in artifacts:
            if path.exists():
                client.log_artifact(rid, str(path))
        ok = all(e["status"] in ("ok", "skipped") for e in results["benchmarks"].values())
        client.set_terminated(rid, "FINISHED" if ok else "FAILED")
    except BaseException:
        client.set_terminated(rid, "FAILED")
        raise
    return rid


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the suite; returns 0 when every benchmark ran ('ok' or 'skipped'), else 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s bench-child %(levelname)s %(message)s")
        return _child(*argv[1:4])
    p = argparse.ArgumentParser(description="Run every benchmark in bench/ (see the module docstring).")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    p.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="do not run these benchmarks")
    p.add_argument("--repeats", type=int, help="override every benchmark's repeats")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="per-benchmark time limit")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="time limit of the whole suite")
    p.add_argument("--results", default=str(BENCH_DIR / "results.json"), help="results file to write")
    p.add_argument("--doc", "--readme", dest="doc", default=str(ROOT / "docs" / "benchmarks.md"),
                   help="Markdown file whose 'Benchmarks' section gets the table ('' = none)")
    p.add_argument("--plot", default=str(BENCH_DIR / "results.png"), help="plot to write ('' = none)")
    p.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI; unset = no MLflow logging)")
    p.add_argument("--mlflow-experiment", default="albert_dist-bench")
    p.add_argument("--list", action="store_true", help="print the benchmarks found and exit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s bench %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that run_one can stop the running benchmark

    found = discover()
    if args.list:
        print("\n".join(found))
        return 0
    unknown = sorted(set(args.only or []) - set(found)) + sorted(set(args.skip) - set(found))
    if unknown:
        p.error(f"no benchmark named {unknown} in {BENCH_DIR} (found: {found})")
    names = [n for n in found if (not args.only or n in args.only) and n not in args.skip]
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")

    t0 = time.perf_counter()
    results: dict[str, Any] = {"machine": machine_facts(), "benchmarks": {},
                               "suite": {"found": found, "run": names, "budget_s": args.budget_s,
                                         "timeout_s": args.timeout_s, "repeats_override": args.repeats}}
    for name in names:
        kwargs = dict(SUITE_ARGS.get(name, DEFAULT_ARGS))
        if args.repeats is not None:
            kwargs["repeats"] = args.repeats
        left = args.budget_s - (time.perf_counter() - t0)
        if left < MIN_START_S:
            log.error("=== %s not started: %.0f s of the %.0f s suite budget left", name, left, args.budget_s)
            results["benchmarks"][name] = {"status": "not run", "wall_s": 0.0, "kwargs": kwargs,
                                           "error": f"suite budget of {args.budget_s:.0f} s spent"}
            continue
        log.info("=== %s %s", name, kwargs)
        entry = run_one(name, kwargs, min(args.timeout_s, left))
        results["benchmarks"][name] = entry
        log.info("=== %s: %s in %.1f s", name, entry["status"], entry["wall_s"])
    results["wall_s"] = round(time.perf_counter() - t0, 1)

    out = Path(args.results)
    out.write_text(json.dumps(_json_safe(results), indent=1) + "\n")
    table = report.render_table(results)
    if args.plot:
        report.plot(results, args.plot)
    if args.doc:
        doc = Path(args.doc)
        doc.write_text(report.update_readme(doc.read_text(), table))
    print("\n" + table + "\n")
    print(f"suite wall time {results['wall_s']:.1f} s; wrote {out}")
    if args.mlflow_uri:
        rid = log_to_mlflow(results, args.mlflow_uri, args.mlflow_experiment,
                            [out] + ([Path(args.plot)] if args.plot else []))
        print(f"MLflow run {rid} at {args.mlflow_uri} (experiment {args.mlflow_experiment})")
    bad = [n for n, e in results["benchmarks"].items() if e["status"] not in ("ok", "skipped")]
    if bad:
        log.error("benchmarks that did not finish: %s", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
