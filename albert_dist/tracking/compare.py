"""What differs between pretraining runs, how they ended, and their curves (`albert-dist compare`; its front
end is `albert_dist.cli.compare`).

    albert-dist compare RUN [RUN ...] [--output curves.png] [--metrics loss mlm_accuracy perf/mfu]
    albert-dist compare --experiment NAME [--output curves.png]

RUN is a run id, ``runs:/<id>`` or a run directory (its ``mlflow_run.json`` names the run and its store).
Prints one table, a column per run: ``run`` (name), ``run_id``, the params whose values differ, then per
metric ``<name>.final`` (value at the last step; `mlflow.search_runs`) and, where "best" means something
(`albert_dist.engine.metric_names.best_direction`: losses min, accuracies and throughput max),
``<name>.best``; the validation set's constants (size, unigram baseline) are one plain row each. System metrics and per-rank memory series are left out. The PNG has one panel per metric
(default: loss and MLM accuracy; a bare quantity such as ``loss`` draws ``train/loss`` as a line and
``val/loss`` as dashed markers at the validation steps), one colour per run, labelled by run name and its
differing params (``num_hidden_groups=2``); the MLM accuracy panel draws each run's unigram baseline dotted.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from albert_dist.engine import metric_names as names

log = logging.getLogger(__name__)

MISSING = "-"
#: Metrics left out of the table: MLflow's system metrics and the per-rank memory series.
_NOT_IN_TABLE = ("system/", names.MEM + "peak_gib_rank")
#: Params left out of the PNG's run labels.
_NOT_IN_LABELS = ("params.derived.", "params.run_dir", "params.checkpoint.dir", "params.tracking.")


UNIGRAM_ACCURACY = names.VAL + "unigram_mlm_accuracy"
_PARENT_TAG = "tags.mlflow.parentRunId"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return format(value, ".6g") if isinstance(value, float) else str(value)


def search(refs: Sequence[str], experiment: Optional[str]) -> Any:
    """`mlflow.search_runs` (pandas) for the given run ids, or every top-level run of ``experiment`` (oldest
    first; child runs, e.g. `albert-dist finetune`'s per-seed fine-tunes, are left out).

    Raises:
        ValueError: no such experiment, no runs, or an id the store does not have.
    """
    import mlflow

    if experiment:
        exp = mlflow.get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no experiment {experiment!r}")
        df = mlflow.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
        if _PARENT_TAG in df:  # child runs (one per `albert-dist finetune` seed) are summarised on their parent
            df = df[df[_PARENT_TAG].isna()].dropna(axis=1, how="all")  # and their metrics and params go too
        if df.empty:
            raise ValueError(f"experiment {experiment!r} has no runs")
        return df.reset_index(drop=True)
    quoted = ", ".join(f"'{r}'" for r in refs)
    df = mlflow.search_runs(filter_string=f"attributes.run_id IN ({quoted})", search_all_experiments=True)
    missing = [r for r in refs if r not in set(df["run_id"])]
    if missing:
        raise ValueError(f"runs not found in {mlflow.get_tracking_uri()}: {missing}")
    return df.set_index("run_id", drop=False).loc[list(refs)].reset_index(drop=True)


def differing_params(df: Any) -> list[str]:
    """The ``params.*`` columns whose value is not the same in every run (missing counts as a value)."""
    cols = [c for c in df.columns if c.startswith("params.")]
    return sorted(c for c in cols if df[c].fillna(MISSING).nunique() > 1)


def table_rows(df: Any, histories: dict[str, dict[str, list]]) -> list[list[str]]:
    """The comparison table as rows of strings (first column the row name); ``histories``: run id ->
    metric -> [(step, value)] for the metrics that have a best."""
    rows = [["run"] + [_fmt(v) for v in df.get("tags.mlflow.runName", [None] * len(df))],
            ["run_id"] + list(df["run_id"])]
    rows += [[c[len("params."):]] + [_fmt(v) for v in df[c]] for c in differing_params(df)]
    metrics = sorted(c[len("metrics."):] for c in df.columns if c.startswith("metrics."))
    for key in (k for k in metrics if not k.startswith(_NOT_IN_TABLE)):
        if key in names.VAL_ONCE:  # a constant of the run's validation set: no final or best
            rows.append([key] + [_fmt(v) for v in df[f"metrics.{key}"]])
            continue
        rows.append([f"{key}.final"] + [_fmt(v) for v in df[f"metrics.{key}"]])
        direction = names.best_direction(key)
        if direction:
            pick = max if direction == "max" else min
            best = [pick((v for _, v in histories[r].get(key, [])), default=None) for r in df["run_id"]]
            rows.append([f"{key}.best"] + [_fmt(v) for v in best])
    return rows


def format_table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def panel_series(metric: str) -> list[str]:
    """Metric names drawn in the panel of ``metric``: a bare quantity (``loss``) is its ``train/`` and ``val/``
    series, a full name (``perf/mfu``) itself."""
    return [metric] if "/" in metric else [names.TRAIN + metric, names.VAL + metric]


def run_labels(df: Any) -> list[str]:
    """Run name plus its differing config params by their last dotted part (``num_hidden_groups=2``), at most
    3; ``derived.*`` (counts, config hash: consequences of the config) only when no config param differs, output
    locations never (the name already says where the run is)."""
    differing = differing_params(df)
    params = ([c for c in differing if not c.startswith(_NOT_IN_LABELS)] or differing)[:3]
    labels = []
    for i in range(len(df)):
        name = df["tags.mlflow.runName"][i] if "tags.mlflow.runName" in df else None
        extra = ", ".join(f"{c.rsplit('.', 1)[-1]}={_fmt(df[c][i])}" for c in params)
        labels.append(f"{name or df['run_id'][i][:8]}" + (f" ({extra})" if extra else ""))
    return labels


def plot_curves(df: Any, histories: dict[str, dict[str, list]], metrics: Sequence[str], path: str) -> None:
    """PNG: one panel per metric, one colour per run; validation series dashed with a marker at every
    validation step (a single validation point stays visible). The MLM accuracy panel also draws each run's
    unigram baseline (``val/unigram_mlm_accuracy``) as a dotted line, so the learning above frequencies shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = run_labels(df)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), 5), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, run_id in enumerate(df["run_id"]):
            for key in panel_series(metric):
                hist = histories[run_id].get(key)
                if hist:
                    val = key.startswith(names.VAL)
                    ax.plot([s for s, _ in hist], [v for _, v in hist], "--o" if val else "-", color=f"C{i % 10}",
                            markersize=6, label=None if val else labels[i])
        title = metric if "/" in metric else f"{metric}: train/ line, val/ dashed with markers"
        baseline_col = f"metrics.{UNIGRAM_ACCURACY}"
        if metric in ("mlm_accuracy", names.VAL + "mlm_accuracy") and baseline_col in df:
            for i, value in enumerate(df[baseline_col]):
                if value == value:  # not NaN: the run logged its validation set's baseline
                    ax.axhline(value, linestyle=":", linewidth=1.5, color=f"C{i % 10}")
            title += "\n(dotted: unigram baseline of each run's validation set)"
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=f"C{i % 10}") for i in range(len(labels))]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), fontsize="small")
    fig.tight_layout(rect=(0, 0.06 + 0.04 * ((len(labels) + 1) // 2), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _resolve(refs: Sequence[str], uri: Optional[str]) -> tuple[list[str], str]:
    """Run ids and the tracking URI for run ids / ``runs:/`` / run directories."""
    from albert_dist.tracking.tracker import parse_run_ref, read_state, resolve_tracking_uri

    ids, recorded = [], None
    for ref in refs:
        if Path(ref).is_dir():
            state = read_state(ref)
            if not state.get("run_id"):
                raise ValueError(f"{ref}: no MLflow run recorded (run `albert-dist tracking sync {ref}` first?)")
            ids.append(state["run_id"])
            recorded = recorded or state.get("tracking_uri")
        else:
            ids.append(parse_run_ref(ref))
    return ids, resolve_tracking_uri(uri or recorded)


def compare(runs: Sequence[str], experiment: Optional[str], tracking_uri: Optional[str], metrics: Sequence[str],
            output: str) -> str:
    """Compare `runs` (run ids, ``runs:/`` URIs or run directories) or every run of `experiment` (module
    docstring): returns the table as text and writes the curves of `metrics` to the PNG `output`.

    Raises:
        ValueError: both or neither of `runs` and `experiment`; a run directory with no MLflow run recorded;
            `metrics` naming something these runs did not log; a local store that does not exist (MLflow
            would create an empty one); MLflow's own errors (unknown run or experiment) as a ValueError with its
            message.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    from albert_dist.tracking.tracker import require_existing_store

    if bool(runs) == bool(experiment):
        raise ValueError("give runs or --experiment NAME (not both)")
    try:
        ids, uri = _resolve(runs, tracking_uri)
        require_existing_store(uri, f"runs {', '.join(runs)}" if runs else f"experiment {experiment!r}")
        mlflow.set_tracking_uri(uri)
        df = search(ids, experiment)
        logged = sorted({c[len("metrics."):] for c in df.columns if c.startswith("metrics.")})
        known = sorted({*logged, *(m.split("/", 1)[1] for m in logged if m.startswith((names.TRAIN, names.VAL)))})
        unknown = [m for m in metrics if not any(k in logged for k in panel_series(m))]
        if unknown:
            raise ValueError(f"--metrics {unknown}: not logged by these runs; known: {', '.join(known)}")
        client = mlflow.MlflowClient()
        wanted = {k for k in logged if names.best_direction(k)} | {k for m in metrics for k in panel_series(m)}
        histories = {r: {k: sorted((m.step, m.value) for m in client.get_metric_history(r, k))
                         for k in wanted if k in logged} for r in df["run_id"]}
    except MlflowException as exc:  # an unknown run or experiment: the user's input, one line
        raise ValueError(str(exc)) from None
    plot_curves(df, histories, metrics, output)
    return format_table(table_rows(df, histories))
