"""How the training loop learns it must stop, and how a job's processes end whatever happened.

`StopFlag`: SIGTERM, SIGUSR1 and SIGINT set a flag the loop polls after every optimiser step; the ranks agree on
the step, checkpoint it and exit 75. Slurm's `--signal=B:USR1@T`, `scancel --signal`, the deepspeed launcher
forwarding a SIGTERM and a terminal's Ctrl-C (SIGINT to the whole foreground process group) all arrive here. A
second SIGINT aborts at once: after the first one, SIGINT is back to the kernel's default action (terminate),
which works even while the process waits inside a collective, where no Python handler would run.

DataLoader workers ignore the stop signals (`IgnoreStopSignals`), so a signal to the whole process group does
not kill them in the middle of the step the trainer finishes. For the same reason they would also ignore
multiprocessing's exit-time `terminate()` and keep the process from exiting; `stop_loader_workers` ends them
explicitly, and an exit hook does it for any path that did not (see `IgnoreStopSignals`).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.util  # registers multiprocessing's exit handler, which ours must precede (atexit: LIFO)
import os
import signal
import sys
import threading
import time
from typing import Any, Iterable, Optional

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopFlag:
    """Records the first SIGTERM/SIGUSR1/SIGINT; the loop polls it after every optimiser step.

    `retire()` once the process's exit code is decided: stop signals are then ignored, so a launcher ending the
    other ranks when the first one exits (srun's kill-on-bad-exit, DeepSpeed's launch.py: SIGTERM) cannot turn a
    rank's 75, 74 or 2 into "killed by SIGTERM" (143) in its last milliseconds (seen on Slurm: rank 1 exited 75,
    srun terminated rank 0 while its interpreter shut down, and the requeue script read 143).
    """

    def __init__(self) -> None:
        self.signum = 0
        self.retired = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if signum == signal.SIGINT:  # a second Ctrl-C is the kernel's: terminate at once
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if not self.signum and not self.retired:
            self.signum = signum
            # No promise of a checkpoint here: a rank of a job whose other rank died gets a SIGTERM from the
            # launcher too, and will not write one. The trainer says so once every rank has agreed to stop.
            logger.warning("received %s: stopping after this step%s", signal.Signals(signum).name,
                           " (Ctrl-C again aborts without a checkpoint)" if signum == signal.SIGINT else "")

    def install(self) -> None:
        if self._previous:
            return
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def retire(self) -> None:
        """Act on no further stop signal (see the class docstring): SIGTERM and SIGUSR1 are ignored from now on.
        Ignored, not handled: the interpreter's finalization resets a Python handler to the default action (which
        kills), an ignored signal stays ignored to the process's end. SIGINT keeps its Ctrl-C meaning."""
        self.retired = True
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_IGN)


def stop_loader_workers(iterators: Iterable[Any] = (), timeout_s: float = 5.0) -> int:
    """End every DataLoader worker of this process; returns how many had to be killed.

    First the iterators' own shutdown (`_shutdown_workers`: a sentinel to each worker, a join of up to 5 s, as
    their `__del__` does), then SIGKILL for any daemonic child process still alive (DataLoader workers are
    daemonic), e.g. of an iterator that was being built when an exception ended it: the traceback holds it,
    so nobody shuts it down. SIGTERM would not do: the workers ignore it
    (`IgnoreStopSignals`). torch's SIGCHLD handler is reset first, since it raises in the main thread when a
    worker it still watches dies.
    """
    for it in iterators:
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
    # Daemonic children are what multiprocessing terminates at exit anyway (SIGTERM, which the workers
    # ignore); the training process starts no other ones.
    live = [p for p in multiprocessing.active_children() if p.daemon and p.is_alive()]
    if live:
        if hasattr(signal, "SIGCHLD"):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for p in live:
            p.kill()
        for p in live:
            p.join(timeout_s)
    return len(live)


#: Seconds a rank may spend ending (workers, tracker, process group) after an error before it exits regardless.
EXIT_DEADLINE_S = 20.0


def exit_deadline(code: int, seconds: float = EXIT_DEADLINE_S) -> threading.Thread:
    """After an error: exit the process with `code` in `seconds` if it has not ended by then (a daemon thread;
    an orderly exit before that ends it). Whatever the cleanup waits on (a worker, an MLflow server, NCCL's
    process-group teardown), the rank is gone within a bound, and its peers, whose collectives fail as soon as
    its sockets close, follow."""

    def expire() -> None:
        time.sleep(seconds)
        logger.error("still not ended %.0f s after the error: exiting now (exit %d)", seconds, code)
        logging.shutdown()
        os._exit(code)

    thread = threading.Thread(target=expire, name="exit-deadline", daemon=True)
    thread.start()
    return thread


#: DeepSpeed's CPU allreduce workspace in /dev/shm (deepspeed/ops/csrc/cpu/comm/shm.cpp, `shm_initialize`):
#: ``<prefix>_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
SHM_WORKSPACE_PREFIX = "deepspeed_allreduce_buffer"


def release_shm_workspace(shm_dir: str = "/dev/shm") -> list[str]:
    """Remove this rank's DeepSpeed CPU allreduce workspace from ``shm_dir`` once its job is over; returns the
    paths removed.

    Why: DeepSpeed's shared-memory allreduce (CPU ranks on one node) creates one 66 MiB segment per rank and never
    unlinks it, so every CPU job left world_size x 66 MiB of RAM in /dev/shm until the next reboot (310 segments,
    20 GiB, on the development machine after two days of tests, and the suite's next run was OOM-killed). The
    other ranks keep their mappings; only the name goes. The rank DeepSpeed used is the local one (one node) or
    the global one: both names are tried, and only a segment of this job's address and port is touched.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return []
    removed = []
    for rank in {os.environ.get("LOCAL_RANK"), os.environ.get("RANK")} - {None}:
        path = os.path.join(shm_dir, f"{SHM_WORKSPACE_PREFIX}_{os.getuid()}_{addr}_{port}_{rank}")
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # not created (gloo without the shm op, a GPU job) or already gone
            pass
    return removed


def end_rank(code: int) -> None:
    """End this rank of a multi-rank job with `code` once its job is closed (tracker ended, loader workers
    stopped, process group destroyed): flush logging and stdio, then `os._exit(code)`, without the
    interpreter's finalization.

    Why: in finalization, objects of the C++ runtime still referenced from Python (gloo's process groups and the
    work handles DeepSpeed's ZeRO-3 keeps for prefetched parameters) are destroyed while the interpreter is
    torn down, and a rank that finished its job can still abort there ("terminate called without an active
    exception", SIGABRT): seen in 1 of 37 2-rank ZeRO-3 jobs on this CPU machine, and in CI; the same class of
    crash as pytorch/pytorch#179291. A launcher reads such a rank's exit as a failed job (Slurm requeues it).
    Exit handlers (`atexit`) do not run: the job's own end (`albert_dist.apps.pretrain.main.main`) has done their work, and
    `stop_loader_workers` runs here once more for any DataLoader worker still alive.
    """
    stop_loader_workers()
    release_shm_workspace()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to keep
            pass
    os._exit(code)


def peer_failure(err: BaseException) -> bool:
    """True when `err` is a collective failing because another rank is gone (gloo: the peer closed its
    connection; NCCL: a remote error or the watchdog's timeout): that rank's own traceback is the cause, this
    one is noise."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        needle in text for needle in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                      "NCCL communicator was aborted", "remote process exited", "Socket Timeout"))


_EXIT_HOOK = False


def _kill_workers_at_exit() -> None:
    if multiprocessing.current_process().name == "MainProcess":
        stop_loader_workers()


class IgnoreStopSignals:
    """DataLoader `worker_init_fn`: stop signals are the training process's business, workers ignore them.

    Creating one (in the training process) registers an exit hook that kills the DataLoader workers still
    alive: it runs before multiprocessing's own exit handler (atexit runs hooks last-registered first), whose
    `terminate()` + `join()` would wait forever on a worker that ignores SIGTERM.
    """

    def __init__(self, then: Optional[Any] = None):
        global _EXIT_HOOK
        self.then = then
        if not _EXIT_HOOK:
            atexit.register(_kill_workers_at_exit)
            _EXIT_HOOK = True

    def __call__(self, worker_id: int) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)


__all__ = ["STOP_SIGNALS", "EXIT_DEADLINE_S", "StopFlag", "IgnoreStopSignals", "end_rank", "exit_deadline",
           "peer_failure", "stop_loader_workers"]
