"""The process pool `albert-dist data prepare`'s scan and write stages share, and their progress counter."""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import sys
from typing import Callable, Optional, Sequence

from albert_dist.job.console import configure_logging


_PROGRESS = None  # a multiprocessing Value in each worker (set by _init_worker), or in-process

#: glibc's mallopt parameters (malloc.h) and the values `hold_freed_memory` sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD_BYTES, _MMAP_THRESHOLD_BYTES = 1 << 30, 32 << 20


def hold_freed_memory() -> bool:
    """Have glibc's malloc keep the memory this process frees for its next allocations instead of handing it
    back to the kernel: blocks up to 32 MiB come from the heap (M_MMAP_THRESHOLD, glibc's largest) and the heap
    is not trimmed below 1 GiB of free space (M_TRIM_THRESHOLD). Returns whether both were set (False where the
    C library has no ``mallopt``: musl, macOS).

    Why: the stages allocate and free a few MiB per 4 MiB block (decoded input, parsed columns, shard buffers);
    by default glibc returns those pages and the next block faults fresh ones in, and a first-touched page is dear
    on a VM (its zeroing, and the host's mapping). 1 GB of JSON lines, ``--workers 1``: 202k -> 34k minor page
    faults, ~0.5 of ~10 CPU-s (docs/data-scale.md). Peak memory is unchanged: what is kept is what was in use.
    Setting either alone is worse (a trim threshold turns off glibc's adaptive mmap threshold: 747k faults).
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                    _TRIM_THRESHOLD_BYTES))


def _init_worker(counter) -> None:
    global _PROGRESS
    _PROGRESS = counter
    hold_freed_memory()
    configure_logging(level=logging.WARNING, replace=False)


def advance(n: float) -> None:
    if _PROGRESS is not None and n > 0:
        with _PROGRESS.get_lock():
            _PROGRESS.value += int(n)


class Workers:
    """A process pool shared by the scan and write stages (spawned once: starting a Python with pyarrow costs ~1 s
    of CPU) or, with one worker, the caller's process. ``map`` runs ``fn(*job)`` for every job, returns the
    results in job order and feeds a tqdm bar from the jobs' `advance` calls (shown only on a terminal unless
    ``progress`` says otherwise); ``on_result(i, result)``, if given, runs in the caller's process as each job
    ends (in completion order); the first failing job's exception is raised after the rest are cancelled."""

    def __init__(self, workers: int, progress: Optional[bool]) -> None:
        self._ctx = mp.get_context("spawn")  # no state (threads, open files) forked from the caller
        self._counter = self._ctx.Value("q", 0)
        self._workers, self._progress = workers, progress
        self._pool: Optional[cf.ProcessPoolExecutor] = None
        hold_freed_memory()  # the caller's process runs the jobs when there is one worker

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(self, fn: Callable, jobs: Sequence[tuple], bar_total: float, bar_desc: str,
            on_result: Optional[Callable[[int, object], None]] = None) -> list:
        global _PROGRESS
        from tqdm import tqdm

        with self._counter.get_lock():
            self._counter.value = 0
        results: list = [None] * len(jobs)
        disable = None if self._progress is None else not self._progress
        with tqdm(total=int(bar_total), desc=bar_desc, unit="B", unit_scale=True, disable=disable,
                  file=sys.stderr, dynamic_ncols=True) as bar:
            def update() -> None:
                bar.update(max(0, self._counter.value - bar.n))

            if self._workers == 1 or len(jobs) <= 1:
                _PROGRESS = self._counter
                try:
                    for i, job in enumerate(jobs):
                        results[i] = fn(*job)
                        if on_result is not None:
                            on_result(i, results[i])
                        update()
                finally:
                    _PROGRESS = None
                return results
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(max_workers=self._workers, mp_context=self._ctx,
                                                    initializer=_init_worker, initargs=(self._counter,))
            futures = {self._pool.submit(fn, *job): i for i, job in enumerate(jobs)}
            pending = set(futures)
            try:
                while pending:
                    done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        results[futures[fut]] = fut.result()
                        if on_result is not None:
                            on_result(futures[fut], results[futures[fut]])
                    update()
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
        return results
