"""`albert-dist data plan`: what every slot of a job would read, from metadata alone, and the read amplification.

    albert-dist data plan --config configs/pretrain/<recipe>.yaml --ranks 1024 [--workers 8] [key=value ...] [--json]

The command line (the recipe, exit codes) is the app's, `albert_dist.cli.data`; this module is the
work: `plan_data(DataConfig, ranks, workers)` and `format_plan`.

No process group and no reading beyond metadata: file sizes and parquet footers (`albert_dist.data.paths.
plan_pieces`), plus the first 16 records of one jsonl file per source for the text-field check `albert-dist
train` makes; and the slot assignment the loader uses (`albert_dist.data.paths.slot_shares`), so the figures
are the job's.
Per training source it prints the pieces, pieces and bytes read per slot (min / mean / max), the read
amplification (bytes all slots read in one epoch each over the source's bytes; 1.0 = every byte once), the
documents (and tokens) per epoch when a ``manifest.json`` of ``albert-dist data prepare`` lies beside the files,
and, when a source would be read more than `AMPLIFICATION_LIMIT` times per epoch, the ``albert-dist data prepare``
command that rewrites it into enough pieces.

The same figures feed the one warning the training loader logs before the first step when a job reads a
corpus more than `AMPLIFICATION_LIMIT` times per epoch (`amplification_warning`): it warns rather than refuses,
since a small corpus read a few times per epoch costs less than one step and refusing would block experiments.

Manifest (``manifest.json`` in the directory that holds a source's files, written by ``albert-dist data
prepare``): read tolerantly; the fields used are ``documents`` (int), ``bytes`` (int), ``files`` (a list of file
names relative to the manifest, or of objects with ``path``/``name``/``file`` and optionally ``documents``,
``tokens``, ``bytes``), and ``tokens`` or ``tokens_estimate`` (int). A manifest whose files are not exactly the
source's is used for the files it describes per file, and otherwise ignored (with the reason printed).
"""
from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.files import check_text_field
from albert_dist.data import store
from albert_dist.data.paths import (MIN_PIECE_BYTES, discover_files, plan_pieces, read_amplification,
                                    readers_per_piece)
from albert_dist.data.sizes import fmt_bytes

#: Reading a source more than this many times per epoch prints the `prepare` command (plan) or warns (loader).
AMPLIFICATION_LIMIT = 1.5
MANIFEST_NAME = "manifest.json"


def slot_table(nbytes: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slot, ``(pieces it reads, bytes it reads in one epoch)``, both (num_slots,) int64, for pieces of
    sizes ``nbytes`` (plan order) under `albert_dist.data.paths.slot_shares` (vectorised: 8192 slots x 100k
    pieces in milliseconds)."""
    nbytes = np.asarray(nbytes, dtype=np.int64)
    num_pieces = len(nbytes)
    if num_pieces >= num_slots:
        owner = np.arange(num_pieces) % num_slots
        return (np.bincount(owner, minlength=num_slots).astype(np.int64),
                np.bincount(owner, weights=nbytes, minlength=num_slots).astype(np.int64))
    shared = nbytes[np.arange(num_slots) % num_pieces]  # slot s reads piece s mod pieces, whole
    return np.ones(num_slots, dtype=np.int64), shared


@dataclass
class SourcePlan:
    """The plan of one training source for a job of ``slots`` slots (see the module docstring)."""

    where: str
    paths: list[str]
    slots: int
    ranks: int = 0
    """ranks and workers per rank of the job (slots = ranks x max(1, workers)); 0 when only slots are known"""
    workers: int = 0
    weight: float = 1.0
    only_source: bool = False
    """the recipe's only training source (the advice can then be one override)"""
    hub: bool = False
    files: int = 0
    bytes: int = 0
    empty_files: int = 0
    damaged_files: int = 0
    compressed_files: int = 0
    pieces: int = 0
    piece_bytes: int = 0
    pieces_per_slot: tuple[int, float, int] = (0, 0.0, 0)
    bytes_per_slot: tuple[int, float, int] = (0, 0.0, 0)
    readers_per_piece: tuple[int, int] = (1, 1)
    amplification: float = 1.0
    documents: Optional[int] = None
    tokens: Optional[int] = None
    manifest: str = ""
    plan_s: float = 0.0
    piece_list: list[dict] = field(default_factory=list, repr=False)

    @property
    def amplified(self) -> bool:
        """Read more than `AMPLIFICATION_LIMIT` times per epoch."""
        return not self.hub and self.amplification > AMPLIFICATION_LIMIT

    @property
    def too_small(self) -> bool:
        """Under `MIN_PIECE_BYTES` per slot: no rewrite gives every slot a piece of its own (nor is it worth it)."""
        return self.bytes < MIN_PIECE_BYTES * self.slots

    @property
    def needs_prepare(self) -> bool:
        """Amplified, and big enough that `albert-dist data prepare` can cut it into a few pieces per slot."""
        return self.amplified and not self.too_small

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "piece_list"}
        out["needs_prepare"] = self.needs_prepare
        out["prepare_command"] = prepare_command(self) if self.needs_prepare else None
        return out


def _stats(values: np.ndarray) -> tuple[int, float, int]:
    return int(values.min()), float(values.mean()), int(values.max())


def summarize_pieces(source: SourceConfig, where: str, slots: int, pieces: list[dict],
                     stats: Optional[dict] = None, manifest: bool = True) -> SourcePlan:
    """The `SourcePlan` of a source's planned ``pieces`` (`albert_dist.data.paths.plan_pieces`) at ``slots``
    slots; ``stats``: plan_pieces' counters (without them, files and bytes are counted from the pieces);
    ``manifest``: look for a manifest.json beside the files."""
    stats = stats if stats is not None else {"files": len({p["path"] for p in pieces}),
                                             "bytes": sum(p["nbytes"] for p in pieces)}
    plan = SourcePlan(where, list(source.paths), slots, files=stats.get("files", 0), bytes=stats.get("bytes", 0),
                      empty_files=stats.get("empty_files", 0), damaged_files=stats.get("damaged_files", 0),
                      pieces=len(pieces), piece_bytes=stats.get("piece_bytes", 0), piece_list=pieces)
    plan.compressed_files = len({p["path"] for p in pieces if p["compression"]})
    if pieces:
        nbytes = np.fromiter((p["nbytes"] for p in pieces), dtype=np.int64, count=len(pieces))
        per_slot, bytes_per_slot = slot_table(nbytes, slots)
        plan.pieces_per_slot, plan.bytes_per_slot = _stats(per_slot), _stats(bytes_per_slot)
        readers = readers_per_piece(len(pieces), slots)
        plan.readers_per_piece = (int(readers.min()), int(readers.max()))
        plan.amplification = read_amplification(nbytes, slots)
    if manifest:
        _apply_manifest(plan, pieces)
    return plan


def plan_source_slots(source: SourceConfig, where: str, shard_piece_bytes: int, slots: int) -> SourcePlan:
    """Plan one source for ``slots`` slots from metadata (file sizes, parquet footers) and the text-field check
    of `albert_dist.data.files.check_text_field` (the first records of one file). Raises ValueError as
    `albert_dist.data.stream.plan_source` does (missing paths, wrong text field, only empty/damaged files)."""
    if source.format == "hub":
        return SourcePlan(where, list(source.paths), slots, hub=True)
    t0 = time.perf_counter()
    files = discover_files(source, where)
    check_text_field(source, where, files)  # the first records of one file (a parquet schema): what train checks
    pieces, stats = plan_pieces(source, where, shard_piece_bytes, slots, files)
    if not pieces:  # the loader refuses it too (albert_dist.data.stream.plan_source)
        raise ValueError(f"{where}: {source.paths!r} holds only empty or damaged files ({stats['files']} files: "
                         f"{stats['empty_files']} empty, {stats['damaged_files']} damaged)")
    plan = summarize_pieces(source, where, slots, pieces, stats)
    plan.plan_s = time.perf_counter() - t0
    return plan


def plan_data(cfg: DataConfig, ranks: int, workers: int) -> list[SourcePlan]:
    """`plan_source_slots` for every training source of ``cfg`` at ``ranks`` x max(1, ``workers``) slots."""
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    if workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")
    slots = ranks * max(1, workers)
    plans = [plan_source_slots(src, f"data.train[{i}]", cfg.shard_piece_bytes, slots) for i, src in enumerate(cfg.train)]
    for plan, src in zip(plans, cfg.train):
        plan.ranks, plan.workers, plan.weight, plan.only_source = ranks, workers, src.weight, len(cfg.train) == 1
    return plans


# ---------------------------------------------------------------------------------------------------- manifest
def _manifest_files(manifest: dict) -> Optional[dict[str, dict]]:
    """Manifest file entries by name relative to the manifest: {name: {"documents"?, "tokens"?, "bytes"?}}."""
    files = manifest.get("files")
    if not isinstance(files, list):
        return None
    out: dict[str, dict] = {}
    for entry in files:
        if isinstance(entry, str):
            out[entry] = {}
        elif isinstance(entry, dict):
            name = next((entry[k] for k in ("path", "name", "file") if isinstance(entry.get(k), str)), None)
            if name is None:
                return None
            out[name] = entry
        else:
            return None
    return out


def _apply_manifest(plan: SourcePlan, pieces: list[dict]) -> None:
    """Fill ``documents``/``tokens``/``manifest`` of ``plan`` from a manifest.json beside the source's files."""
    paths = sorted({p["path"] for p in pieces})
    if not paths:
        return
    folder = store.common_folder(paths)
    path = store.join(folder, MANIFEST_NAME)
    try:
        text = store.read_text(path)
        if text is None:
            plan.manifest = f"no {MANIFEST_NAME} in {folder}"
            return
        manifest = json.loads(text)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        plan.manifest = f"{path} unreadable ({err})"
        return
    entries = _manifest_files(manifest)
    ours = {p[len(folder):].lstrip("/") if store.is_url(folder) else os.path.relpath(p, folder) for p in paths}
    tokens_total = next((manifest[k] for k in ("tokens", "tokens_estimate") if isinstance(manifest.get(k), int)), None)
    if entries is not None and set(entries) == ours or entries is None and manifest.get("files") == len(paths):
        plan.documents = manifest.get("documents") if isinstance(manifest.get("documents"), int) else None
        plan.tokens = tokens_total
        plan.manifest = str(path)
    elif entries is not None and ours <= set(entries) and all(isinstance(entries[n].get("documents"), int) for n in ours):
        plan.documents = sum(entries[n]["documents"] for n in ours)
        if all(isinstance(entries[n].get("tokens"), int) for n in ours):
            plan.tokens = sum(entries[n]["tokens"] for n in ours)
        plan.manifest = f"{path} ({len(ours)} of its {len(entries)} files)"
    else:
        plan.manifest = f"{path} does not list exactly this source's {len(paths)} files; not used"


# ---------------------------------------------------------------------------------------------------- advice
def prepared_dir(plan: SourcePlan) -> str:
    """A suggested output directory for `prepare_command`: ``<folder of the source's files>-prepared``."""
    files = sorted({p["path"] for p in plan.piece_list})
    folder = os.path.commonpath([os.path.dirname(p) for p in files]) if files else "corpus"
    return folder.rstrip("/") + "-prepared"


def prepare_command(plan: SourcePlan) -> str:
    """The ``albert-dist data prepare`` command that rewrites ``plan``'s source into parquet shards with enough
    row groups for the job (``--target-ranks``/``--target-loader-workers``: its ranks and workers, or its slots
    as ranks x 1 when only those are known), and how to train on them."""
    inputs = " ".join(f"--input {shlex.quote(p)}" for p in plan.paths)
    out = prepared_dir(plan)
    ranks, workers = (plan.ranks, max(1, plan.workers)) if plan.ranks else (plan.slots, 1)
    shards = shlex.quote(f"{out}/*.parquet")
    source = f"{{paths: [{shards}]" + (f", weight: {plan.weight}" if plan.weight != 1.0 else "") + "}"
    then = (f"data.train=[{source}]" if plan.only_source else f"{plan.where} replaced by {source} in the recipe")
    return (f"albert-dist data prepare {inputs} --output {shlex.quote(out)} --target-ranks {ranks} "
            f"--target-loader-workers {workers}  # then train with {then}")


def _why(p: SourcePlan) -> str:
    pieces = (f"{p.pieces} pieces ({p.compressed_files} compressed files, which cannot be split) for {p.slots} slots"
              if p.compressed_files else f"{p.pieces} pieces for {p.slots} slots")
    return (f"{pieces}: each piece is read whole by up to {p.readers_per_piece[1]} slots that keep 1 record in "
            f"{p.readers_per_piece[1]}")


def advice(p: SourcePlan) -> str:
    """What to do about an amplified source: the `prepare_command`, or why none helps (a source too small)."""
    if p.needs_prepare:
        return f"to read it once: {prepare_command(p)}"
    return (f"it is under {fmt_bytes(MIN_PIECE_BYTES)} per slot, too small to give {p.slots} slots a piece each; "
            f"reading it {p.amplification:.1f} times costs {fmt_bytes(p.bytes * p.amplification)} per epoch in all "
            "(fewer workers, or a larger corpus, read it once)")


def amplification_warning(plans: list[SourcePlan]) -> Optional[str]:
    """The loader's warning text when some source is read more than `AMPLIFICATION_LIMIT` times per epoch (the
    figure, why, and the `prepare_command` or why none helps); None when every source reads about once."""
    lines = [f"{p.where}: every epoch reads its {fmt_bytes(p.bytes)} {p.amplification:.1f} times ({_why(p)}); {advice(p)}"
             for p in plans if p.amplified]
    return "read amplification: " + " | ".join(lines) if lines else None


# ---------------------------------------------------------------------------------------------------- report
def format_plan(plans: list[SourcePlan], ranks: int, workers: int) -> str:
    """The human-readable report ``albert-dist data plan`` prints."""
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
