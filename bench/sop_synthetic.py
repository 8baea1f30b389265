"""Can the SOP head learn at all? The real trainer on a corpus where sentence order is easy to see.

Every document is 4-10 sentences of the bundled corpus, each prefixed with its number in the document
("( 1 ) ... ( 2 ) ..."). A segment pair in order has the smaller numbers in A; a swapped pair has them in B,
and sentence "( 1 )" in B means "swapped" outright. If val SOP accuracy stays at 0.5 here, the SOP path
(labels, token types, pooler, head, loss) is broken; if it learns here but not on the natural corpus, the task
is only hard for the model.

    python bench/sop_synthetic.py [--steps 300] [--out runs/sop_synthetic] [key=value ...]

Prints the trainer's validation SOP accuracy per evaluation (validation: held-out synthetic documents).
Not a suite benchmark (no ``run``).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import convergence as conv  # noqa: E402

from albert_dist.data.text import split_sentences  # noqa: E402


def numbered_corpus(source_files: list[str], out: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write train.txt / validation.txt (documents separated by blank lines) of numbered sentences."""
    rng = random.Random(seed)
    sentences = [s for f in source_files for s in split_sentences(Path(f).read_text(encoding="utf-8"))
                 if 5 <= len(s.split()) <= 40]
    rng.shuffle(sentences)
    docs, i = [], 0
    while i < len(sentences):
        n = rng.randint(4, 10)
        docs.append(" ".join(f"( {k + 1} ) {s}" for k, s in enumerate(sentences[i:i + n])))
        i += n
    cut = len(docs) * 9 // 10
    out.mkdir(parents=True, exist_ok=True)
    train, val = out / "train.txt", out / "validation.txt"
    train.write_text("\n\n".join(docs[:cut]) + "\n")
    val.write_text("\n\n".join(docs[cut:]) + "\n")
    return train, val


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--out", default="runs/sop_synthetic")
    p.add_argument("--corpus-only", action="store_true", help="write the corpus to OUT/corpus and stop")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    from albert_dist.config import load_config

    out = Path(args.out)
    cfg = load_config(conv.RECIPE, list(conv.COMMON))
    train, val = numbered_corpus(conv.train_files(cfg), out / "corpus")
    if args.corpus_only:
        print(train, val)
        return 0
    overrides = [f"data.train=[{{paths: [{train}]}}]", f"data.validation=[{{paths: [{val}]}}]",
                 "optimizer.warmup_steps=30", "data.eval_batches=32", *args.overrides]
    run_dir = out / "run"
    conv.train_ours(overrides, str(run_dir), args.steps, args.every, timeout_s=3 * 3600)
    _, val_records = conv.read_metrics(str(run_dir))
    for step, rec in sorted(val_records.items()):
        print(json.dumps({"step": step, "val_sop_accuracy": rec["val_sop_accuracy"],
                          "val_sop_loss": rec["val_sop_loss"], "val_mlm_accuracy": rec["val_mlm_accuracy"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
