"""`albert-dist compare`: what differs between pretraining runs, how they ended, and their curves.

    albert-dist compare RUN_ID [RUN_ID ...] [--output curves.png]
    albert-dist compare --experiment NAME [--output curves.png]

Prints one table, a column per run: ``run`` (name) and ``run_id``, then every param whose value is not the
same in all runs (a param missing from a run shows ``-``), then for every metric ``<key>.final`` (value at
the last logged step) and ``<key>.best`` (the minimum; the maximum for accuracies, throughputs, MFU). Writes a PNG
with one panel per plotted metric (default: ``loss`` and ``mlm_accuracy``, plus their ``val_`` versions
when logged), one line per run. The tracking URI is ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI``, else
the trainer's default local store.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)

DEFAULT_CURVES = ("loss", "mlm_accuracy")
MISSING = "-"


def higher_is_better(key: str) -> bool:
    """Accuracies, throughputs (``*_per_s``) and MFU are maximised; everything else (losses, memory, times)
    minimised."""
    key = key.lower()
    return "acc" in key or key.endswith("_per_s") or "mfu" in key


def _fmt(value: Optional[float]) -> str:
    return MISSING if value is None else format(value, ".6g")


def collect(client: Any, run_ids: Sequence[str]) -> tuple[list[Any], dict[str, dict[str, list]]]:
    """Runs and, per run id, the full history ``{key: [(step, value), ...]}`` of every metric."""
    runs = [client.get_run(r) for r in run_ids]
    histories = {}
    for run in runs:
        histories[run.info.run_id] = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            for key in sorted(run.data.metrics)
        }
    return runs, histories


def table_rows(runs: list[Any], histories: dict[str, dict[str, list]]) -> list[list[str]]:
    """The comparison table as rows of strings (first column the row name)."""
    rows = [["run"] + [r.info.run_name or MISSING for r in runs], ["run_id"] + [r.info.run_id for r in runs]]
    keys = sorted({k for r in runs for k in r.data.params})
    for key in keys:
        values = [r.data.params.get(key, MISSING) for r in runs]
        if len(set(values)) > 1:
            rows.append([key] + values)
    metric_keys = sorted({k for h in histories.values() for k in h})
    for key in metric_keys:
        final, best = [], []
        for r in runs:
            hist = histories[r.info.run_id].get(key, [])
            final.append(_fmt(hist[-1][1] if hist else None))
            values = [v for _, v in hist]
            best.append(_fmt((max if higher_is_better(key) else min)(values) if values else None))
        rows.append([f"{key}.final"] + final)
        rows.append([f"{key}.best"] + best)
    return rows


def format_table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def plot_curves(runs: list[Any], histories: dict[str, dict[str, list]], keys: Sequence[str], path: str) -> list[str]:
    """PNG with one panel per key that any run logged (``val_<key>`` dashed in the same panel); returns the
    keys plotted.

    Raises:
        ValueError: none of ``keys`` was logged by any run.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(k in h or f"val_{k}" in h for h in histories.values())]
    if not present:
        raise ValueError(f"none of the metrics {list(keys)} was logged by runs {[r.info.run_id for r in runs]}")
    fig, axes = plt.subplots(1, len(present), figsize=(6 * len(present), 4), squeeze=False)
    for ax, key in zip(axes[0], present):
        for i, run in enumerate(runs):
            label = f"{run.info.run_name or run.info.run_id[:8]}"
            color = f"C{i % 10}"
            for name, style in ((key, "-"), (f"val_{key}", "--")):
                hist = histories[run.info.run_id].get(name)
                if hist:
                    ax.plot([s for s, _ in hist], [v for _, v in hist], style, color=color,
                            label=label if name == key else f"{label} (val)")
        ax.set_xlabel("optimizer step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return present


def cli(argv: Sequence[str]) -> int:
    """Entry point of `albert-dist compare`; returns 0, or 2 for bad arguments / unknown runs. Never exits."""
    parser = argparse.ArgumentParser(prog="albert-dist compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_ids", nargs="*", help="MLflow run ids (or runs:/<id> URIs)")
    parser.add_argument("--experiment", help="compare every run of this experiment instead")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlruns.db")
    parser.add_argument("--output", default="compare.png", help="PNG of the curves (default: compare.png)")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_CURVES), help="metrics to plot")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse exits on --help / errors; the dispatcher owns the exit code
        return int(exc.code or 0)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from albert_dist.tracking.config import TrackingConfig
    from albert_dist.tracking.tracker import parse_run_ref, resolve_tracking_uri

    if bool(args.run_ids) == bool(args.experiment):
        print("albert-dist compare: give run ids or --experiment NAME (not both)", file=sys.stderr)
        return 2
    client = MlflowClient(resolve_tracking_uri(TrackingConfig(tracking_uri=args.tracking_uri)))
    try:
        if args.experiment:
            exp = client.get_experiment_by_name(args.experiment)
            if exp is None:
                print(f"albert-dist compare: no experiment {args.experiment!r}", file=sys.stderr)
                return 2
            run_ids = [r.info.run_id for r in client.search_runs([exp.experiment_id], order_by=["start_time ASC"])]
            if not run_ids:
                print(f"albert-dist compare: experiment {args.experiment!r} has no runs", file=sys.stderr)
                return 2
        else:
            run_ids = [parse_run_ref(r) for r in args.run_ids]
        runs, histories = collect(client, run_ids)
    except (ValueError, MlflowException) as exc:
        print(f"albert-dist compare: {exc}", file=sys.stderr)
        return 2
    print(format_table(table_rows(runs, histories)))
    try:
        plotted = plot_curves(runs, histories, args.metrics, args.output)
    except ValueError as exc:
        print(f"albert-dist compare: {exc}", file=sys.stderr)
        return 2
    print(f"\ncurves of {', '.join(plotted)} written to {args.output}")
    return 0
