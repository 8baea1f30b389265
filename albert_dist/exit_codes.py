"""Exit codes of `albert-dist train`: the contract between a job and whatever requeues it; and the one line a
command prints for an input error.

`slurm/common.sh` mirrors these numbers (a requeue script tells "stopped, try again" from success and errors;
EXIT_DIVERGED is reported as "diverged" and not requeued, there and in `launch/pretrain_local.sh`).
The launch scripts (`launch/pretrain_local.sh`, `slurm/common.sh`) map what their launcher reports for a rank
killed by a signal (DeepSpeed's launch.py: 256 - N, e.g. 247 after a kill -9; srun: 128 + N) to EXIT_CRASHED,
naming the signal, and report an interrupt without a checkpoint at the stop as 128 + N (130 after Ctrl-C).
`launch/pretrain_local.sh` reports EXIT_OK only when the run's newest checkpoint is at max_steps (DeepSpeed's
runner exits 0 when launch.py dies of a signal), EXIT_PREEMPTED whenever the ranks wrote a stop checkpoint, and
EXIT_HUNG whenever the ranks' hang watchdog wrote its report during the run (the launcher's SIGKILL of the stopped
rank is then no crash; `albert_dist.job.watchdog`).
"""

EXIT_OK = 0
"""Trained to max_steps (or already there)."""
EXIT_CRASHED = 1
"""An unexpected error (the traceback is in the failing rank's log; the other ranks exit 1 too, with one line),
or, from the launch scripts, a rank killed by a signal."""
EXIT_CONFIG_ERROR = 2
"""Bad config or input files, found before any process group started; nothing ran."""
EXIT_SAVE_FAILED = 74
"""A checkpoint could not be written (disk full, another OS error; sysexits' EX_IOERR); the partial checkpoint
was removed and `latest` still names the previous one, so `--resume auto` after freeing space continues from
there. Not requeued automatically: the same disk would fail again."""
EXIT_PREEMPTED = 75
"""Stopped by SIGTERM/SIGUSR1/SIGINT after writing a checkpoint of the step it stopped at (sysexits'
EX_TEMPFAIL, "try again"), or by an object store that stayed unavailable for ``data.store_retry_s`` (the same
checkpoint when a training loader gave up); rerun with `--resume auto` to continue."""
EXIT_HUNG = 76
"""A rank stopped making progress for longer than ``engine.init_timeout_s`` (before the first step) or
``engine.step_timeout_s`` (after it): the watchdog named the ranks and hosts, wrote every live rank's stacks under
the run directory and ended the job. The newest checkpoint is intact: `--resume auto` continues (the sbatch
scripts requeue, bounded)."""
EXIT_DIVERGED = 77
"""Training diverged (a non-finite loss, a run of steps skipped for non-finite gradients, or a loss spike) and the
policy said stop, or its rollbacks ran out: `latest` names the newest healthy checkpoint and no final model of
diverged weights was written. Not requeued: the same data and settings would diverge again."""
EXIT_INPUT_VANISHED = 78
"""A corpus file (an object in a store, or a local shard) that the run planned with disappeared or changed while
training; one line names it (`InputVanished`). Not requeued: the input must be restored (then `--resume auto`
continues from the newest checkpoint, written at the stop when the source is an object store) or the run
re-planned (a new run directory)."""



class TryAgainLater(Exception):
    """A service the command needs (an object store) stayed unavailable for its retry budget: nothing is wrong with
    the input, so a command prints its one line and exits `EXIT_PREEMPTED` (EX_TEMPFAIL), never 2 or a traceback.
    `albert_dist.data.sources.store.StoreUnavailable` is one."""


class InputVanished(Exception):
    """A corpus file the job planned with (an object in a store, a local shard) is gone while it trains: a command
    prints its one line (the file, what the plan expected of it, how to go on) and exits `EXIT_INPUT_VANISHED`;
    a training job checkpoints the step it reached first where it can (`albert_dist.apps.pretrain.trainer`). Neither a
    ValueError (not a config error: the input was there when the job was checked) nor an OSError (a reader takes
    an OSError for a damaged piece and skips it: a vanished file must not be skipped silently)."""


def error_line(command: str, err: BaseException) -> str:
    """``"<command>: <reason>"``, the line a command prints before exiting with `EXIT_CONFIG_ERROR`.

    The reason is never empty: an exception without a message (some library errors have none) is named by its
    type, so the user always reads what went wrong; the message itself names the file or field (our errors do).
    """
    reason = str(err).strip() or f"{type(err).__name__} (raised without a message)"
    return f"{command}: {reason}"


__all__ = ["error_line", "TryAgainLater", "InputVanished",
           "EXIT_OK", "EXIT_CRASHED", "EXIT_CONFIG_ERROR", "EXIT_SAVE_FAILED", "EXIT_PREEMPTED",
           "EXIT_HUNG", "EXIT_DIVERGED", "EXIT_INPUT_VANISHED"]
