"""Exit codes of `albert-dist train`: the contract between a job and whatever requeues it.

`slurm/common.sh` mirrors these numbers (a requeue script tells "stopped, try again" from success and errors).
"""

EXIT_OK = 0
"""Trained to max_steps (or already there)."""
EXIT_CRASHED = 1
"""An unexpected error; the traceback is in the log."""
EXIT_CONFIG_ERROR = 2
"""Bad config or input files, found before any process group started; nothing ran."""
EXIT_SAVE_FAILED = 74
"""A checkpoint could not be written (disk full, another OS error; sysexits' EX_IOERR); the partial checkpoint
was removed and `latest` still names the previous one, so `--resume auto` after freeing space continues from
there. Not requeued automatically: the same disk would fail again."""
EXIT_PREEMPTED = 75
"""Stopped by SIGTERM/SIGUSR1 after writing a checkpoint (sysexits' EX_TEMPFAIL, "try again"); rerun with
`--resume auto` to continue."""

__all__ = ["EXIT_OK", "EXIT_CRASHED", "EXIT_CONFIG_ERROR", "EXIT_SAVE_FAILED", "EXIT_PREEMPTED"]
