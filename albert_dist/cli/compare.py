"""The front end of `albert-dist compare` (the work: `albert_dist.tracking.compare`).

    albert-dist compare RUN [RUN ...] [--output curves.png] [--metrics loss mlm_accuracy perf/mfu]
    albert-dist compare --experiment NAME [--output curves.png]

Exit codes: 0, or 2 for bad arguments, unknown runs or metrics (one line).
"""
from __future__ import annotations

import argparse

from albert_dist.engine.metric_names import DEFAULT_CURVES
from albert_dist.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Runs (or ``--experiment``), the store, the PNG and its panels."""
    parser.add_argument("runs", nargs="*", help="run ids, runs:/<id> URIs or run directories")
    parser.add_argument("--experiment", help="compare every run of this experiment instead")
    parser.add_argument("--tracking-uri", default=None,
                        help="default: a run directory's recorded store, $MLFLOW_TRACKING_URI, or <checkout>/mlruns.db")
    parser.add_argument("--output", default="compare.png", help="PNG of the curves (default: compare.png)")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_CURVES),
                        help="panels: quantities (loss: train/ + val/) or full names (perf/mfu)")


def run(args: argparse.Namespace) -> int:
    """Print the table and write the curves (`albert_dist.tracking.compare.compare`); 0.

    Raises:
        ValueError: both or neither of runs and ``--experiment``, unknown runs or metrics (exit 2).
    """
    from albert_dist.tracking.compare import compare

    print(compare(args.runs, args.experiment, args.tracking_uri, args.metrics, args.output))
    print(f"\ncurves of {', '.join(args.metrics)} written to {args.output}")
    return EXIT_OK
