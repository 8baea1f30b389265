"""What pretraining buys downstream: a run's checkpoint, the same model from random init, and the transformers
run_mlm peer pretrained at the same budget, each fine-tuned with `albert-dist finetune` on the same tasks, seeds
and hyper-parameters; one table of dev scores (median, min-max over the seeds).

    python bench/downstream/peer.py --recipe configs/pretrain/albert-tiny-wikitext2.yaml --ranks 2 --out runs/peer
    python bench/downstream/what_pretraining_buys.py --run runs/<quickstart run> --peer runs/peer \
        --glue-dir ../shared/corpora -- --max-train-samples 8000 --learning-rate 1e-3

The run's fine-tunes are child runs of its MLflow run (scores on it as ``downstream/<task>/<metric>``); the random
init and the peer log standalone runs. Results: ``<out>/<model>/downstream.json`` per model (the run's in its own
directory), the table on stdout and in ``<--results>/what_pretraining_buys.json`` (``-<block>.json`` for another
``--block``; ``--results`` defaults to ``--out``, bench/results for the committed figures); ``--doc FILE`` writes
the table between the ``downstream figures`` markers of FILE (`_common.write_block`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from _common import checkout_relative, write_block  # noqa: E402


def finetune(source: str, output: str | None, tasks: list[str], glue_dir: str, seeds: list[int],
             extra: list[str]) -> None:
    """One `albert-dist finetune` call (a child process, as a user runs it); raises CalledProcessError."""
    cmd = [sys.executable, "-m", "albert_dist.cli", "finetune", source, "--task", *tasks, "--data-dir", glue_dir,
           "--seeds", *map(str, seeds), *extra]
    if output:
        cmd += ["--output", output]
    print("[downstream]", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "TQDM_DISABLE": "1"})


def latest(path: Path, task: str, init: str) -> dict:
    """The newest result of ``task`` at ``init`` in a downstream.json."""
    results = [r for r in json.loads(path.read_text())["results"] if r["task"] == task and r["init"] == init]
    if not results:
        raise SystemExit(f"{path}: no {init} result for {task}")
    return results[-1]


def seed_scores(result: dict) -> dict[str, list[float]]:
    """metric -> the seeds' scores (train_* bookkeeping left out)."""
    out: dict[str, list[float]] = {}
    for scores in result["seeds"].values():
        for k, v in scores.items():
            if not k.startswith("train_"):
                out.setdefault(k, []).append(float(v))
    return out


def table(rows: dict[str, dict[str, dict]], tasks: list[str]) -> str:
    """Markdown: one row per model, a column per task's primary metric (median [min-max])."""
    head = ["model", *[f"{t} {next(iter(rows.values()))[t]['primary_metric']}" for t in tasks]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, per_task in rows.items():
        cells = []
        for t in tasks:
            s = seed_scores(per_task[t])[per_task[t]["primary_metric"]]
            cells.append(f"{statistics.median(s):.3f} [{min(s):.3f}-{max(s):.3f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="our pretraining run directory")
    p.add_argument("--peer", default=None, help="the peer's transformers directory (bench/downstream/peer.py)")
    p.add_argument("--glue-dir", required=True, help="directory holding the GLUE task folders")
    p.add_argument("--tasks", nargs="+", default=["sst2", "stsb"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--out", default=str(ROOT / "runs" / "downstream"), help="downstream.json of random/peer")
    p.add_argument("--report-only", action="store_true", help="only read the downstream.json files")
    p.add_argument("--doc", default=None, help="write the table into this markdown file between the markers")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="write what_pretraining_buys[-<block>].json here (default --out; bench/results for the "
                        "committed figures)")
    p.add_argument("--block", default="downstream figures", help="the markers' name (<!-- NAME start/end -->)")
    p.add_argument("extra", nargs="*", help="more `albert-dist finetune` flags (after --)")
    args = p.parse_args(argv)
    out = Path(args.out)
    models = {"ours (pretrained)": (args.run, None, "pretrained", []),
              "ours (random init)": (args.run, str(out / "random"), "random", ["--init", "random"])}
    if args.peer:
        models["run_mlm peer (pretrained)"] = (args.peer, str(out / "peer"), "pretrained", [])
    if not args.report_only:
        for source, output, _, flags in models.values():
            finetune(source, output, args.tasks, args.glue_dir, args.seeds, [*flags, *args.extra])
    rows = {}
    for name, (source, output, init, _) in models.items():
        path = Path(output or source) / "downstream.json"
        rows[name] = {t: latest(path, t, init) for t in args.tasks}
    text = table(rows, args.tasks)
    first = next(iter(rows.values()))[args.tasks[0]]
    hp = first["finetune"]
    text += (f"\n\n{len(args.seeds)} seeds each; {first['train_examples']} training examples of "
             f"{args.tasks[0]}; lr {hp['learning_rate']:g}, {hp['num_train_epochs']:g} epochs, batch "
             f"{hp['per_device_train_batch_size']}, max length {hp['max_seq_length']}.")
    print(text)
    results = Path(args.results or args.out)
    results.mkdir(parents=True, exist_ok=True)
    # one record per table: the default block's, else one named after the block
    name = "what_pretraining_buys" + ("" if args.block == "downstream figures" else "-" + args.block.replace(" ", "-"))
    (results / f"{name}.json").write_text(json.dumps(
        {name: {t: {"primary_metric": r["primary_metric"], "seeds": r["seeds"], "finetune": r["finetune"],
                    "train_examples": r["train_examples"], "model": checkout_relative(r["model"])}
             for t, r in per.items()}
         for name, per in rows.items()}, indent=1) + "\n")
    if args.doc:
        write_block(args.doc, args.block, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
