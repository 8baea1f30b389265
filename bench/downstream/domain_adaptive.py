"""Domain-adaptive pretraining at a CPU budget (Gururangan et al. 2020, "Don't Stop Pretraining"), scored on SST-2.

Four models of one architecture (the README's recipe, configs/pretrain/albert-tiny-wikitext.yaml), each fine-tuned
by the same `albert-dist finetune` command (3 seeds, same hyper-parameters):

* **wikitext** - the README's main job as it is (``--base``, a `make pretrain` run directory);
* **continued** - that checkpoint continued on SST-2's unlabelled training sentences (``model.init_from=<base>``,
  the recipe's steps, schedule and batch: a new run);
* **scratch** - the same recipe from random weights on the same SST-2 sentences (the base's tokenizer);
* **random** - the same model untrained (``--init random`` of the base), the floor.

The pretraining corpus is read at run time from ``<glue-dir>/glue-sst2/train.tsv``'s ``sentence`` column (labels are
never read; nothing is copied into the repository): written under ``--out`` as text, 16 phrases per document
(the phrases are shuffled sub-phrases of reviews: a document is a block, SOP has no discourse to learn), the last
``--heldout`` phrases as the validation file. Fine-tuning reads SST-2's train (subset) and dev as usual.

    make pretrain                       # or: RUN_DIR=runs/quickstart launch/pretrain_local.sh 2
    python bench/downstream/domain_adaptive.py --base runs/quickstart --glue-dir ../shared/corpora \\
        --out runs/dapt --doc docs/finetune.md -- --max-train-samples 3000 --learning-rate 1e-3

The table (median [min-max] over the seeds, and each pretraining run's final validation MLM accuracy on its own
validation set) goes to stdout, ``<out>/domain_adaptive.json`` and, with ``--doc``, between the
``domain-adaptive figures`` markers. A pretraining run already complete in ``<out>`` is reused (delete it to redo).
The base's and the random init's fine-tunes are where bench/downstream/what_pretraining_buys.py looks for them
(``<base>/downstream.json``, ``<out>/random/``): ``what_pretraining_buys.py --run <base> --out <out> --tasks sst2
--report-only`` reads them back.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_block  # noqa: E402
from what_pretraining_buys import finetune, latest, seed_scores  # noqa: E402

RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
PHRASES_PER_DOCUMENT = 16


def write_corpus(glue_dir: Path, out: Path, heldout: int) -> tuple[Path, Path, int]:
    """SST-2's training sentences -> ``out/train.txt`` and ``out/validation.txt`` (documents of
    `PHRASES_PER_DOCUMENT` lines separated by blank lines); returns the two paths and the phrase count.

    Raises SystemExit when the file or its ``sentence`` column is missing."""
    src = glue_dir / "glue-sst2" / "train.tsv"
    if not src.is_file():
        raise SystemExit(f"--glue-dir: no {src}")
    with src.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if "sentence" not in (reader.fieldnames or []):
            raise SystemExit(f"{src}: no 'sentence' column (columns {reader.fieldnames})")
        phrases = [row["sentence"].strip() for row in reader if row["sentence"].strip()]
    out.mkdir(parents=True, exist_ok=True)

    def write(path: Path, lines: list[str]) -> None:
        blocks = [lines[i:i + PHRASES_PER_DOCUMENT] for i in range(0, len(lines), PHRASES_PER_DOCUMENT)]
        path.write_text("\n\n".join("\n".join(b) for b in blocks) + "\n", encoding="utf-8")

    train, validation = out / "train.txt", out / "validation.txt"
    write(train, phrases[:-heldout])
    write(validation, phrases[-heldout:])
    return train, validation, len(phrases)


def pretrain(run_dir: Path, ranks: int, overrides: list[str]) -> None:
    """The README's recipe through launch/pretrain_local.sh (as a user runs it), unless `run_dir` is complete."""
    if (run_dir / "final_model").is_dir():
        print(f"[dapt] reusing {run_dir} (final_model/ present)", flush=True)
        return
    cmd = ["bash", "launch/pretrain_local.sh", str(ranks), RECIPE, f"run_dir={run_dir}", *overrides]
    print("[dapt]", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def final_val(run_dir: Path) -> dict:
    """The last validation record of a run's metrics.jsonl ({"val/mlm_accuracy": ..., "step": ...}; {} if none)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    vals = [r for r in records if "val/mlm_accuracy" in r]
    return vals[-1] if vals else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the README's main job's run directory (make pretrain)")
    p.add_argument("--glue-dir", required=True, help="directory holding glue-sst2/{train,dev}.tsv")
    p.add_argument("--out", default=str(ROOT / "runs" / "dapt"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--heldout", type=int, default=2000, help="phrases kept out of pretraining for its validation")
    p.add_argument("--doc", default=None, help="write the table into this markdown file between the markers")
    p.add_argument("--report-only", action="store_true", help="only read what the runs and fine-tunes wrote")
    p.add_argument("extra", nargs="*", help="more `albert-dist finetune` flags (after --)")
    args = p.parse_args(argv)
    out, base, glue = Path(args.out).resolve(), Path(args.base).resolve(), Path(args.glue_dir).resolve()
    corpus = out / "corpus"
    train, validation, n_phrases = write_corpus(glue, corpus, args.heldout)
    data = [f"data.train=[{train}]", f"data.validation=[{validation}]"]
    runs = {"continued": out / "continued", "scratch": out / "scratch"}
    models = {  # name -> (model given to finetune, --output, init)
        "wikitext (README job)": (base, None, "pretrained"),
        "wikitext + continued on SST-2": (runs["continued"], None, "pretrained"),
        "SST-2 from scratch": (runs["scratch"], None, "pretrained"),
        "random init": (base, out / "random", "random"),
    }
    if not args.report_only:
        pretrain(runs["continued"], args.ranks, [f"model.init_from={base}", *data])
        pretrain(runs["scratch"], args.ranks, data)
        for source, output, init in models.values():
            finetune(str(source), str(output) if output else None, ["sst2"], str(glue), args.seeds,
                     [*(["--init", "random"] if init == "random" else []), *args.extra])
    rows, record = [], {}
    val_of = {"wikitext (README job)": base, "wikitext + continued on SST-2": runs["continued"],
              "SST-2 from scratch": runs["scratch"]}
    for name, (source, output, init) in models.items():
        result = latest(Path(output or source) / "downstream.json", "sst2", init)
        scores = seed_scores(result)[result["primary_metric"]]
        val = final_val(val_of[name]) if name in val_of else {}
        acc = f"{val['val/mlm_accuracy']:.3f}" if val else "-"
        rows.append(f"| {name} | {acc} | {statistics.median(scores):.3f} "
                    f"[{min(scores):.3f}-{max(scores):.3f}] |")
        record[name] = {"sst2_accuracy_seeds": scores, "val_mlm_accuracy": val.get("val/mlm_accuracy"),
                        "finetune": result["finetune"], "train_examples": result["train_examples"]}
    hp = next(iter(record.values()))["finetune"]
    text = "\n".join([
        "| model | val MLM accuracy (own validation set) | SST-2 dev accuracy |", "|---|---|---|", *rows, "",
        f"Pretraining corpus: {n_phrases - args.heldout:,} SST-2 training phrases ({args.heldout:,} held out for "
        f"validation), the README's recipe ({RECIPE}); {len(args.seeds)} seeds each; "
        f"{record['random init']['train_examples']} training examples; lr {hp['learning_rate']:g}, "
        f"{hp['num_train_epochs']:g} epochs, batch {hp['per_device_train_batch_size']}, max length "
        f"{hp['max_seq_length']}."])
    print(text)
    (out / "domain_adaptive.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.doc:
        write_block(args.doc, "domain-adaptive figures", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
