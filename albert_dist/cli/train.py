"""The front end of `albert-dist train` (the app's main: `albert_dist.apps.pretrain.main.main`, which owns its exit codes).

    albert-dist train --config configs/pretrain/<recipe>.yaml [dotted.key=value ...] [--resume auto|PATH]
                      [--resume-from RUN_ID|runs:/RUN_ID] [--print-run-dir auto|DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe, its dotted overrides and what to resume from."""
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': continue from the newest complete checkpoint of run_dir (start fresh if none); "
                             "PATH: a checkpoint directory or step_<N> directory")
    parser.add_argument("--resume-from", default=None, metavar="RUN_ID|runs:/RUN_ID",
                        help="continue an MLflow run: download its newest complete checkpoint, resume exactly, "
                             "keep logging into the same run (albert_dist.tracking)")
    parser.add_argument("--print-run-dir", default=None, metavar="auto|DIR",
                        help="train nothing: print the run directory this command's ranks would use (absolute), the "
                             "recipe's or overrides' run_dir, else DIR, or with 'auto' a new runs/<recipe>-<UTC time> "
                             "created as rank 0 names it, then 'new' on a second line (what the launch scripts judge)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. engine.zero_stage=3")


def run(args: argparse.Namespace) -> int:
    """Train (`albert_dist.apps.pretrain.main.main`), or with ``--print-run-dir`` print the job's run directory; the exit code
    (`albert_dist.exit_codes`)."""
    resume = [] if args.resume is None else [f"checkpoint.resume={args.resume}"]
    if args.print_run_dir is not None:
        from albert_dist.config import load_config
        from albert_dist.apps.pretrain.init_from import read_source
        from albert_dist.job.lock import auto_run_dir

        # a bad config: one line, exit 2
        run_dir = load_config(args.config, [*args.overrides, *resume], read_source).run_dir
        if run_dir is not None:
            print(run_dir)
        elif args.print_run_dir == "auto":
            print(auto_run_dir(Path(args.config).stem), "new", sep="\n")  # the name albert_dist.apps.pretrain.main's rank 0 takes
        else:
            print(Path(args.print_run_dir).expanduser().absolute())
        return 0
    from albert_dist.apps.pretrain.main import main

    return main(args.config, [*args.overrides, *resume], args.resume_from)


def end_process(code: int) -> None:
    """`albert_dist.apps.pretrain.main.end_process`: a rank of a multi-rank job exits at once with `code`."""
    if "albert_dist.apps.pretrain.main" not in sys.modules:  # the app never ran (--print-run-dir, a usage error): nothing to end
        return
    from albert_dist.apps.pretrain.main import end_process as end

    end(code)
