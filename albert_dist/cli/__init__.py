"""The `albert-dist` command: one sub-command per concern, each owned by the module that implements it.

    albert-dist train      --config configs/pretrain/<recipe>.yaml [dotted.key=value ...]
    albert-dist tokenizer  train --input <paths/globs> --vocab-size N --output DIR
    albert-dist data       prepare --input <paths/globs> --output DIR | plan --config R --ranks N --workers W
    albert-dist export     <checkpoint dir or run> --output DIR     (HF-format export)
    albert-dist compare    <run ids or run dirs> | --experiment NAME
    albert-dist tracking   sync RUN_DIR                             (send what a job could not send to MLflow)

Each sub-command's module exposes ``cli(argv: list[str]) -> int``; this file only dispatches, imports lazily
(so `albert-dist tokenizer` never imports DeepSpeed) and owns the process exit code.
"""
from __future__ import annotations

import importlib
import os
import sys

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("albert_dist.train", "pretrain ALBERT (deepspeed launcher, torchrun, srun or plain python)"),
    "tokenizer": ("albert_dist.data.tokenizer", "train a sentencepiece tokenizer with ALBERT's special ids"),
    "data": ("albert_dist.data_cli", "data prepare: reshard corpora into parquet shards; data plan: a job's slot plan"),
    "export": ("albert_dist.export", "export a checkpoint to transformers' AlbertForPreTraining format"),
    "compare": ("albert_dist.compare", "compare MLflow runs: differing params, final/best metrics, curves"),
    "tracking": ("albert_dist.tracking_sync", "tracking sync RUN_DIR: send a job's unsent metrics and uploads to MLflow"),
}


def _usage() -> str:
    lines = ["usage: albert-dist <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def _strip_launcher_local_rank(argv: list[str]) -> list[str]:
    """Drop ``--local_rank=N`` / ``--local-rank N`` that the deepspeed launcher (without ``--no_local_rank``)
    and old ``torch.distributed.launch`` put in front of the sub-command; LOCAL_RANK carries the same value
    (set here if the launcher did not), and albert_dist.engine.distributed reads it from there."""
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


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``albert-dist <command> ...`` to ``<module>.cli(rest)``; returns the process exit code."""
    argv = _strip_launcher_local_rank(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"albert-dist: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    code = int(module.cli(rest) or 0)
    if command == "train":  # a rank of a multi-rank job ends here, past its interpreter's teardown
        module.end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
