"""The front end of `albert-dist data prepare | plan`: arguments and the recipe.

    albert-dist data prepare (--input PATH ... | --config RECIPE [key=value ...]) --output DIR [options]
    albert-dist data plan --config RECIPE --ranks N [--workers W] [key=value ...] [--json]

The work lives in the data layer (`albert_dist.data.prepare.run`, `albert_dist.data.sources.pieces`; the plan's printed
report, `format_slots`, is here, away from the training path); this front end sits above the app because
``--config`` reads a whole recipe with the app's one YAML loader (`albert_dist.config.load_config`).
Bad input (a `ValueError` or `OSError` from the work) is `albert_dist.cli`'s one error line and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
from pathlib import Path
from typing import Optional

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.sizes import fmt_bytes, parse_byte_size
from albert_dist.exit_codes import EXIT_OK

logger = logging.getLogger(__name__)


def _sources_from_args(args: argparse.Namespace) -> tuple[list[SourceConfig], Optional[str], int]:
    """(sources, tokenizer path, max_document_bytes) from --config (its data.train) and --input."""
    sources: list[SourceConfig] = []
    tokenizer = args.tokenizer
    max_doc = args.max_document_bytes
    if args.config:
        from albert_dist.config import load_config
        from albert_dist.apps.pretrain.init_from import read_source

        cfg = load_config(args.config, args.overrides, read_source)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``albert-dist data prepare ...`` and ``albert-dist data plan ...`` (`add_prepare_arguments`,
    `add_slots_arguments`)."""
    sub = parser.add_subparsers(dest="subcommand", metavar="{prepare,plan}")
    add_prepare_arguments(sub.add_parser(
        "prepare", help="reshard corpora into deduplicated parquet shards with a manifest",
        description="Reshard raw corpora into deduplicated parquet shards sized for a cluster, with a manifest "
                    "(docs/data-prepare.md)."))
    add_slots_arguments(sub.add_parser(
        "plan", help="what every slot of a job would read, from metadata",
        description="What every slot (rank x loader worker) of a job would read, from metadata: pieces, bytes "
                    "per slot, read amplification."))


def run(args: argparse.Namespace) -> int:
    """Run the sub-command `args` names: 0 done; a `ValueError`/`OSError` for bad input (exit 2)."""
    return prepare(args) if args.subcommand == "prepare" else show_slots(args)


def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    """The ``albert-dist data prepare`` arguments (defaults from albert_dist.data.prepare.options)."""
    from albert_dist.data.prepare import options

    # several paths per --input (extend): an unquoted glob the shell expanded (`--input /x/*.jsonl.zst`) is
    # every file it matched, as `tokenizer train --input` takes it, not one input plus "overrides"
    p.add_argument("--input", nargs="+", action="extend", metavar="PATH",
                   help="files, directories or globs (txt/jsonl/parquet, optionally .gz/.zst); repeatable")
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
    p.add_argument("--target-ranks", type=int, default=options.DEFAULT_TARGET_RANKS,
                   help=f"largest job (ranks) the output is sized for (default {options.DEFAULT_TARGET_RANKS})")
    p.add_argument("--target-loader-workers", type=int, default=options.DEFAULT_TARGET_LOADER_WORKERS,
                   help=f"its data.num_workers (default {options.DEFAULT_TARGET_LOADER_WORKERS})")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    p.add_argument("--workers", type=int, default=max(1, cores), help="processes (default: the usable CPU cores)")
    p.add_argument("--keep-duplicates", action="store_true", help="keep exact-duplicate documents")
    p.add_argument("--dedup-memory", type=parse_byte_size, default=options.DEFAULT_DEDUP_MEMORY_BYTES,
                   help="memory for the duplicate search (default 1G; above it hashes are bucketed on disk)")
    p.add_argument("--max-document-bytes", type=parse_byte_size, default=None,
                   help="longer documents are skipped and counted (default: the recipe's, else 4M)")
    p.add_argument("--tokenizer", help="spiece.model for the token estimate (default: the recipe's, else the "
                                       "bundled one); 'none' to skip it")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier prepare output in --output")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal)")


def summary(manifest: dict, out: str) -> str:
    """What `prepare` prints when done: sizes, counts, how many slots read it without amplification, the recipe."""
    tokens = manifest.get("tokens_estimate")
    dd = manifest["dedup"]
    sizing = manifest["sizing"]
    return "\n".join([
        f"wrote {manifest['num_shards']} shards, {manifest['row_groups']} row groups of ~"
        f"{fmt_bytes(manifest['row_group_bytes'])} to {out} in {manifest['seconds']['total']:.1f} s",
        f"  {manifest['documents']:,} documents, {fmt_bytes(manifest['bytes'])} of text"
        + (f", ~{tokens:,} tokens" if tokens else "")
        + f"; {dd['duplicates_dropped']:,} duplicates dropped" + ("" if dd["enabled"] else " (dedup off)")
        + f"; skipped {manifest['skipped'] or 'nothing'}",
        f"  jobs of up to {manifest['row_groups']:,} slots (ranks x data.num_workers) read each byte once per epoch; "
        f"{manifest['row_groups'] / sizing['target_slots']:.3g} row groups per slot at {sizing['target_ranks']} "
        f"ranks x {sizing['target_loader_workers']} workers",
        f"  train on it: data.train: [{{paths: [\"{out}/*.parquet\"]}}]",
    ])


def prepare(args: argparse.Namespace) -> int:
    """``albert-dist data prepare ...``: 0 done (or already complete).

    Raises:
        ValueError, OSError: bad arguments or input (naming the flag, file or field).
    """
    from albert_dist.data.prepare.options import PrepareOptions
    from albert_dist.data.prepare.run import AlreadyComplete, prepare as run_prepare
    from albert_dist.job.console import configure_logging

    configure_logging(replace=False)
    command = "albert-dist " + shlex.join(args.command_line)  # recorded in the manifest
    sources, tokenizer, max_doc = _sources_from_args(args)
    opts = PrepareOptions(
        sources=sources, output=args.output, num_shards=args.num_shards, shard_bytes=args.shard_bytes,
        row_group_bytes=args.row_group_bytes, target_ranks=args.target_ranks,
        target_loader_workers=args.target_loader_workers, workers=args.workers, dedup=not args.keep_duplicates,
        dedup_memory_bytes=args.dedup_memory, max_document_bytes=max_doc,
        tokenizer_path=None if (tokenizer or "").lower() == "none" else (tokenizer or DataConfig.tokenizer_path),
        overwrite=args.overwrite, progress=args.progress)
    try:
        manifest = run_prepare(opts, command)
    except AlreadyComplete as done:
        print(f"albert-dist data prepare: {done}")
        return EXIT_OK
    shown = args.output if "://" in args.output else str(Path(args.output).expanduser().resolve())
    print(summary(manifest, shown))
    return EXIT_OK


def add_slots_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``albert-dist data plan`` arguments."""
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--ranks", type=int, required=True, help="world size of the job (GPUs)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader workers per rank (default: the recipe's data.num_workers)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, as for train")


def show_slots(args: argparse.Namespace) -> int:
    """``albert-dist data plan``: the job's slot plan from metadata (`albert_dist.data.sources.pieces`); 0.

    Raises:
        ValueError, OSError: naming the file or field of bad input.
    """
    from albert_dist.config import load_config
    from albert_dist.apps.pretrain.init_from import read_source
    from albert_dist.data.sources.pieces import job_sources

    cfg = load_config(args.config, args.overrides, read_source)
    workers = cfg.data.num_workers if args.workers is None else args.workers
    plans = job_sources(cfg.data, args.ranks, workers)
    if args.json:
        print(json.dumps({"ranks": args.ranks, "workers": workers, "sources": [p.as_dict() for p in plans]}, indent=2))
    else:
        print(format_slots(plans, args.ranks, workers))
    return EXIT_OK


def format_slots(plans: list, ranks: int, workers: int) -> str:
    """The human-readable report ``albert-dist data plan`` prints for ``plans`` (`albert_dist.data.sources.pieces.SourceSlots`
    of each training source at ``ranks`` x max(1, ``workers``) slots)."""
    from albert_dist.data.sources.pieces import AMPLIFICATION_LIMIT, advice

    slots = ranks * max(1, workers)
    out = [f"{ranks} ranks x {max(1, workers)} workers = {slots} slots (slot = rank x workers + worker)"]
    for p in plans:
        out.append("")
        if p.hub:
            out.append(f"{p.where}: hub dataset {p.paths[0]}: streamed, its shards split by datasets over "
                       f"{slots} slots (no local metadata to plan)")
            continue
        skipped = ", ".join(s for s in (f"{p.empty_files} empty" if p.empty_files else "",
                                        f"{p.damaged_files} damaged (skipped)" if p.damaged_files else "") if s)
        out.append(f"{p.where}: {' '.join(p.paths)}: {p.files} files{f' ({skipped})' if skipped else ''}, "
                   f"{fmt_bytes(p.bytes)}, {p.compressed_files} compressed")
        how = (f"byte ranges of {fmt_bytes(p.piece_bytes)} for uncompressed txt/jsonl"
               if p.pieces > p.compressed_files else "one per compressed file")
        out.append(f"  pieces: {p.pieces} ({how}; parquet: one per row group)")
        if p.pieces and p.pieces < slots:
            out.append(f"  fewer pieces than slots: each piece is read whole by {p.readers_per_piece[0]}-"
                       f"{p.readers_per_piece[1]} slots, each keeping its share of the records")
        lo, mean, hi = p.pieces_per_slot
        out.append(f"  pieces per slot: min {lo} / mean {mean:.2f} / max {hi}")
        lo, mean, hi = p.bytes_per_slot
        out.append(f"  bytes read per slot per epoch: min {fmt_bytes(lo)} / mean {fmt_bytes(mean)} / max {fmt_bytes(hi)}")
        out.append(f"  read amplification: {p.amplification:.2f}"
                   + ("" if p.amplification <= AMPLIFICATION_LIMIT else
                      f" (above {AMPLIFICATION_LIMIT}: the loader says so at start)"))
        if p.documents is not None:
            tokens = f", about {p.tokens:,} tokens" if p.tokens is not None else ""
            out.append(f"  per epoch: {p.documents:,} documents{tokens} (from {p.manifest})")
        else:
            out.append(f"  documents per epoch: unknown ({p.manifest})")
        if p.amplified:
            out.append(f"  {advice(p)}")
    total = sum(p.bytes for p in plans if not p.hub)
    if total:
        amp = sum(p.bytes * p.amplification for p in plans if not p.hub) / total
        out.append("")
        out.append(f"all file sources (local or object store; hub datasets aside): {fmt_bytes(total)}, read amplification {amp:.2f}")
    return "\n".join(out)
