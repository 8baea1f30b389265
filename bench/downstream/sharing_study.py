"""The sharing study: the ALBERT paper's Table 4 (Lan et al. 2020, section 4.5) at a budget 2 CPU cores run.

One pretraining run per inner sharing mode (``model.sharing`` = none / ffn / attention / all), at equal model
width, steps, tokens, data order and seed, with ONE group over all layers (``num_hidden_groups=1``, as the paper),
so ``none`` holds L x the encoder block of ``all``; then every run is fine-tuned and scored on SST-2 and STS-B
(``albert-dist finetune``, several seeds) and one table + one plot (score against parameters) are written.

    python bench/downstream/sharing_study.py pretrain   # the 4 pretraining runs (deepspeed launcher, --ranks)
    python bench/downstream/sharing_study.py finetune   # albert-dist finetune on each run (child MLflow runs)
    python bench/downstream/sharing_study.py report     # table (markdown) + <--out>/sharing_study.{json,png}
    python bench/downstream/sharing_study.py all        # the three in order
    python bench/downstream/sharing_study.py check      # each cell's run has the mode and sizes it was asked for

Everything is written under ``--out``; the committed figures are refreshed only when asked
(``report --results bench/results``).

The sizes are flags (``--layers --hidden --embedding --intermediate --heads --steps``), so a cluster runs the
paper's (``--layers 12 --hidden 768 --embedding 128 --intermediate 3072 --heads 12``, its corpus and steps);
``slurm/sharing_study.sbatch`` runs one cell per array task. Every run logs to the MLflow experiment
``--experiment`` (one run per cell, its fine-tunes as child runs).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("none", "ffn", "attention", "all")
#: The corpus and recipe every cell shares: the README's main job on WikiText-2's whole train split (bundled).
RECIPE = ROOT / "configs" / "pretrain" / "albert-tiny-wikitext2.yaml"
sys.path.insert(0, str(ROOT / "bench"))
from _common import checkout_relative, write_block  # noqa: E402


def cell_overrides(args: argparse.Namespace, mode: str) -> list[str]:
    """Trainer overrides of one cell: the model's sizes and sharing, steps, the MLflow experiment."""
    return [f"model.num_hidden_layers={args.layers}", "model.num_hidden_groups=1", "model.inner_group_num=1",
            f"model.sharing={mode}", f"model.hidden_size={args.hidden}", f"model.embedding_size={args.embedding}",
            f"model.intermediate_size={args.intermediate}", f"model.num_attention_heads={args.heads}",
            f"max_steps={args.steps}", f"tracking.experiment_name={args.experiment}", *args.overrides]


def run_dir(args: argparse.Namespace, mode: str) -> Path:
    return Path(args.out) / mode


def pretrain(args: argparse.Namespace) -> None:
    """Each cell's pretraining through the README's launch script (deepspeed launcher, ``--ranks`` ranks);
    a cell whose run directory already holds a final model is skipped (re-running the script resumes the study)."""
    for mode in args.modes:
        out = run_dir(args, mode)
        if (out / "final_model").exists():
            print(f"[sharing] {mode}: {out}/final_model exists, skipped", flush=True)
            check_cell(args, mode)
            continue
        t0 = time.time()
        cmd = ["bash", str(ROOT / "launch" / "pretrain_local.sh"), str(args.ranks), str(args.recipe),
               *cell_overrides(args, mode)]
        print(f"[sharing] {mode}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "RUN_DIR": str(out)})
        (out / "study_wall_s.json").write_text(json.dumps({"pretrain_wall_s": round(time.time() - t0, 1)}) + "\n")
        check_cell(args, mode)


class CellMismatch(ValueError):
    """A cell's run is not the model it was asked for (the message names the run directory and each field)."""


def check_cell(args: argparse.Namespace, mode: str) -> None:
    """The cell's run trained what the cell asked for: its resolved config (``<run dir>/config.yaml``) is unchanged
    by the cell's overrides (`cell_overrides`, applied through the config's own override path), so a job that
    trained another model (a dropped or misparsed flag: the recipe's ``sharing: all`` under the name ``ffn``)
    fails here instead of entering the table under the wrong name. Records the check in ``study_cell.json``.

    Raises:
        CellMismatch: no config.yaml in the run directory, or a field that differs, naming it, what the run has
            and what the cell asked for.
    """
    from albert_dist.config import apply_overrides, load_config, to_container

    out = run_dir(args, mode)
    if not (out / "config.yaml").is_file():
        raise CellMismatch(f"{out}: no config.yaml, the cell '{mode}' did not train there")
    asked = cell_overrides(args, mode)
    have = to_container(load_config(out / "config.yaml"))
    want = to_container(apply_overrides(load_config(out / "config.yaml"), asked))
    diffs = [f"{key} is {a!r}, the cell asked for {b!r}" for key, a, b in _differences(have, want)]
    if diffs:
        raise CellMismatch(f"{out}: the run is not the cell '{mode}': " + "; ".join(diffs))
    (out / "study_cell.json").write_text(json.dumps({"sharing": mode, "overrides": asked, "checked": True}) + "\n")


def _differences(a: object, b: object, key: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, value in a, value in b) wherever two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _differences(a.get(k), b.get(k), f"{key}.{k}" if key else str(k))]
    return [] if a == b else [(key, a, b)]


def finetune(args: argparse.Namespace) -> None:
    """`albert-dist finetune` on each cell's final model: ``--tasks`` x ``--seeds`` (child runs of the cell's MLflow
    run; scores in the cell's downstream.json), with the extra fine-tuning flags ``--finetune-args``."""
    for mode in args.modes:
        cmd = [sys.executable, "-m", "albert_dist.cli", "finetune", str(run_dir(args, mode)), "--task", *args.tasks,
               "--data-dir", args.glue_dir, "--seeds", *map(str, args.seeds), *shlex.split(args.finetune_args)]
        print(f"[sharing] {mode}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "TQDM_DISABLE": "1"})


def cell_figures(args: argparse.Namespace, mode: str) -> dict:
    """One cell's row: parameters, pretraining wall time, last validation MLM accuracy, downstream scores."""
    import statistics

    from albert_dist.config import load_config
    from albert_dist.model.sharing import parameter_count

    out = run_dir(args, mode)
    cfg = load_config(out / "config.yaml")
    val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in val if "val/mlm_accuracy" in r]
    row = {"sharing": mode, "parameters": parameter_count(cfg.model), "steps": cfg.max_steps,
           "val_mlm_accuracy": val[-1]["val/mlm_accuracy"] if val else None}
    wall = out / "study_wall_s.json"
    row["pretrain_wall_s"] = json.loads(wall.read_text())["pretrain_wall_s"] if wall.exists() else None
    results = json.loads((out / "downstream.json").read_text())["results"] if (out / "downstream.json").exists() else []
    for task in args.tasks:
        mine = [r for r in results if r["task"] == task and r["init"] == "pretrained"]
        if not mine:
            continue
        r = mine[-1]
        scores = [float(s[r["primary_metric"]]) for s in r["seeds"].values()]
        row[task] = {"metric": r["primary_metric"], "median": statistics.median(scores), "min": min(scores),
                     "max": max(scores), "seeds": len(scores)}
    return row


def report(args: argparse.Namespace) -> None:
    """The study's table (markdown, stdout) and sharing_study.{json,png} (score against parameters) in ``--results``
    (default ``--out``: the committed bench/results figures change only when asked)."""
    rows = [cell_figures(args, mode) for mode in args.modes if (run_dir(args, mode) / "config.yaml").exists()]
    head = ["sharing", "parameters", "pretrain wall (min)", "val MLM acc", *[f"{t} dev" for t in args.tasks]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["sharing"], f"{r['parameters'] / 1e6:.2f}M",
                 "-" if r["pretrain_wall_s"] is None else f"{r['pretrain_wall_s'] / 60:.1f}",
                 "-" if r["val_mlm_accuracy"] is None else f"{r['val_mlm_accuracy']:.3f}"]
        for t in args.tasks:
            d = r.get(t)
            cells.append("-" if d is None else f"{d['median']:.3f} [{d['min']:.3f}-{d['max']:.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.doc:
        write_block(args.doc, "sharing figures", "\n".join(lines))
    results = Path(args.results or args.out)
    results.mkdir(parents=True, exist_ok=True)
    argv = [checkout_relative(a) for a in sys.argv[1:]]
    (results / "sharing_study.json").write_text(json.dumps({"cells": rows, "argv": argv}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.tasks), figsize=(5 * len(args.tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], args.tasks):
        for r in rows:
            d = r.get(task)
            if d is None:
                continue
            x = r["parameters"] / 1e6
            ax.errorbar([x], [d["median"]], yerr=[[d["median"] - d["min"]], [d["max"] - d["median"]]], fmt="o",
                        capsize=4)
            ax.annotate(r["sharing"], (x, d["median"]), textcoords="offset points", xytext=(6, 4))
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel(f"{task} dev ({d['metric'] if rows and rows[-1].get(task) else 'score'}), median and min-max")
        ax.set_title(f"{task}: sharing modes at equal steps")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(results / "sharing_study.png", dpi=110)
    print(f"wrote {results / 'sharing_study.json'} and {results / 'sharing_study.png'}")


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); 0, 1 when `check_cell` finds a cell that is not what it was asked, 2
    for flags that do not parse (argparse's usage line, or the one line for a ``--args`` string)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=("pretrain", "finetune", "report", "all", "overrides", "check"),
                   help="overrides: print one cell's trainer overrides, one per line (slurm/sharing_study.sbatch); "
                        "check: each cell's run has what the cell asked for (also after each pretrain)")
    p.add_argument("--args", default="", metavar="STRING",
                   help="more of these flags (not --modes or --out) in one string, split as a POSIX shell would "
                        "(shlex: quotes keep a value's words together; nothing is expanded or run): "
                        "slurm/sharing_study.sbatch passes ALBERT_STUDY_ARGS here")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--out", default=str(ROOT / "runs" / "sharing-study"), help="one run directory per mode below it")
    p.add_argument("--recipe", default=str(RECIPE))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--embedding", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--experiment", default="sharing-study")
    p.add_argument("--doc", default=None, help="report: write the table into this markdown file between the markers")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="report: write sharing_study.{json,png} here (default --out; bench/results for the committed "
                        "figures)")
    p.add_argument("--glue-dir", default=str(ROOT.parent / "shared" / "corpora"), help="GLUE task folders")
    p.add_argument("--tasks", nargs="+", default=["sst2", "stsb"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--finetune-args", default="--max-train-samples 2000 --learning-rate 1e-3 --batch-size 32 "
                   "--max-seq-length 64", help="more `albert-dist finetune` flags, one string (default: docs/sharing.md's)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="more trainer overrides for every cell")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_intermixed_args(argv)  # overrides may come after the options
    if args.args:
        try:
            more = shlex.split(args.args)
        except ValueError as err:  # an unclosed quote
            p.error(f"--args {args.args!r}: {err}")
        if any(w.split("=")[0] in ("--modes", "--out", "--args") for w in more):  # the caller's: a job's own cell
            p.error(f"--args {args.args!r}: --modes, --out and --args are the caller's, not the string's")
        args = p.parse_intermixed_args([*argv, *more])
    if args.phase == "overrides":
        if len(args.modes) != 1:
            p.error("overrides: give exactly one --modes MODE")
        print("\n".join(cell_overrides(args, args.modes[0])))
        return 0
    try:
        if args.phase == "check":
            for mode in args.modes:
                check_cell(args, mode)
                print(f"[sharing] {mode}: {run_dir(args, mode)} has what the cell asked for", flush=True)
            return 0
        return _run_phases(args)
    except CellMismatch as err:
        print(f"sharing_study: {err}", file=sys.stderr)
        return 1


def _run_phases(args: argparse.Namespace) -> int:
    if args.phase in ("pretrain", "all"):
        pretrain(args)
    if args.phase in ("finetune", "all"):
        finetune(args)
    if args.phase in ("report", "all"):
        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
