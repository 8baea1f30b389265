"""The figures a fresh `make pretrain` should show, read from a reference run's metrics (not typed by hand).

    python bench/convergence/quickstart_figures.py [RUN_DIR_OR_METRICS_JSONL] [--readme README.md] [--doc docs/convergence-quickstart.md]

Default input: ``docs/quickstart-reference/metrics.jsonl`` (the reference run of
configs/pretrain/albert-tiny-wikitext.yaml, copied from its run directory with the command that made it in
``docs/quickstart-reference/README.md``). Prints a markdown block: training wall time (sum of the logged
``interval_s``, evaluation and checkpoints excluded) and wall time of the whole run when the run directory
holds ``wall_s``, the range of its log intervals' samples/s (the load on shared cores moves it), first/last train loss, and the last validation record: MLM loss and accuracy, SOP accuracy,
and the unigram baseline of the same validation set (``val_unigram_mlm_accuracy`` or
``val_mlm_accuracy_over_unigram``, logged by the trainer; else computed here the way bench/convergence/convergence.py
computes it: training-corpus token frequencies over the masked tokens of the trainer's validation batches).
With ``--readme``/``--doc`` the block replaces what is between ``<!-- quickstart figures start -->`` and
``<!-- quickstart figures end -->`` in those files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "bench"))
import convergence as conv  # noqa: E402
from _common import write_block  # noqa: E402
DEFAULT = ROOT / "docs" / "quickstart-reference" / "metrics.jsonl"


def read(path: Path) -> tuple[list[dict], list[dict], Optional[dict]]:
    """(train records, validation records, run facts) of a metrics.jsonl (or a run directory holding one)."""
    if path.is_dir():
        path = path / "metrics.jsonl"
    train, val, baseline = [], [], {}
    for line in path.read_text().splitlines():
        rec = conv.flat_record(json.loads(line))
        if "val_unigram_mlm_accuracy" in rec:  # logged once by the trainer with the set's size
            baseline = rec
        if "val_mlm_accuracy" in rec:
            val.append(rec)
        elif "loss" in rec:
            train.append(rec)
    facts_path = path.parent / "run.json"
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    facts.update({k: v for k, v in baseline.items() if k != "step"})
    return train, val, facts


def unigram_of_val(config_path: Path) -> dict[str, float]:
    """Unigram baseline on the trainer's validation batches of the run's config (rank 0 of the run's world)."""
    import torch

    from albert_dist.config import load_config
    from albert_dist.data.loader import build_eval_loader
    from albert_dist.data.tokenizer import FIRST_NORMAL_ID

    cfg = load_config(config_path)
    train = conv.grouped_blocks(conv.train_files(cfg), cfg.data.tokenizer_path, 1).flatten()
    counts = torch.bincount(train, minlength=cfg.model.vocab_size).double()
    counts[:FIRST_NORMAL_ID] = 0
    logp = torch.log((counts + 1) / (counts + 1).sum())
    labels = torch.cat([b["mlm_labels"][b["mlm_labels"] != -100]
                        for b in build_eval_loader(cfg.data, cfg.engine.train_micro_batch_size_per_gpu, 0, 1)])
    return {"accuracy": float((labels == counts.argmax()).double().mean()), "loss": float(-logp[labels].mean())}


def figures(path: Path) -> dict[str, Any]:
    train, val, facts = read(path)
    if not val:
        raise ValueError(f"{path}: no validation records")
    last = val[-1]
    out: dict[str, Any] = {
        "steps": last["step"], "train_s": max(conv.read_metrics(str(path if path.is_dir() else path.parent),
                                                                   facts.get("global_batch", 16))[0].values()),
        "first_loss": train[0]["loss"], "first_loss_step": train[0]["step"], "last_loss": train[-1]["loss"],
        "val_mlm_loss": last["val_mlm_loss"], "val_mlm_accuracy": last["val_mlm_accuracy"],
        "val_sop_accuracy": last["val_sop_accuracy"], "curve": [(r["step"], r["val_mlm_accuracy"]) for r in val],
        "global_batch": facts.get("global_batch", 16),
    }
    rates = [r["samples_per_s"] for r in train if "samples_per_s" in r]
    if rates:  # per log interval: on shared cores the load moves it several-fold within one run
        out["samples_per_s"] = [min(rates), max(rates)]
    out.update({k: facts[k] for k in ("wall_s", "command", "machine", "val_masked_tokens", "val_sop_pairs")
                if k in facts})
    if "val_unigram_mlm_accuracy" in facts:
        out["unigram_accuracy"] = facts["val_unigram_mlm_accuracy"]
    elif "val_mlm_accuracy_over_unigram" in last:
        out["unigram_accuracy"] = last["val_mlm_accuracy"] / last["val_mlm_accuracy_over_unigram"]
    else:
        config = (path if path.is_dir() else path.parent) / "config.yaml"
        if config.exists():
            out["unigram_accuracy"] = unigram_of_val(config)["accuracy"]
    return out


def render(fig: dict[str, Any]) -> str:
    uni = fig.get("unigram_accuracy")
    lines = [f"A fresh `make pretrain` (reference run: {fig.get('machine', 'this repository, 2 CPU ranks')}) trains "
             f"{fig['steps']} steps in {fig['train_s'] / 60:.1f} min of training time"
             + (f" ({fig['wall_s'] / 60:.1f} min wall, start-up and evaluation included)" if "wall_s" in fig else "")
             + (f" at {fig['samples_per_s'][0]:.0f}-{fig['samples_per_s'][1]:.0f} samples/s over its log intervals as "
                f"the load moved (training time elsewhere: {fig['steps']} x {fig['global_batch']} / the samples/s of "
                f"`perf/samples_per_s`)" if "samples_per_s" in fig else "")
             + f"; the loss falls from {fig['first_loss']:.2f} (step {fig['first_loss_step']}) to {fig['last_loss']:.2f}.",
             "",
             "| at step %d | value |" % fig["steps"], "|---|---|",
             f"| validation MLM loss | {fig['val_mlm_loss']:.3f} |",
             f"| validation MLM accuracy | {fig['val_mlm_accuracy']:.3f} |"]
    if uni:
        lines.append(f"| unigram baseline (token frequencies) | {uni:.3f} (model: {fig['val_mlm_accuracy'] / uni:.2f}×) |")
    lines.append(f"| validation SOP accuracy (chance 0.5) | {fig['val_sop_accuracy']:.3f} |")
    if "val_masked_tokens" in fig:
        lines.append(f"| fixed validation set | {fig['val_masked_tokens']:.0f} masked tokens, "
                     f"{fig.get('val_sop_pairs', 0):.0f} SOP pairs |")
    lines += ["", "Validation MLM accuracy by step: " +
              ", ".join(f"{s}: {a:.3f}" for s, a in fig["curve"]) + ".",
              "(`python bench/convergence/quickstart_figures.py` prints this block from the reference run; "
              "docs/convergence-quickstart.md has how it was chosen.)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", default=str(DEFAULT))
    p.add_argument("--readme", default=None, help="replace the quickstart section of this file")
    p.add_argument("--doc", default=None, help="and of this one")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    fig = figures(Path(args.path))
    block = render(fig)
    print(json.dumps(fig, indent=1) if args.json else block)
    for target in (args.readme, args.doc):
        if target:
            write_block(target, "quickstart figures", block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
