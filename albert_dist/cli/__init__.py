"""The `albert-dist` command: one sub-command per concern, each front end a module of this package.

    albert-dist train      --config configs/pretrain/<recipe>.yaml [dotted.key=value ...]
    albert-dist tokenizer  train --input <paths/globs> --vocab-size N --output DIR
    albert-dist data       prepare --input <paths/globs> --output DIR | plan --config R --ranks N --workers W
    albert-dist export     <checkpoint dir or run> --output DIR     (HF-format export)
    albert-dist finetune   <run dir, run id or HF dir> --task sst2 stsb --data-dir DIR [--init random]
    albert-dist compare    <run ids or run dirs> | --experiment NAME
    albert-dist tracking   sync RUN_DIR                             (send what a job could not send to MLflow)
    albert-dist goodput    RUN_DIR [--json]                         (wall time: productive, badput by cause)
    albert-dist dist                                                (print this task's rank discovery)

One argparse parser with a sub-parser per command. A front end (``albert_dist.cli.<command>``) exposes
``add_arguments(parser)`` and ``run(args) -> int`` and only parses and calls: the work lives in the library
modules it imports inside ``run``, so building the parser of one command imports nothing heavy (`albert-dist
tokenizer` never imports DeepSpeed) and only that command's front end is imported at all. This module owns the
one error path: a user error (`ValueError`, `OSError`) escaping ``run`` is one line (`error_line`) and
`EXIT_CONFIG_ERROR` (a store down for its retry budget, `TryAgainLater`: the same line, `EXIT_PREEMPTED`; an
input file gone while it was read, `InputVanished`: `EXIT_INPUT_VANISHED`);
argparse's usage errors exit 2 as well; every code is one of `albert_dist.exit_codes`.
A module that exposes only ``cli(argv) -> int`` (a command added before its front end moved here) is handed
the rest of the command line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional

from albert_dist.exit_codes import (EXIT_CONFIG_ERROR, EXIT_INPUT_VANISHED, EXIT_OK, EXIT_PREEMPTED, InputVanished,
                                   TryAgainLater, error_line)

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("albert_dist.cli.train", "pretrain ALBERT (deepspeed launcher, torchrun, srun or plain python)"),
    "tokenizer": ("albert_dist.cli.tokenizer", "train a sentencepiece tokenizer with ALBERT's special ids"),
    "data": ("albert_dist.cli.data", "data prepare: reshard corpora into parquet shards; data plan: a job's slot plan"),
    "export": ("albert_dist.cli.export", "export a checkpoint to transformers' AlbertForPreTraining format"),
    "finetune": ("albert_dist.cli.finetune", "fine-tune and score a checkpoint on GLUE-style tasks (seeds, MLflow child runs)"),
    "compare": ("albert_dist.cli.compare", "compare MLflow runs: differing params, final/best metrics, curves"),
    "tracking": ("albert_dist.cli.tracking", "tracking sync RUN_DIR: send a job's unsent metrics and uploads to MLflow"),
    "goodput": ("albert_dist.cli.goodput", "goodput RUN_DIR: a run's wall time across restarts, productive and lost by cause"),
    "dist": ("albert_dist.cli.dist", "print this task's rank discovery as one DIST {...} line (a job-script check)"),
}


def _strip_launcher_local_rank(argv: list[str]) -> list[str]:
    """Drop ``--local_rank=N`` / ``--local-rank N`` that the deepspeed launcher (without ``--no_local_rank``)
    and old ``torch.distributed.launch`` put in front of the sub-command; LOCAL_RANK carries the same value
    (set here if the launcher did not), and albert_dist.distributed.group reads it from there."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(("--local_rank=", "--local-rank=")):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        elif arg in ("--local_rank", "--local-rank") and i + 1 < len(argv):
            os.environ.setdefault("LOCAL_RANK", argv[i + 1])
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The `albert-dist` parser: a sub-parser per `COMMANDS` entry; only `command`'s front end is imported and
    adds its arguments (the others are listed by name and help)."""
    parser = argparse.ArgumentParser(prog="albert-dist", description="Pretrain ALBERT with DeepSpeed, and the tools "
                                     "around it: one command per task (albert-dist <command> --help).")
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name, (module, help_) in COMMANDS.items():
        front = importlib.import_module(module) if name == command else None
        own_parser = front is not None and not hasattr(front, "add_arguments")
        # a module with its own `cli(argv)` parses the rest itself, --help included
        p = sub.add_parser(name, help=help_, description=help_, add_help=not own_parser)
        if own_parser:
            p.set_defaults(own_parser=True)
        elif front is not None:
            front.add_arguments(p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Walk down the sub-parsers the command line names, then parse the rest with the innermost one, intermixed
    (``train --config R a=1 --resume auto b=2``: overrides around options; argparse cannot intermix across a
    sub-parser level). Usage errors and ``--help`` raise argparse's SystemExit. ``args.command_path`` is the
    command and sub-commands named, e.g. ``["data", "prepare"]``; ``args.command_line`` the whole `argv`."""
    namespace = argparse.Namespace(command_line=list(argv))
    path: list[str] = []
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if not argv or argv[0] not in subs[0].choices:
            if argv and argv[0] in ("-h", "--help"):
                parser.print_help()
                parser.exit(0)
            if argv and not argv[0].startswith("-"):
                parser.error(f"unknown command {argv[0]!r} (choose from {', '.join(subs[0].choices)})")
            parser.error("a command is required")
        path.append(argv[0])
        setattr(namespace, subs[0].dest, argv[0])
        parser, argv = subs[0].choices[argv[0]], argv[1:]
    if parser.get_default("own_parser"):
        args = parser.parse_args([], namespace)
        args.argv = argv
    else:
        args = parser.parse_intermixed_args(argv, namespace)
    args.command_path = path
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Run ``albert-dist <command> ...``; returns the process exit code (`albert_dist.exit_codes`)."""
    argv = _strip_launcher_local_rank(list(sys.argv[1:] if argv is None else argv))
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(command)
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, argparse's line already printed)
        return EXIT_OK if exc.code in (0, None) else EXIT_CONFIG_ERROR
    front = importlib.import_module(COMMANDS[command][0])
    if not hasattr(front, "run"):
        code = int(front.cli(args.argv) or 0)
    else:
        try:
            code = int(front.run(args) or 0)
        except (ValueError, OSError, TryAgainLater, InputVanished) as err:  # the user's input, a store down: one line
            print(error_line(' '.join(['albert-dist', *args.command_path]), err), file=sys.stderr)
            code = (EXIT_PREEMPTED if isinstance(err, TryAgainLater) else EXIT_INPUT_VANISHED
                    if isinstance(err, InputVanished) else EXIT_CONFIG_ERROR)
    end_process = getattr(front, "end_process", None)
    if end_process is not None:  # `train`: a rank of a multi-rank job ends here, past its interpreter's teardown
        end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
