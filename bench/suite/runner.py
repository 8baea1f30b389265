"""The benchmark suite's runner (what bench/run_all.py drives): each benchmark in a child process with a time
limit, the min / median / max summary of every number it returns, the machine's facts, one MLflow run per
suite. bench/suite/report.py renders the results.

Run as a script only by `run_one` itself: ``python bench/suite/runner.py --child BENCH.py KWARGS_JSON OUT``.
"""
from __future__ import annotations

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

BENCH_DIR = Path(__file__).resolve().parents[1]
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))  # _common.py: bench/ is scripts, not a package

from _common import stats  # noqa: E402

log = logging.getLogger("bench")


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
        summary = stats(result)  # NaN/inf dropped
        if summary["n"]:
            out[prefix] = summary
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


def run_child(path: Path, kwargs: dict[str, Any], timeout_s: float, bench_dir: Path = BENCH_DIR) -> dict[str, Any]:
    """Run benchmark file ``path``'s ``run(**kwargs)`` in a child process (``bench_dir``, ``path``'s folder and
    the checkout on its path); its entry for results.json.

    The entry: ``status`` ('ok' | 'skipped' | 'failed' | 'timed out'), ``wall_s``, ``kwargs``, ``result``,
    ``summary`` (see :func:`summarize`), and ``error`` with the last output lines when it did not succeed.
    A benchmark reports 'skipped' by returning ``{"skipped": "<reason>"}`` (e.g. a module it needs is absent).
    The child's output is echoed line by line with a ``[name]`` prefix.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    name = path.stem
    paths = list(dict.fromkeys([str(ROOT), str(bench_dir), str(path.parent)]))
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        out_path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), json.dumps(kwargs), out_path]
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


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s bench-child %(levelname)s %(message)s")
    sys.exit(_child(*sys.argv[2:5]))
