"""The app of `albert-dist data prepare | plan`: arguments, the recipe, exit codes.

    albert-dist data prepare (--input PATH ... | --config RECIPE [key=value ...]) --output DIR [options]
    albert-dist data plan --config RECIPE --ranks N [--workers W] [key=value ...] [--json]

The work lives in the data layer (`albert_dist.data.prepare`, `albert_dist.data.plan`); this module sits at the
top because ``--config`` reads a whole recipe with the app's one YAML loader (`albert_dist.config.load_config`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Optional

from albert_dist.exit_codes import EXIT_CONFIG_ERROR, EXIT_OK, error_line

#: `albert-dist data <sub-command>` -> "module:function" taking argv and returning the exit code
SUB_COMMANDS: dict[str, str] = {"prepare": "albert_dist.data_cli:prepare_cli", "plan": "albert_dist.data_cli:plan_cli"}


def prepare_cli(argv: list[str]) -> int:
    """``albert-dist data prepare ...`` (`albert_dist.data.prepare`); exit 2 with a clear line while that module
    is not in this version."""
    try:
        prepare = importlib.import_module("albert_dist.data.prepare")
    except ModuleNotFoundError as err:
        if err.name != "albert_dist.data.prepare":  # a dependency of the module is missing: a real error
            raise
        print("albert-dist data prepare: not available in this version (albert_dist/data/prepare.py is missing)",
              file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return int(prepare.cli(argv) or 0)


def plan_cli(argv: list[str]) -> int:
    """``albert-dist data plan``: the job's slot plan from metadata (`albert_dist.data.plan`); 0, or 2 with one
    line naming the file or field for bad input."""
    from albert_dist.config import load_config
    from albert_dist.data.plan import format_plan, plan_data

    parser = argparse.ArgumentParser(prog="albert-dist data plan",
                                     description="What every slot (rank x loader worker) of a job would read, "
                                                 "from metadata: pieces, bytes per slot, read amplification.")
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--ranks", type=int, required=True, help="world size of the job (GPUs)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader workers per rank (default: the recipe's data.num_workers)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, as for train")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        workers = cfg.data.num_workers if args.workers is None else args.workers
        plans = plan_data(cfg.data, args.ranks, workers)
    except (ValueError, OSError) as err:
        print(error_line("albert-dist data plan: error", err), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.json:
        print(json.dumps({"ranks": args.ranks, "workers": workers, "sources": [p.as_dict() for p in plans]}, indent=2))
    else:
        print(format_plan(plans, args.ranks, workers))
    return EXIT_OK


def cli(argv: Optional[list[str]] = None) -> int:
    """``albert-dist data <prepare|plan> ...``: dispatch to the sub-command (imported lazily)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUB_COMMANDS:
        help_asked = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: albert-dist data {" + ",".join(SUB_COMMANDS) + "} [args]   (--help after each for its "
              "options)", file=sys.stdout if help_asked else sys.stderr)
        return EXIT_OK if help_asked else EXIT_CONFIG_ERROR
    module, func = SUB_COMMANDS[argv[0]].split(":")
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
