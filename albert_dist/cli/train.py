"""The front end of `albert-dist train` (the app's main: `albert_dist.train.main`, which owns its exit codes).

    albert-dist train --config configs/pretrain/<recipe>.yaml [dotted.key=value ...] [--resume auto|PATH]
                      [--resume-from RUN_ID|runs:/RUN_ID]
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe, its dotted overrides and what to resume from."""
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': continue from the newest complete checkpoint of run_dir (start fresh if none); "
                             "PATH: a checkpoint directory or step_<N> directory")
    parser.add_argument("--resume-from", default=None, metavar="RUN_ID|runs:/RUN_ID",
                        help="continue an MLflow run: download its newest complete checkpoint, resume exactly, "
                             "keep logging into the same run (albert_dist.tracking)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. engine.zero_stage=3")


def run(args: argparse.Namespace) -> int:
    """Train (`albert_dist.train.main`); its exit code (`albert_dist.exit_codes`)."""
    from albert_dist.train import main

    resume = [] if args.resume is None else [f"checkpoint.resume={args.resume}"]
    return main(args.config, [*args.overrides, *resume], args.resume_from)


def end_process(code: int) -> None:
    """`albert_dist.train.end_process`: a rank of a multi-rank job exits at once with `code`."""
    from albert_dist.train import end_process as end

    end(code)
