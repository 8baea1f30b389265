"""The front end of `albert-dist goodput RUN_DIR [--json]` (the work: `albert_dist.tracking.goodput`).

    albert-dist goodput runs/albert-tiny-20260101-120000          # two lines: the share, badput by cause
    albert-dist goodput runs/albert-tiny-20260101-120000 --json   # restarts, recomputed_steps, wall_s,
                                                                  # productive_s, badput_s {cause: s}, attempts

Exit codes: 0, or 2 for a run directory that does not exist or holds no goodput.jsonl (one line).
"""
from __future__ import annotations

import argparse
import json

from albert_dist.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``RUN_DIR [--json]``."""
    parser.add_argument("run_dir", help="the run directory (its goodput.jsonl holds the events of every attempt)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    """Print the goodput of ``args.run_dir`` (`albert_dist.tracking.goodput.goodput`); 0.

    Raises:
        ValueError: no such directory, or no goodput.jsonl in it (exit 2).
    """
    from pathlib import Path

    from albert_dist.tracking.goodput import EVENTS_FILE, goodput

    report = goodput(args.run_dir)
    if not (Path(args.run_dir) / EVENTS_FILE).is_file():  # not "goodput 0.0% of 0.0 s", exit 0: a wrong path
        raise ValueError(f"{args.run_dir}: no {EVENTS_FILE} (not a run directory, or its job never started: rank 0 "
                         "and the launch scripts write it)")
    print(json.dumps(report.as_dict(), indent=1) if args.json else f"{args.run_dir}: {report.text()}")
    return EXIT_OK
