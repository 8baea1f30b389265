"""Objective and recipe ablations on the bundled corpus, scored like bench/convergence/convergence.py.

Every cell is one run of the real trainer (one rank, global batch 16, seq 128, AdamW, linear warmup/decay,
``BASE`` overrides on the quickstart recipe) for ``--steps`` (1,000) optimiser steps with a checkpoint every
``--every`` (100) steps, each checkpoint scored on bench/convergence/convergence.py's held-out set through the HF export;
the 300- and 1,000-step figures come from the same 1,000-step run (the 300-step point sees the 1,000-step
learning-rate schedule). ``peer`` is transformers' run_mlm recipe (`convergence.train_peer`). Results are one
JSON file per (cell, seed) in ``--out``; a cell already there is not rerun, so the grid can be extended.

    python bench/convergence/ablations.py run peer shipped sop0 --seeds 1 2 --jobs 2 [--out runs/ablations]
    python bench/convergence/ablations.py table [--out runs/ablations]        # the markdown table of docs/convergence-ablations.md
    python bench/convergence/ablations.py list                                # the cells and their overrides

Not a suite benchmark (it has no ``run``): a full grid is hours of CPU.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import convergence as conv  # noqa: E402

log = logging.getLogger("bench.ablations")

#: Overrides of every cell: 1,000 steps as the issue's measurement (warmup 10%), ALBERT's masking and SOP
#: weight 1 from step 0 (the quickstart recipe before issue 11; cells change one thing each).
BASE = ("optimizer.warmup_steps=100", "data.max_ngram=3", "data.whole_word_masking=true", "data.short_seq_prob=0.1",
        *conv.MASK15, "objective.sop_weight=1.0", "objective.sop_start_step=0", "objective.sop_ramp_steps=0")
#: Session 2's quickstart recipe on BASE: single pieces, no short sequences, SOP from step 300.
_SHIPPED = ("data.max_ngram=1", "data.whole_word_masking=false", "data.short_seq_prob=0.0",
            "objective.sop_start_step=300", "objective.sop_ramp_steps=200")
_PIECES_FULL = _SHIPPED[:3]
#: cell -> (overrides on BASE, what it tests). "peer" is not a trainer run.
CELLS: dict[str, tuple[tuple[str, ...], str]] = {
    "peer": ((), "transformers AlbertForPreTraining, run_mlm grouping + DataCollatorForLanguageModeling, MLM only"),
    "sop1": (("objective.sop_weight=1.0", "objective.sop_start_step=0", "objective.sop_ramp_steps=0"),
             "ALBERT's recipe: n-gram whole-word masking, SOP weight 1 from step 0"),
    "sop0": (("objective.sop_weight=0.0",), "n-gram whole-word masking, no SOP loss"),
    "sop0.1": (("objective.sop_weight=0.1", "objective.sop_start_step=0", "objective.sop_ramp_steps=0"),
               "SOP weight 0.1 from step 0"),
    "sop_ramp": (("objective.sop_weight=1.0", "objective.sop_start_step=300", "objective.sop_ramp_steps=200"),
                 "SOP weight 0 until step 300, linear ramp to 1 by step 500"),
    "shipped": (_SHIPPED,
                "single pieces, no short sequences, SOP from step 300 (the quickstart recipe of session 2)"),
    "noclip": (("objective.sop_weight=0.0", "engine.gradient_clipping=0.0"), "sop0 without gradient clipping"),
    "ngram1": (("objective.sop_weight=0.0", "data.max_ngram=1"), "sop0, single whole words (no n-grams)"),
    "piece": (("objective.sop_weight=0.0", "data.whole_word_masking=false"), "sop0, n-grams of pieces"),
    "matched": (("objective.sop_weight=0.0", "data.max_ngram=1", "data.whole_word_masking=false"),
                "sop0, single-piece masking: the peer's objective on ALBERT's examples"),
    "matched_ssp0": (("objective.sop_weight=0.0", "data.max_ngram=1", "data.whole_word_masking=false",
                      "data.short_seq_prob=0.0"),
                     "matched without short sequences: the peer's objective and full-length examples, as the peer"),
    "shipped_lr5e-3": ((*_SHIPPED, "optimizer.lr=0.005"),
                       "shipped, lr 5e-3"),
    "shipped_mask30": ((*_SHIPPED, *conv.MASK30),
                       "shipped with 30% masking (ModernBERT)"),
    "shipped_mask30_sop1": ((*_PIECES_FULL, *conv.MASK30),
                            "shipped_mask30 with SOP weight 1 from step 0 (ALBERT's objective): the quickstart recipe"),
    "ssp0": (("objective.sop_weight=0.0", "data.short_seq_prob=0.0"), "sop0, no short sequences"),
    "lr1e-3": (("objective.sop_weight=0.0", "optimizer.lr=0.001"), "sop0, lr 1e-3"),
    "lr5e-3_w300": (("objective.sop_weight=0.0", "optimizer.lr=0.005", "optimizer.warmup_steps=300"),
                    "sop0, lr 5e-3 with 300 warmup steps"),
    # corpus written by `python bench/convergence/sop_synthetic.py --corpus-only` (its MLM score on WikiText means nothing)
    "sop_numbered": (("objective.sop_weight=1.0", "objective.sop_start_step=0", "objective.sop_ramp_steps=0",
                      "data.train=[{paths: [runs/sop_synthetic/corpus/train.txt]}]",
                      "data.validation=[{paths: [runs/sop_synthetic/corpus/validation.txt]}]"),
                     "SOP weight 1 on numbered sentences ('( 1 ) ... ( 2 ) ...'), where order is easy"),
    "mask30": (("objective.sop_weight=0.0", *conv.MASK30),
               "sop0, 30% masking (ModernBERT)"),
}


def _parse(item: str, default_steps: int) -> tuple[str, int]:
    """"cell" or "cell@steps" -> (cell, steps)."""
    cell, _, steps = item.partition("@")
    return cell, int(steps) if steps else default_steps


def _name(cell: str, steps: int) -> str:
    return cell if steps == 1000 else f"{cell}@{steps}"


def _path(out: Path, cell: str, seed: int, steps: int = 1000) -> Path:
    return out / f"{_name(cell, steps)}-seed{seed}.json"


def run_cell(cell: str, seed: int, steps: int, every: int, out: Path) -> dict:
    """Train and score one (cell, seed); writes and returns its JSON record."""
    from albert_dist.config import load_config

    # BASE's warmup is 10% of 1,000 steps; a shorter run keeps 10% (a cell's own warmup scales the same way)
    overrides = [*BASE, *CELLS[cell][0], f"seed={seed}", f"data.seed={12344 + seed}"]
    if steps != 1000:
        overrides = [f"optimizer.warmup_steps={int(o.split('=')[1]) * steps // 1000}"
                     if o.startswith("optimizer.warmup_steps=") else o for o in overrides]
    cfg = load_config(conv.RECIPE, [*conv.COMMON, f"max_steps={steps}", *overrides])
    scoring = conv.scoring_set(cfg)
    t0 = time.perf_counter()
    if cell == "peer":
        curve = conv.train_peer(cfg, steps, every, scoring)
    else:
        run_dir = out / f"{_name(cell, steps)}-seed{seed}"
        # the trainer's own validation (2,000 SOP pairs) at 300, 600, 900 and the end: SOP accuracy at 300/1,000
        if not (run_dir / "checkpoints" / f"step_{steps}").is_dir():  # else: trained already, score it again
            conv.train_ours(overrides, str(run_dir), steps, every, timeout_s=4 * 3600, eval_every=min(300, steps))
        curve = conv.score_run(cfg, str(run_dir), scoring)
    rec = {"cell": cell, "seed": seed, "steps": steps, "overrides": overrides, "what": CELLS[cell][1],
           "predictions": scoring["predictions"], "unigram": conv.unigram_floor(cfg, scoring), "curve": curve,
           "wall_s": time.perf_counter() - t0}
    _path(out, cell, seed, steps).write_text(json.dumps(rec, indent=1))
    return rec


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def schedule(cells: list[str], seeds: list[int], steps: int, every: int, out: Path, jobs: int,
             busy_pids: tuple[int, ...] = ()) -> int:
    """Run the missing (cell[@steps], seed) pairs, at most ``jobs`` child processes at a time; returns failures."""
    todo = [(c, s) for s in seeds for c in cells
            if not _path(out, _parse(c, steps)[0], s, _parse(c, steps)[1]).exists()]
    running: list[tuple[subprocess.Popen, str, int]] = []
    failed = 0
    while todo or running:
        while todo and len(running) + sum(map(_alive, busy_pids)) < jobs:
            c, s = todo.pop(0)
            cell, n = _parse(c, steps)
            logf = open(out / f"{_name(cell, n)}-seed{s}.log", "w")
            cmd = [sys.executable, __file__, "_one", cell, str(s), "--steps", str(n), "--every", str(every),
                   "--out", str(out)]
            running.append((subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT), c, s))
            log.info("started %s seed %d", c, s)
        time.sleep(5)
        for item in list(running):
            proc, c, s = item
            if proc.poll() is not None:
                running.remove(item)
                log.info("%s seed %d: exit %d", c, s, proc.returncode)
                failed += proc.returncode != 0
    return failed


def load(out: Path) -> dict[str, list[dict]]:
    recs: dict[str, list[dict]] = {}
    for p in sorted(out.glob("*-seed*.json")):
        rec = json.loads(p.read_text())
        recs.setdefault(_name(rec["cell"], rec["steps"]), []).append(rec)
    return recs


def _cell_fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {abs(values[0] - values[1]) / 2:.{digits}f}"


def table(out: Path, report_steps=(300, 1000)) -> str:
    """Markdown: per cell and run length, loss / accuracy at the report steps (mean ± half the spread of two
    seeds), val SOP accuracy at the end, steps to the peer's first-report-step accuracy."""
    recs = load(out)
    peer = recs.get("peer", [])
    target = statistics.mean(conv.at_step(r["curve"], report_steps[0])["mlm_accuracy"] for r in peer) if peer else None
    head = ("| cell | what | run steps | seeds | " + " | ".join(f"{s} steps: MLM loss | MLM acc" for s in report_steps)
            + " | val SOP acc (end) | steps to peer's %d-step acc |" % report_steps[0])
    lines = [head, "|" + "---|" * (4 + 2 * len(report_steps) + 2)]
    first = next(iter(recs.values()))[0] if recs else None
    keys = sorted(recs, key=lambda k: (int(k.partition("@")[2] or 1000) != 1000, list(CELLS).index(k.partition("@")[0])))
    for key in keys:
        rs, cell = recs[key], key.partition("@")[0]
        cells = [cell, CELLS[cell][1], str(rs[0]["steps"]), ",".join(str(r["seed"]) for r in rs)]
        for s in report_steps:
            pts = [p for p in (conv.at_step(r["curve"], s) for r in rs) if p]
            cells += [_cell_fmt([p["mlm_loss"] for p in pts]), _cell_fmt([p["mlm_accuracy"] for p in pts])]
        sops = [r["curve"][-1]["val_sop_accuracy"] for r in rs if "val_sop_accuracy" in r["curve"][-1]]
        cells.append(_cell_fmt(sops) if sops and cell != "peer" else "")
        tta = [conv.time_to(r["curve"], target)["steps"] for r in rs] if target else []
        cells.append(", ".join(str(t) if t else "—" for t in tta))
        lines.append("| " + " | ".join(cells) + " |")
    if first:
        u = first["unigram"]
        lines.append(f"\nHeld-out set: {first['predictions']} masked tokens; unigram floor {u['mlm_loss']:.3f} / "
                     f"{u['mlm_accuracy']:.3f}" + (f"; peer's {report_steps[0]}-step accuracy {target:.3f}" if target else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["run", "table", "list", "_one"])
    p.add_argument("cells", nargs="*")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="runs/ablations")
    p.add_argument("--busy-pids", type=int, nargs="*", default=[],
                   help="processes (earlier runs) that hold a job slot while they live")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.command == "list":
        for name, (ov, what) in CELLS.items():
            print(f"{name:<12} {what}\n{'':<12} {' '.join([*BASE, *ov])}")
        return 0
    if args.command == "table":
        print(table(out))
        return 0
    if args.command == "_one":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        run_cell(args.cells[0], int(args.cells[1]), args.steps, args.every, out)
        return 0
    unknown = sorted({_parse(c, args.steps)[0] for c in args.cells} - set(CELLS))
    if unknown:
        p.error(f"unknown cells {unknown}")
    return 1 if schedule(args.cells, args.seeds, args.steps, args.every, out, args.jobs,
                                tuple(args.busy_pids)) else 0


if __name__ == "__main__":
    sys.exit(main())
