"""Piece planning, once for every caller: which pieces a source is cut into for a job's slots, and what that costs.

The training loader (`albert_dist.data.loader`), the preflight (`albert_dist.apps.pretrain.preflight.check_inputs`) and
``albert-dist data plan`` (front end and report: `albert_dist.cli.data`) all plan a local source through
`source_pieces`: find its files, each described once (`albert_dist.data.sources.discover.find_files`) -> check
its text field (`albert_dist.data.sources.read.check_text_field`) -> plan its pieces
(`albert_dist.data.sources.discover.cut_pieces`) -> refuse a source of only empty or damaged files. The preflight then probes each slot's share for a usable record
(`check_slots_readable`) and hands the plan to the loader (`albert_dist.apps.pretrain.preflight.JobPlan.train_pieces`).

The figures of a plan (`SourceSlots`, `summarize_pieces`, `job_sources`): from metadata alone, no process group and
no reading beyond file sizes and parquet footers (plus the first 16 records of one jsonl file per source for
the text-field check); and the slot assignment the loader uses (`albert_dist.data.sources.discover.slot_shares`), so the
figures are the job's. Per training source: the pieces, pieces and bytes read per slot (min / mean / max), the
read amplification (bytes all slots read in one epoch each over the source's bytes; 1.0 = every byte once), the
documents (and tokens) per epoch when a ``manifest.json`` of ``albert-dist data prepare`` lies beside the files,
and, when a source would be read more than `AMPLIFICATION_LIMIT` times per epoch, the ``albert-dist data prepare``
command that rewrites it into enough pieces (`advice`).

The same figures feed the one warning the training loader logs before the first step when a job reads a
corpus more than `AMPLIFICATION_LIMIT` times per epoch (`amplification_warning`): it warns rather than refuses,
since a small corpus read a few times per epoch costs less than one step and refusing would block experiments.

Manifest (``manifest.json`` in the directory that holds a source's files, written by ``albert-dist data
prepare``): read tolerantly; the fields used are ``documents`` (int), ``bytes`` (int), ``files`` (a list of file
names relative to the manifest, or of objects with ``path``/``name``/``file`` and optionally ``documents``,
``tokens``, ``bytes``), and ``tokens`` or ``tokens_estimate`` (int). A manifest whose files are not exactly the
source's is used for the files it describes per file, and otherwise ignored (with the reason printed).

An object store's requests are retried under the policy the caller hands in (``retry``:
`albert_dist.data.sources.store.RetryPolicy`; `job_sources` makes it from ``data.store_retry_s``).
"""
from __future__ import annotations

import json
import os
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.sources.read import ReadBudget, check_text_field, read_piece
from albert_dist.data.sources import store
from albert_dist.data.sources.store import DEFAULT_RETRY, RetryPolicy
from albert_dist.data.sources.hub import check_hub_source
from albert_dist.data.sources.discover import (MIN_PIECE_BYTES, cut_pieces, find_files, read_amplification,
                                               readers_per_piece, slot_shares)
from albert_dist.sizes import fmt_bytes

#: Reading a source more than this many times per epoch prints the `prepare` command (plan) or warns (loader).
AMPLIFICATION_LIMIT = 1.5
MANIFEST_NAME = "manifest.json"

#: `check_slots_readable`: bytes of records a slot's probe reads before it takes the slot for readable (a slot
#: whose first MiB is all skips is still probably data with long bad stretches, not garbage: it is let through)
PROBE_BYTES_PER_SLOT = 1 << 20
#: `check_slots_readable`: too-long records (each more than max_document_bytes) a slot's probe may read through
#: before it refuses a slot that saw nothing else (a stretch of a few overlong documents before good ones passes).
#: 8, not 2: a corpus with 5% overlong documents has 3 in a row at one of 1,024 slots' starts 12% of the time,
#: 8 in a row ~4e-8; only a refused slot reads this far (1 MiB + 8 x 4 MiB at the defaults), and the first one ends
#: the check
PROBE_TOO_LONG_RECORDS = 8
#: jobs with more slots than this are not probed (one small read per slot; at 1,024 x 8 slots the reads would
#: delay the start more than a rare bad slot costs)
PROBE_MAX_SLOTS = 1024


# ---------------------------------------------------------------------------------------------------- planning
def source_pieces(source: SourceConfig, where: str, shard_piece_bytes: int, slots: int = 1,
                  require_pieces: bool = True,
                  retry: RetryPolicy = DEFAULT_RETRY) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The checked piece plan of a local (or object-store) source for a job of ``slots`` slots (slot = rank x
    max(1, num_workers) + worker), the one implementation every caller shares: its files found
    and described once (`albert_dist.data.sources.discover.find_files`: the records handed to both steps below),
    its text field checked on the first records of one file
    (`albert_dist.data.sources.read.check_text_field`), its pieces planned from metadata
    (`albert_dist.data.sources.discover.cut_pieces`: byte ranges of uncompressed txt/jsonl sized for ``slots`` and capped at
    ``shard_piece_bytes`` bytes, one piece per parquet row group or compressed file). An object store's
    requests are retried under ``retry``.

    Returns ``(pieces, stats)``: the pieces in plan order (dicts of `cut_pieces`: ``path``, ``start``, ``end``,
    ``row_group``, ``nbytes``, ``kind``, ``compression``, ...) and cut_pieces' counters (``files``, ``bytes``,
    ``empty_files``, ``damaged_files``, ``piece_bytes``).

    Raises:
        ValueError: naming ``where`` for a missing path, an empty glob, a missing text field, an unknown format,
            or (``require_pieces``) a source that holds only empty or damaged files.
    """
    files = find_files(source, where, retry)
    check_text_field(source, where, files)
    pieces, stats = cut_pieces(source, where, shard_piece_bytes, slots, files)
    if not pieces and require_pieces:
        raise ValueError(f"{where}: {source.paths!r} holds only empty or damaged files "
                         f"({stats['files']} files: {stats['empty_files']} empty, {stats['damaged_files']} "
                         "damaged)")
    return pieces, stats


def pieces_of(source: SourceConfig, where: str, shard_piece_bytes: int, slots: int = 1,
              require_pieces: bool = True, retry: RetryPolicy = DEFAULT_RETRY) -> list[dict[str, Any]]:
    """The pieces of `source_pieces` (what the loader's streams read). Raises as it does."""
    return source_pieces(source, where, shard_piece_bytes, slots, require_pieces, retry)[0]


def check_slots_readable(source: SourceConfig, where: str, pieces: list[dict], slots: int,
                         max_document_bytes: int, retry: RetryPolicy = DEFAULT_RETRY) -> None:
    """Refuse a job in which some slot's share holds only unusable records (a random-bytes ``.jsonl`` whose
    byte ranges fill one slot beside one good file: that slot would fail its first epoch at the first step, and
    every resume again), or begins with nothing but records longer than ``max_document_bytes`` (a ``.txt`` that
    is one 10 MB document, a ``.jsonl`` of whole books), before any process group.

    Each slot reads its share (`albert_dist.data.sources.discover.slot_shares`) until its first usable record; a healthy
    slot costs one small read. Other skips count by their bytes: after `PROBE_BYTES_PER_SLOT` of them the slot
    is let through (undecided: the stream counts and logs its skips). Too-long records do not (the bytes of one
    say nothing about the records after it): the slot reads on, but at most `probe_read_bytes` in all (a 10 GB
    one-line file is not read to its end), and a slot that reaches that bound with nothing usable is refused.
    Skipped when ``slots`` exceeds `PROBE_MAX_SLOTS`. An object's reads are retried under ``retry``.

    Raises:
        ValueError: naming ``where``, the slot and its files, with the skip counts (and, for too-long records,
            ``data.max_document_bytes``).
    """
    if slots > PROBE_MAX_SLOTS or not pieces:
        return
    no_record: Optional[str] = None
    for slot in range(slots):
        refused, skipped, files, nbytes = _probe_slot(source, pieces, slots, slot, max_document_bytes, retry)
        if not refused:
            continue
        named = f"{', '.join(files[:3])}{', ...' if len(files) > 3 else ''}"
        head = f"{where}: slot {slot} of {slots} (ranks x loader workers)"
        too_long = f"data.max_document_bytes={max_document_bytes}"
        if skipped and set(skipped) == {"too_long"}:
            # the bytes read can exceed the share (each piece inside a long record reads on to its end): say what
            # part of the share the verdict covers
            share = sum(pieces[i]["nbytes"] / k for i, k, _ in slot_shares(len(pieces), slots, slot))
            span = (f"that begins in its share ({fmt_bytes(share)})" if nbytes >= share else
                    f"in the first {fmt_bytes(nbytes)} of its share ({fmt_bytes(share)})")
            raise ValueError(
                f"{head} would read no usable record from {named}: every record {span} is longer than "
                f"{too_long} (skipped {dict(skipped)}); raise data.max_document_bytes, or split the documents "
                "(.txt: blank lines between documents)")
        if skipped:
            raise ValueError(
                f"{head} would read only unusable records from {named} (skipped {dict(skipped)}"
                f"{f'; too_long: longer than {too_long}' if 'too_long' in skipped else ''}); remove or fix the "
                "file, or run albert-dist data prepare, which drops unusable records")
        if no_record is None:
            # its pieces lie inside longer records; the slot that reads where such a record begins can say why
            # (too long), so another slot's refusal is preferred, and this one is raised only when none has one
            no_record = (f"{head} would read no record from {named}: none begins in the {fmt_bytes(nbytes)} it "
                         f"read of its {len(slot_shares(len(pieces), slots, slot))} piece(s), which lie inside "
                         f"longer records (skipped {{}}); split the documents (longer than {too_long} they are "
                         "skipped), or run fewer ranks x loader workers")
    if no_record is not None:
        raise ValueError(no_record)


def probe_read_bytes(max_document_bytes: int) -> int:
    """The most bytes `check_slots_readable` reads of one slot's share: the undecided budget of other skips
    (`PROBE_BYTES_PER_SLOT`) and `PROBE_TOO_LONG_RECORDS` too-long records (each at least max_document_bytes + 1)."""
    return PROBE_BYTES_PER_SLOT + PROBE_TOO_LONG_RECORDS * (max_document_bytes + 1)


def _probe_slot(source: SourceConfig, pieces: list[dict], slots: int, slot: int, max_document_bytes: int,
                retry: RetryPolicy) -> tuple[bool, Counter, list[str], int]:
    """`check_slots_readable` for one slot: ``(refused, skip counts, files read, bytes read)``. Not refused: a
    usable record, or `PROBE_BYTES_PER_SLOT` of skips other than too_long (undecided). Refused: the share read to
    its end, or `probe_read_bytes` read (a too-long record's bytes, pieces inside a record), with neither."""
    limit = probe_read_bytes(max_document_bytes)
    budget = ReadBudget(limit)
    skipped: Counter = Counter()
    files: list[str] = []
    other_bytes = skipped_bytes = 0

    def read() -> int:
        return max(limit - budget.left, skipped_bytes)

    def take(rec: dict) -> Optional[bool]:
        """The verdict a record settles (False: let through), or None to read on."""
        nonlocal other_bytes, skipped_bytes
        if not rec["skip"]:
            return False
        skipped[rec["skip"]] += 1
        skipped_bytes += rec["nbytes"]
        if rec["skip"] != "too_long":
            other_bytes += rec["nbytes"]
            if other_bytes >= PROBE_BYTES_PER_SLOT:
                return False
        return True if skipped_bytes >= limit else None  # parquet rows, which the budget does not bound

    for i, k, j in slot_shares(len(pieces), slots, slot):
        piece = pieces[i]
        files += [piece["path"]] if piece["path"] not in files else []
        records = read_piece(piece, source.text_field, source.txt_documents, max_document_bytes, (k, j), budget,
                             retry)
        cut: list[dict] = []  # records handed out after the budget ran out: the last one is cut short
        try:
            for rec in records:
                if budget.spent:
                    cut.append(rec)
                elif (verdict := take(rec)) is not None:
                    return verdict, skipped, files, read()
        finally:
            records.close()
        for rec in cut[:-1]:
            if (verdict := take(rec)) is not None:
                return verdict, skipped, files, read()
        if cut and cut[-1]["skip"] == "too_long":  # already past max_document_bytes: too long, however it ends
            skipped["too_long"] += 1
        if budget.spent:
            return True, skipped, files, read()
    return True, skipped, files, read()


# ---------------------------------------------------------------------------------------------------- figures


def slot_table(nbytes: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slot, ``(pieces it reads, bytes it reads in one epoch)``, both (num_slots,) int64, for pieces of
    sizes ``nbytes`` (plan order) under `albert_dist.data.sources.discover.slot_shares` (vectorised: 8192 slots x 100k
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
class SourceSlots:
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
                     stats: Optional[dict] = None, manifest: bool = True,
                     retry: RetryPolicy = DEFAULT_RETRY) -> SourceSlots:
    """The `SourceSlots` of a source's planned ``pieces`` (`albert_dist.data.sources.discover.cut_pieces`) at ``slots``
    slots; ``stats``: cut_pieces' counters (without them, files and bytes are counted from the pieces);
    ``manifest``: look for a manifest.json beside the files (an object read under ``retry``)."""
    stats = stats if stats is not None else {"files": len({p["path"] for p in pieces}),
                                             "bytes": sum(p["nbytes"] for p in pieces)}
    plan = SourceSlots(where, list(source.paths), slots, files=stats.get("files", 0), bytes=stats.get("bytes", 0),
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
        _apply_manifest(plan, pieces, retry)
    return plan


def source_slots(source: SourceConfig, where: str, shard_piece_bytes: int, slots: int,
                 retry: RetryPolicy = DEFAULT_RETRY) -> SourceSlots:
    """The `SourceSlots` of one source for ``slots`` slots (`source_pieces`, then `summarize_pieces` with the
    manifest; an object store read under ``retry``); a hub source, once resolved
    (`albert_dist.data.sources.hub.check_hub_source`), gets an empty plan marked ``hub``. Raises ValueError as
    `source_pieces` and `check_hub_source` do."""
    if source.format == "hub":
        t0 = time.perf_counter()
        check_hub_source(source, where)
        return SourceSlots(where, list(source.paths), slots, hub=True, plan_s=time.perf_counter() - t0)
    t0 = time.perf_counter()
    pieces, stats = source_pieces(source, where, shard_piece_bytes, slots, retry=retry)
    plan = summarize_pieces(source, where, slots, pieces, stats, retry=retry)
    plan.plan_s = time.perf_counter() - t0
    return plan


def job_sources(cfg: DataConfig, ranks: int, workers: int) -> list[SourceSlots]:
    """`source_slots` for every training source of ``cfg`` at ``ranks`` x max(1, ``workers``) slots, an object
    store read under ``cfg.store_retry_s``."""
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    if workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")
    slots = ranks * max(1, workers)
    retry = RetryPolicy(budget_s=cfg.store_retry_s)
    plans = [source_slots(src, f"data.train[{i}]", cfg.shard_piece_bytes, slots, retry)
             for i, src in enumerate(cfg.train)]
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


def _apply_manifest(plan: SourceSlots, pieces: list[dict], retry: RetryPolicy) -> None:
    """Fill ``documents``/``tokens``/``manifest`` of ``plan`` from a manifest.json beside the source's files."""
    paths = sorted({p["path"] for p in pieces})
    if not paths:
        return
    folder = store.common_folder(paths)
    path = store.join(folder, MANIFEST_NAME)
    try:
        text = store.read_text(path, retry)
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
def prepared_dir(plan: SourceSlots) -> str:
    """A suggested output directory for `prepare_command`: ``<folder of the source's files>-prepared``."""
    files = sorted({p["path"] for p in plan.piece_list})
    folder = os.path.commonpath([os.path.dirname(p) for p in files]) if files else "corpus"
    return folder.rstrip("/") + "-prepared"


def prepare_command(plan: SourceSlots) -> str:
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


def _why(p: SourceSlots) -> str:
    pieces = (f"{p.pieces} pieces ({p.compressed_files} compressed files, which cannot be split) for {p.slots} slots"
              if p.compressed_files else f"{p.pieces} pieces for {p.slots} slots")
    return (f"{pieces}: each piece is read whole by up to {p.readers_per_piece[1]} slots that keep 1 record in "
            f"{p.readers_per_piece[1]}")


def advice(p: SourceSlots) -> str:
    """What to do about an amplified source: the `prepare_command`, or why none helps (a source too small)."""
    if p.needs_prepare:
        return f"to read it once: {prepare_command(p)}"
    return (f"it is under {fmt_bytes(MIN_PIECE_BYTES)} per slot, too small to give {p.slots} slots a piece each; "
            f"reading it {p.amplification:.1f} times costs {fmt_bytes(p.bytes * p.amplification)} per epoch in all "
            "(fewer workers, or a larger corpus, read it once)")


def amplification_warning(plans: list[SourceSlots]) -> Optional[str]:
    """The loader's warning text when some source is read more than `AMPLIFICATION_LIMIT` times per epoch (the
    figure, why, and the `prepare_command` or why none helps); None when every source reads about once."""
    lines = [f"{p.where}: every epoch reads its {fmt_bytes(p.bytes)} {p.amplification:.1f} times ({_why(p)}); {advice(p)}"
             for p in plans if p.amplified]
    return "read amplification: " + " | ".join(lines) if lines else None
