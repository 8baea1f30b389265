"""The front end of `albert-dist finetune` (the work: `albert_dist.apps.finetune`).

    albert-dist finetune RUN_DIR|RUN_ID|HF_DIR --task sst2 stsb --data-dir DIR [--step N] [--init random] ...

Exit codes: 0, 2 for bad input found before any training (one line), 130 after Ctrl-C (one line).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from albert_dist.apps.finetune.options import FinetuneOptions
from albert_dist.apps.finetune.run import (DEFAULT_BATCH_OTHER, DEFAULT_EPOCHS, DEFAULT_LEARNING_RATE,
                                      DEFAULT_WARMUP_RATIO, RESULTS_FILE)
from albert_dist.apps.finetune.run import __doc__ as finetune_doc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL, the tasks, the fine-tuning hyper-parameters (defaults per task) and the outputs."""
    doc = finetune_doc.split("\n\n")
    p.description, p.epilog = doc[0], "\n\n".join(doc[1:])
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("model", metavar="MODEL", help="run directory, MLflow run id (or runs:/<id>), or transformers "
                                                  "ALBERT directory")
    p.add_argument("--step", type=int, default=None,
                   help="a run's checkpoint step_N (or its final model when that records step N); default: the "
                        "newest verified checkpoint, or the final model when it holds the same step")
    p.add_argument("--init", choices=("pretrained", "random"), default="pretrained",
                   help="random: the same config and tokenizer, fresh weights (default: pretrained)")
    g = p.add_argument_group("tasks")
    g.add_argument("--task", nargs="+", default=None, metavar="TASK", help="GLUE tasks: cola sst2 mrpc qqp stsb "
                                                                           "mnli qnli rte")
    g.add_argument("--data-dir", default=None, help="GLUE's TSV layout (default: the hub, nyu-mll/glue)")
    g.add_argument("--train-file", default=None, help="a task from files instead: .csv, .tsv, .jsonl or .parquet")
    g.add_argument("--validation-file", default=None)
    g.add_argument("--text-column", default="sentence")
    g.add_argument("--text-pair-column", default=None)
    g.add_argument("--label-column", default="label")
    g.add_argument("--task-type", choices=("auto", "classification", "regression"), default="auto",
                   help="auto: regression when the labels are non-integer numbers")
    g.add_argument("--task-name", default=None, help="name of a file task (default: the train file's stem; its folder's name for train.*)")
    h = p.add_argument_group("fine-tuning (defaults per task)")
    h.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="one fine-tune per seed (default 1 2 3)")
    h.add_argument("--learning-rate", "--lr", type=float, default=None,
                   help=f"peak AdamW learning rate (default {DEFAULT_LEARNING_RATE:g})")
    h.add_argument("--epochs", type=float, default=None, help=f"(default {DEFAULT_EPOCHS:g})")
    h.add_argument("--batch-size", type=int, default=None,
                   help=f"per device (default {DEFAULT_BATCH_OTHER}; cola, stsb 16)")
    h.add_argument("--max-seq-length", type=int, default=None, help="(default 64 for sst2/cola, else 128)")
    h.add_argument("--warmup-ratio", type=float, default=None, help=f"(default {DEFAULT_WARMUP_RATIO:g})")
    h.add_argument("--weight-decay", type=float, default=0.01)
    h.add_argument("--classifier-dropout", type=float, default=None, help="(default 0.1, transformers')")
    h.add_argument("--max-train-samples", type=int, default=None, help="a seeded subset of the train split")
    h.add_argument("--max-eval-samples", type=int, default=None, help="a seeded subset of the dev split")
    h.add_argument("--subset-seed", type=int, default=0, help="seed of those subsets (default 0: every model and "
                                                              "fine-tune seed sees the same examples)")
    h.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    h.add_argument("--deepspeed", default=None, help="DeepSpeed JSON for the Trainer (under the deepspeed launcher)")
    o = p.add_argument_group("output")
    o.add_argument("--output", default=None, help=f"directory for {RESULTS_FILE} (default: the run directory)")
    o.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    o.add_argument("--tracking-uri", default=None,
                   help="default: the run's own store (mlflow_run.json), $MLFLOW_TRACKING_URI, <checkout>/mlruns.db")
    o.add_argument("--experiment", default=None,
                   help="experiment of a standalone run (random init, no pretraining run); default: the "
                        "pretraining run's, else albert_dist")


#: Exit code after Ctrl-C (SIGINT): 128 + 2, as a shell reports a command the signal ended.
EXIT_INTERRUPTED = 130


def options(args: argparse.Namespace) -> FinetuneOptions:
    """The parsed flags as `FinetuneOptions` (its fields are the flags' names)."""
    return FinetuneOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneOptions)})


def run(args: argparse.Namespace) -> int:
    """`albert_dist.apps.finetune.run.finetune` of the flags; its exit code, or `EXIT_INTERRUPTED` with one line after
    Ctrl-C naming the tasks that finished and their downstream.json (the one being written is whole or not there). Bad input raises `ValueError`/`OSError`, which `albert_dist.cli.main` prints as the one error line
    (exit 2)."""
    try:
        from albert_dist.apps.finetune.run import finetune

        return finetune(options(args))
    except KeyboardInterrupt as exc:
        print(f"albert-dist finetune: interrupted (Ctrl-C); {interrupted_line(exc)}", file=sys.stderr)
        return EXIT_INTERRUPTED


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """What Ctrl-C left: the finished tasks and their downstream.json, or that none finished (an interrupt
    before the fine-tunes began, while the data or the model loaded, names no file)."""
    finished = getattr(exc, "finished", None)
    if not finished:
        return "no task finished, nothing written"
    return f"{', '.join(finished)} finished, in {exc.results}"
