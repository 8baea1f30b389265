"""The front end of `albert-dist export` (the work: `albert_dist.apps.export`; what it reads: `albert_dist.runs`).

    albert-dist export RUN_DIR|CHECKPOINT --output DIR [--step N] [--config YAML] [--tokenizer spiece.model]
                       [--fp32 FILE.safetensors|FILE.pt]

Exit codes: 0, or 2 (one line) for a missing file, a missing config, a checkpoint that does not verify or a
checkpoint/config mismatch.
"""
from __future__ import annotations

import argparse

from albert_dist.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, ``--output``, and the overrides of what is found beside it."""
    parser.add_argument("checkpoint", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory or its checkpoints/ (the newest checkpoint that verifies), a DeepSpeed "
                             "checkpoint (step_<N>), or a consolidated state dict (.safetensors, pickle, or a "
                             "directory holding one)")
    parser.add_argument("--output", required=True, help="directory to write (transformers save_pretrained)")
    parser.add_argument("--step", type=int, default=None,
                        help="a run's (or checkpoint directory's) checkpoint step_N; default: the newest verified "
                             "checkpoint, or the final model when it holds the same step")
    parser.add_argument("--config", default=None,
                        help="model preset or training YAML (model: section); default: the config found beside "
                             "the checkpoint")
    parser.add_argument("--tokenizer", default=None,
                        help="sentencepiece model to copy as spiece.model (+ tokenizer_config.json for "
                             "transformers); default: the run's data.tokenizer_path")
    parser.add_argument("--fp32", default=None, help="also write the consolidated fp32 state dict here "
                                                     "(.safetensors, or pickle for any other suffix)")


def run(args: argparse.Namespace) -> int:
    """Export (`albert_dist.apps.export.export_found`); 0.

    Raises:
        ValueError: a missing config, a mismatch, or a checkpoint that does not verify (exit 2).
        OSError: a missing file (exit 2).
    """
    from albert_dist.engine.checkpoint.layout import CheckpointError
    from albert_dist.apps.export import export_found

    try:
        exported = export_found(args.checkpoint, args.output, args.config, args.tokenizer, args.fp32,
                                args.step)
    except CheckpointError as err:  # the user named a broken or partial checkpoint: their input, one line
        raise ValueError(str(err)) from None
    print(f"exported {exported} to {args.output}")
    return EXIT_OK
