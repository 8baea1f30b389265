"""The harness the tests share (importable as ``helpers``: pytest puts tests/ on sys.path).

* `run_cli`: ``python -m albert_dist.cli ...`` from the checkout in a `clean_env` (a test run inside srun or
  torchrun must not make the job it starts think it is one of that job's ranks);
* `start_ranks`: one process per local gloo rank with torchrun's variables
  (`albert_dist.distributed.local_ranks.local_rank_env`), as new interpreters or forked (`fixtures.forkserver`), in a
  `rank_env`; `spawn_local_ranks` and `free_port` for in-process workers;
* `read_metrics`: the records of a run directory's metrics.jsonl;
* `load_bench`, `load_tool`: a script of bench/ or tools/ as a module (neither is a package).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from albert_dist.distributed.env import free_port
from albert_dist.distributed.local_ranks import local_rank_env, spawn_local_ranks
from albert_dist.tracking.base import read_metric_log

REPO = Path(__file__).resolve().parents[1]
#: What a launcher or a Slurm step sets that would make a started job join the caller's job.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

__all__ = ["REPO", "clean_env", "free_port", "load_bench", "local_rank_env", "rank_env", "read_metrics", "run_cli",
           "spawn_local_ranks", "start_ranks", "load_tool"]


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without `LAUNCHER_VARS` and ``SLURM_*``, with one OpenMP thread, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def rank_env(**extra: str) -> dict[str, str]:
    """`clean_env` for the ranks of a CPU test job: DeepSpeed's CPU accelerator, no GPU visible (what
    `fixtures.forkserver` imports with, so its forked ranks and new interpreters see the same), plus ``extra``."""
    return clean_env(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", **extra)


def run_cli(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 600,
            cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m albert_dist.cli ARGS`` (this interpreter) in ``env`` (default `clean_env()`), output captured
    as text; never raises on a non-zero exit (the caller asserts the code and shows ``stderr``)."""
    return subprocess.run([sys.executable, "-m", "albert_dist.cli", *args], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def start_ranks(cmd: Sequence[str], world_size: int, *, env: Optional[dict[str, str]] = None,
                logs: Optional[Sequence[Any]] = None, fork: bool = False, **popen: Any) -> list[subprocess.Popen]:
    """Start ``cmd`` once per local rank with `local_rank_env` (one rendezvous port) over ``env`` (default
    `clean_env()`); rank r's stdout and stderr go to ``logs[r]`` when given; ``popen`` goes to each
    `subprocess.Popen`. ``fork``: fork each rank from `fixtures.forkserver` (torch, DeepSpeed and the trainer
    already imported; ``cmd`` a Python script or module; ``popen`` only ``cwd``) instead of a new interpreter.
    The caller waits for and kills them."""
    port, base = free_port(), env or clean_env()
    if fork:
        from fixtures import forkserver

        return [forkserver.start(cmd, env={**base, **local_rank_env(rank, world_size, port)},
                                 cwd=popen.pop("cwd", os.getcwd()), stdout=None if logs is None else logs[rank],
                                 stderr=None if logs is None else subprocess.STDOUT, **popen)
                for rank in range(world_size)]
    if logs is not None:
        popen["stderr"] = subprocess.STDOUT
    return [subprocess.Popen(list(cmd), env={**base, **local_rank_env(rank, world_size, port)},
                             **popen, **({} if logs is None else {"stdout": logs[rank]}))
            for rank in range(world_size)]


def read_metrics(run_dir: str | Path, key: Optional[str] = None) -> list[dict]:
    """The whole records of ``<run_dir>/metrics.jsonl`` in file order (a line being written is left out), only
    those holding ``key`` when given."""
    records = [{k: v for k, v in r.items() if k != "_end"} for r in read_metric_log(run_dir)]
    return [r for r in records if key is None or key in r]


def load_bench(rel: str, name: Optional[str] = None) -> Any:
    """bench/<rel>.py imported as module `name` (default ``bench_<rel>_under_test``), with bench/ on sys.path for
    its own imports (`_common`, siblings). The module is registered in ``sys.modules`` under `name`: dataclasses
    look their module up there, and spawned processes unpickle its functions by that name."""
    return _load_script("bench", rel, name)


def load_tool(rel: str, name: Optional[str] = None) -> Any:
    """tools/<rel>.py imported as module `name` (default ``tools_<rel>_under_test``), as `load_bench` does."""
    return _load_script("tools", rel, name)


def _load_script(folder: str, rel: str, name: Optional[str]) -> Any:
    where = REPO / folder
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    name = name or f"{folder}_{Path(rel).name}_under_test"
    spec = importlib.util.spec_from_file_location(name, where / f"{rel}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
