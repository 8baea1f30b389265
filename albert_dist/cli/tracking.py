"""The front end of `albert-dist tracking sync RUN_DIR` (the work: `albert_dist.tracking.sync`).

    albert-dist tracking sync runs/albert-tiny-20260101-120000 [--tracking-uri URI] [--timeout-s 600]

Exit codes: 0 everything arrived, 1 something is left or the server did not answer (rerun later), 2 not a run
directory or bad arguments.
"""
from __future__ import annotations

import argparse
import sys

from albert_dist.exit_codes import EXIT_CRASHED, EXIT_OK, error_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``albert-dist tracking sync RUN_DIR [--tracking-uri URI] [--timeout-s S]``."""
    sub = parser.add_subparsers(dest="subcommand", metavar="{sync}")
    p = sub.add_parser("sync", help="send a run directory's unsent metrics, params and uploads to MLflow")
    p.add_argument("run_dir")
    p.add_argument("--tracking-uri", default=None, help="default: the one recorded in RUN_DIR/mlflow_run.json")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long (default 600)")


def run(args: argparse.Namespace) -> int:
    """Sync `args.run_dir` (`albert_dist.tracking.sync.sync`); 0 done, 1 something left or no server.

    Raises:
        ValueError: not a run directory (exit 2).
    """
    from albert_dist.job.console import configure_logging
    from albert_dist.tracking.sync import sync

    configure_logging(replace=False)
    try:
        left = sync(args.run_dir, args.tracking_uri, args.timeout_s)
    except (ConnectionError, RuntimeError) as exc:  # the server, not the input: try again later
        print(error_line("albert-dist tracking sync", exc), file=sys.stderr)
        return EXIT_CRASHED
    return EXIT_CRASHED if any(left.values()) else EXIT_OK
