"""Can the SOP head learn at all? The real trainer on a corpus where sentence order is easy to see.

Every document is 4-10 sentences of the bundled corpus, each prefixed with its number in the document
("( 1 ) ... ( 2 ) ..."). A segment pair in order has the smaller numbers in A; a swapped pair has them in B,
and sentence "( 1 )" in B means "swapped" outright. If val SOP accuracy stays at 0.5 here, the SOP path
(labels, token types, pooler, head, loss) is broken; if it learns here but not on the natural corpus, the task
is only hard for the model.

    python bench/convergence/sop_synthetic.py [--steps 300] [--out runs/sop_synthetic] [key=value ...]
    python bench/convergence/sop_synthetic.py --probe [--corpus natural]      # is the order in the input at all?

Prints the trainer's validation SOP accuracy per evaluation (validation: held-out synthetic documents).
``--probe`` instead fits a logistic regression on bag-of-(token, segment) counts of the trainer's own training
batches (the data loader of the quickstart recipe, Adam, batch 64) and prints its accuracy on 2,000 pairs of the
held-out documents (the validation file): if that linear model finds the order and the transformer does not, the signal is in
the data and the transformer has not learnt to read it yet. Not a suite benchmark (no ``run``).
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


def bag_of_tokens_probe(train: str, validation: str, steps: int = 300, batch: int = 64, seed: int = 0
                        ) -> dict[str, float]:
    """Logistic regression on per-example counts of (token id, token type) pairs, trained on ``steps`` batches
    of the training stream of ``train`` (a corpus path or glob) and scored on 2,000 pairs of ``validation``
    (held-out documents: the training pairs recur every epoch of a small corpus, so they can be memorised).

    A pair in order and the same pair swapped hold the same tokens; only which tokens carry segment B's token
    type differs, so this model can tell them apart only by what each segment's tokens are (e.g. "( 1 )" in B).
    Returns ``{"train_accuracy", "heldout_accuracy", "heldout_pairs"}`` (fractions; chance 0.5).
    """
    import torch

    from albert_dist.config import load_config
    from albert_dist.data.loader import build_train_loader

    torch.manual_seed(seed)
    cfg = load_config(conv.RECIPE, [f"data.train=[{{paths: [{train}]}}]", "data.num_workers=0"]).data
    vocab = load_config(conv.RECIPE, []).model.vocab_size
    it = iter(build_train_loader(cfg, batch, 0, 1))
    val_cfg = load_config(conv.RECIPE, [f"data.train=[{{paths: [{validation}]}}]", "data.num_workers=0"]).data
    val_it = iter(build_train_loader(val_cfg, batch, 0, 1))

    def features(b):
        x = torch.zeros(b["input_ids"].shape[0], 2 * vocab)
        return x.scatter_add_(1, b["input_ids"] + vocab * b["token_type_ids"], b["attention_mask"].float())

    w = torch.zeros(2 * vocab, requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, bias], lr=1e-2)
    correct = seen = 0
    for step in range(steps):
        b = next(it)
        logit = features(b) @ w + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, b["sop_labels"].float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= steps - 20:  # training accuracy over the last 20 batches
            correct += int(((logit > 0).long() == b["sop_labels"]).sum())
            seen += len(logit)
    held, held_n = 0, 0
    with torch.no_grad():
        while held_n < 2000:
            b = next(val_it)
            held += int((((features(b) @ w + bias) > 0).long() == b["sop_labels"]).sum())
            held_n += b["sop_labels"].numel()
    return {"train_accuracy": correct / seen, "heldout_accuracy": held / held_n, "heldout_pairs": held_n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--out", default="runs/sop_synthetic")
    p.add_argument("--corpus-only", action="store_true", help="write the corpus to OUT/corpus and stop")
    p.add_argument("--probe", action="store_true", help="bag-of-(token, segment) logistic regression instead")
    p.add_argument("--corpus", choices=["numbered", "natural"], default="numbered", help="with --probe")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    from albert_dist.config import load_config

    out = Path(args.out)
    cfg = load_config(conv.RECIPE, list(conv.COMMON))
    train, val = numbered_corpus(conv.train_files(cfg), out / "corpus")
    if args.corpus_only:
        print(train, val)
        return 0
    if args.probe:
        sources = ((str(train), str(val)) if args.corpus == "numbered"
                   else (cfg.data.train[0].paths[0], cfg.data.validation[0].paths[0]))
        print(json.dumps({"corpus": args.corpus, "steps": args.steps, **bag_of_tokens_probe(*sources, steps=args.steps)}))
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
