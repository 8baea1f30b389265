"""Ranks of a job started on this machine by the caller itself (the distributed tests and the benchmarks), with
the env:// variables torchrun would set, so `albert_dist.distributed.env.discover` and `init_distributed`
treat them as any launcher's.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from albert_dist.distributed.env import free_port


def local_rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The env:// variables torchrun sets for local rank ``rank`` of a ``world_size``-rank job on this machine
    (rendezvous at 127.0.0.1:``port``), with one OpenMP thread: what `discover` reads, for the processes the
    tests and benchmarks start themselves."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1"}


def _spawned_rank(rank: int, fn: Any, world_size: int, port: int, args: tuple) -> None:
    os.environ.update(local_rank_env(rank, world_size, port))
    import torch

    torch.set_num_threads(1)
    fn(rank, *args)


def spawn_local_ranks(fn: Any, world_size: int, *args: Any, timeout_s: Optional[float] = None) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` fresh processes on this machine (``torch.multiprocessing``,
    start method spawn: ``fn`` must be importable by name) with `local_rank_env` set and one torch thread each;
    ``fn`` starts its own process group (`init_distributed`). Returns when every rank returned.

    Raises:
        torch.multiprocessing.ProcessRaisedException / ProcessExitedException: a rank failed (its traceback);
            the other ranks are terminated.
        TimeoutError: not done within ``timeout_s`` (every rank terminated).
    """
    import time

    import torch.multiprocessing as mp

    ranks = mp.start_processes(_spawned_rank, args=(fn, world_size, free_port(), args), nprocs=world_size,
                               join=False, start_method="spawn")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not ranks.join(timeout=5.0 if deadline is None else max(0.1, min(5.0, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{world_size} local ranks did not finish within {timeout_s:g} s")
    finally:
        for proc in ranks.processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
