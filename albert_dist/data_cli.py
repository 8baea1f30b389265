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
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.sizes import mib, parse_byte_size
from albert_dist.exit_codes import EXIT_CONFIG_ERROR, EXIT_OK, error_line

logger = logging.getLogger(__name__)

#: `albert-dist data <sub-command>` -> "module:function" taking argv and returning the exit code
SUB_COMMANDS: dict[str, str] = {"prepare": "albert_dist.data_cli:prepare_cli", "plan": "albert_dist.data_cli:plan_cli"}


def _sources_from_args(args: argparse.Namespace) -> tuple[list[SourceConfig], Optional[str], int]:
    """(sources, tokenizer path, max_document_bytes) from --config (its data.train) and --input."""
    sources: list[SourceConfig] = []
    tokenizer = args.tokenizer
    max_doc = args.max_document_bytes
    if args.config:
        from albert_dist.config import load_config

        cfg = load_config(args.config, args.overrides)
        local = [s for s in cfg.data.train if s.format != "hub"]
        hub = [s.paths[0] for s in cfg.data.train if s.format == "hub"]
        if hub:
            logger.warning("prepare: leaving out the hub sources of %s: %s (prepare reads local files)",
                           args.config, hub)
        if len({s.weight for s in local}) > 1:
            logger.warning("prepare: the recipe's sources have different weights %s; one prepared output mixes "
                           "them by size instead: prepare each source on its own to keep the weights",
                           [s.weight for s in local])
        sources += local
        tokenizer = tokenizer or cfg.data.tokenizer_path
        max_doc = max_doc or cfg.data.max_document_bytes
    elif args.overrides:
        raise ValueError(f"key=value overrides {args.overrides} need --config")
    for path in args.input or []:
        sources.append(SourceConfig(paths=[path], format=args.format, text_field=args.text_field,
                                    txt_documents=args.txt_documents))
    return sources, tokenizer, max_doc or DataConfig.max_document_bytes


def prepare_parser() -> argparse.ArgumentParser:
    """The ``albert-dist data prepare`` argument parser (defaults from albert_dist.data.prepare)."""
    from albert_dist.data import prepare as prep

    p = argparse.ArgumentParser(prog="albert-dist data prepare",
                                description="Reshard raw corpora into deduplicated parquet shards sized for a "
                                            "cluster, with a manifest (docs/data.md).")
    p.add_argument("--input", action="append", metavar="PATH",
                   help="file, directory or glob (txt/jsonl/parquet, optionally .gz/.zst); repeatable")
    p.add_argument("--config", help="a recipe: its data.train sources are the input (and its tokenizer the "
                                    "token estimate's)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides (with --config)")
    p.add_argument("--output", required=True, help="output directory (must not exist, or be a prepare output)")
    p.add_argument("--format", default="auto", choices=("auto", "txt", "jsonl", "parquet"),
                   help="format of the --input files (default: from the suffix)")
    p.add_argument("--text-field", default="text", help="JSON key / parquet column of the text (--input)")
    p.add_argument("--txt-documents", default="blank_line", choices=("blank_line", "file"),
                   help=".txt inputs: documents separated by blank lines, or one per file")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--num-shards", type=int, help="number of output files")
    size.add_argument("--shard-bytes", type=parse_byte_size, help="text bytes per output file (e.g. 256M)")
    p.add_argument("--row-group-bytes", type=parse_byte_size,
                   help="text bytes per row group (default: from --target-ranks x --target-loader-workers)")
    p.add_argument("--target-ranks", type=int, default=prep.DEFAULT_TARGET_RANKS,
                   help=f"largest job (ranks) the output is sized for (default {prep.DEFAULT_TARGET_RANKS})")
    p.add_argument("--target-loader-workers", type=int, default=prep.DEFAULT_TARGET_LOADER_WORKERS,
                   help=f"its data.num_workers (default {prep.DEFAULT_TARGET_LOADER_WORKERS})")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    p.add_argument("--workers", type=int, default=max(1, cores), help="processes (default: the usable CPU cores)")
    p.add_argument("--keep-duplicates", action="store_true", help="keep exact-duplicate documents")
    p.add_argument("--dedup-memory", type=parse_byte_size, default=prep.DEFAULT_DEDUP_MEMORY_BYTES,
                   help="memory for the duplicate search (default 1G; above it hashes are bucketed on disk)")
    p.add_argument("--max-document-bytes", type=parse_byte_size, default=None,
                   help="longer documents are skipped and counted (default: the recipe's, else 4M)")
    p.add_argument("--tokenizer", help="spiece.model for the token estimate (default: the recipe's, else the "
                                       "bundled one); 'none' to skip it")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier prepare output in --output")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal)")
    return p


def summary(manifest: dict, out: str) -> str:
    """What `prepare` prints when done: sizes, counts, how many slots read it without amplification, the recipe."""
    tokens = manifest.get("tokens_estimate")
    dd = manifest["dedup"]
    sizing = manifest["sizing"]
    return "\n".join([
        f"wrote {manifest['num_shards']} shards, {manifest['row_groups']} row groups of ~"
        f"{mib(manifest['row_group_bytes'])} to {out} in {manifest['seconds']['total']:.1f} s",
        f"  {manifest['documents']:,} documents, {mib(manifest['bytes'])} of text"
        + (f", ~{tokens:,} tokens" if tokens else "")
        + f"; {dd['duplicates_dropped']:,} duplicates dropped" + ("" if dd["enabled"] else " (dedup off)")
        + f"; skipped {manifest['skipped'] or 'nothing'}",
        f"  jobs of up to {manifest['row_groups']:,} slots (ranks x data.num_workers) read each byte once per epoch; "
        f"{manifest['row_groups'] / sizing['target_slots']:.3g} row groups per slot at {sizing['target_ranks']} "
        f"ranks x {sizing['target_loader_workers']} workers",
        f"  train on it: data.train: [{{paths: [\"{out}/*.parquet\"]}}]",
    ])


def prepare_cli(argv: list[str]) -> int:
    """``albert-dist data prepare ...``: 0 done (or already complete), 2 bad arguments or input."""
    from albert_dist.data import prepare as prep

    args = prepare_parser().parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    command = "albert-dist data prepare " + shlex.join(argv)
    try:
        sources, tokenizer, max_doc = _sources_from_args(args)
        opts = prep.PrepareOptions(
            sources=sources, output=args.output, num_shards=args.num_shards, shard_bytes=args.shard_bytes,
            row_group_bytes=args.row_group_bytes, target_ranks=args.target_ranks,
            target_loader_workers=args.target_loader_workers, workers=args.workers, dedup=not args.keep_duplicates,
            dedup_memory_bytes=args.dedup_memory, max_document_bytes=max_doc,
            tokenizer_path=None if (tokenizer or "").lower() == "none" else (tokenizer or DataConfig.tokenizer_path),
            overwrite=args.overwrite, progress=args.progress)
        manifest = prep.prepare(opts, command)
    except prep.AlreadyComplete as done:
        print(f"albert-dist data prepare: {done}")
        return EXIT_OK
    except (ValueError, OSError) as err:
        print(error_line("albert-dist data prepare: error", err), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    shown = args.output if "://" in args.output else str(Path(args.output).expanduser().resolve())
    print(summary(manifest, shown))
    return EXIT_OK


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
