"""albert_dist.job.stop: the stop signals, a second Ctrl-C, and processes that end whatever happened (issue 20).

Each case runs in a child interpreter (signals and exit hooks are process-wide); the exit status and timing are
the kernel's, not the code's own report.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from albert_dist.job.stop import STOP_SIGNALS, peer_failure


def _python(code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, time.monotonic() - start


def test_sigint_is_a_stop_signal_and_a_second_one_aborts_at_once():
    assert signal.SIGINT in STOP_SIGNALS and signal.SIGTERM in STOP_SIGNALS and signal.SIGUSR1 in STOP_SIGNALS
    proc, _ = _python("""
        import os, signal, time
        from albert_dist.job.stop import StopFlag
        flag = StopFlag()
        flag.install()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        print("flag", flag.signum, flush=True)  # the first Ctrl-C: a flag, no KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)   # another stop signal changes nothing
        print("still", flag.signum, flush=True)
        os.kill(os.getpid(), signal.SIGINT)    # the second Ctrl-C: the kernel ends the process
        time.sleep(5)
        print("not aborted", flush=True)
    """)
    assert proc.stdout.split() == ["flag", str(int(signal.SIGINT)), "still", str(int(signal.SIGINT))], proc.stderr
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert "received SIGINT: stopping after this step (Ctrl-C again aborts without a checkpoint)" in proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr


def test_a_worker_that_ignores_sigterm_no_longer_blocks_the_exit():
    """The hang's mechanism: multiprocessing's exit handler terminate()s daemonic children with SIGTERM and
    join()s them; a DataLoader worker ignoring SIGTERM (IgnoreStopSignals) kept the process alive for ever.
    The exit hook IgnoreStopSignals registers kills them first."""
    proc, elapsed = _python("""
        import multiprocessing, time
        from albert_dist.job.stop import IgnoreStopSignals

        def worker():
            IgnoreStopSignals()(0)  # as a DataLoader worker's worker_init_fn
            time.sleep(600)

        if __name__ == "__main__":
            ignore = IgnoreStopSignals()
            p = multiprocessing.get_context("fork").Process(target=worker, daemon=True)
            p.start()
            time.sleep(0.5)
            raise ValueError("setup failed while a worker was alive")
    """, timeout=120)
    assert proc.returncode == 1 and "ValueError: setup failed" in proc.stderr, proc.stderr
    assert elapsed < 30, elapsed


def test_stop_loader_workers_kills_the_live_daemonic_workers():
    proc, elapsed = _python("""
        import multiprocessing, signal, time
        from albert_dist.job.stop import stop_loader_workers

        def worker():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)

        if __name__ == "__main__":
            ps = [multiprocessing.get_context("fork").Process(target=worker, daemon=True) for _ in range(2)]
            for p in ps:
                p.start()
            time.sleep(0.3)
            print("killed", stop_loader_workers([]), [p.exitcode for p in ps], flush=True)
    """, timeout=120)
    assert proc.stdout.split("\n")[0] == f"killed 2 [{-signal.SIGKILL}, {-signal.SIGKILL}]", proc.stdout + proc.stderr
    assert proc.returncode == 0 and elapsed < 30


@pytest.mark.parametrize("err, peer", [
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:42647"),
     True),
    (RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:57478: Connection reset by peer"), True),
    (RuntimeError("injected: evaluation failed at step 2"), False),
    (ValueError("Connection closed by peer"), False),  # not a collective's error type
])
def test_a_collective_failing_because_a_peer_is_gone_is_told_from_an_error_of_its_own(err, peer):
    assert peer_failure(err) is peer


def test_a_retired_flag_keeps_the_exit_code_when_a_launcher_sigterms_the_rank_at_its_exit():
    """srun's kill-on-bad-exit and DeepSpeed's launch.py SIGTERM the ranks still running when the first one exits;
    a rank that has decided its exit code (75 here) keeps it, even through the interpreter's shutdown, where a
    Python handler is reset to the default action (a handler that merely absorbed the signal exits 143 here)."""
    proc, _ = _python("""
        import os, subprocess, sys, time
        from albert_dist.job.stop import StopFlag
        flag = StopFlag()
        flag.install()
        flag.retire()
        # SIGTERM without pause until this process is gone: through its exit, finalization included
        subprocess.Popen(["bash", "-c", f"while kill -TERM {os.getpid()} 2>/dev/null; do :; done"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # ends once this one is reaped
        time.sleep(0.3)
        sys.exit(75)
    """)
    assert proc.returncode == 75, (proc.returncode, proc.stderr)
    assert "received" not in proc.stderr


@pytest.mark.parametrize("world_size", [1, 2])
def test_end_process_ends_a_rank_of_a_job_flushed_and_returns_in_a_single_process(world_size):
    """A rank of a multi-rank job exits with the job's code at once: its buffered stdout and its log lines are
    out, the interpreter's exit handlers (its teardown) never run; one process gets control back."""
    proc, _ = _python(f"""
        import atexit, logging, os, sys
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="{world_size}", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT="29999")
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        from albert_dist.apps.pretrain.main import end_process
        atexit.register(lambda: print("finalization ran"))
        print("buffered stdout line")  # a pipe: block-buffered until flushed
        logging.getLogger("job").info("a log line")
        end_process(75)
        print("returned")
        sys.exit(3)
        """)
    assert "buffered stdout line" in proc.stdout and "a log line" in proc.stderr
    if world_size == 2:
        assert proc.returncode == 75
        assert "returned" not in proc.stdout and "finalization ran" not in proc.stdout
    else:
        assert proc.returncode == 3
        assert "returned" in proc.stdout and "finalization ran" in proc.stdout
