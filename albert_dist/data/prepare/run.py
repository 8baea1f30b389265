"""`albert-dist data prepare`'s orchestrator: raw corpora -> deduplicated parquet shards sized for a cluster, plus
a manifest; the stages are the package's other modules (scan, dedup, write, tokens, publish; lock, pool).

    albert-dist data prepare --input '/corpora/pile/*.jsonl.zst' [--input more/ ...] --output /data/pile-prepared
    albert-dist data prepare --config configs/pretrain/<recipe>.yaml --output DIR   (the recipe's data.train)

The command line (arguments, the recipe, exit codes) is the app's: `albert_dist.cli.data`; this module is the
work, `prepare(PrepareOptions(...), command)` (`albert_dist.data.prepare.run`).

Why: a ``.gz``/``.zst`` file cannot be split, so a job with more slots (ranks x loader workers) than such files
reads some of them several times per epoch. The output is the format NVIDIA's LDDL and the HF Hub use: parquet
files of one ``text`` column (zstd), cut into row groups of a size chosen for the cluster, and the training
loader takes each row group as a piece (`albert_dist.data.sources.discover.cut_pieces`). With at least as many row
groups as slots every slot reads only its own row groups: each byte once per epoch.

Pipeline (every stage streams; nothing holds the corpus in memory):

1. *scan*, parallel over input pieces (``--workers`` processes; a compressed file is one piece, an uncompressed
   file is cut into `SCAN_PIECE_BYTES` byte ranges, a parquet file into runs of row groups): read the records
   as the training readers do (JSON lines a block at a time with pyarrow's JSON reader, the same records:
   `albert_dist.data.prepare.jsonl`), count skips by reason (with file and offset), write the usable documents
   to an uncompressed Arrow spool file and their 128-bit xxh3 hashes and byte lengths to a side file (24
   bytes/document). The work directory needs free space for the kept text, uncompressed (temporary).
2. *dedup*: exact duplicates (the same text after the reader's strip) are found from the hashes; the first
   occurrence in input order is kept, across all files and workers. Memory: `DEDUP_ROW_BYTES` (48) per
   document while that fits ``--dedup-memory`` (default 1 GiB: 22M documents); beyond that the hashes are
   partitioned on disk into buckets by hash value and each bucket is deduplicated alone, so peak memory stays
   ~``--dedup-memory`` at any corpus size (1 TB of 4 KB documents = 250M documents = 6 GB of temporary hash
   files, 13 buckets).
3. *write*, parallel over output shards: the kept documents, in input order, are cut into ``num_shards``
   contiguous shards of equal bytes and each shard into row groups of ``row_group_bytes`` of text; a scan
   task's spooled text is deleted once every shard that reads it is written (`_SpoolRelease`).
4. a token estimate (a byte-budgeted sample of the output encoded with the tokenizer), ``manifest.json``, and a
   rename of the finished directory to ``--output``.

Sizing (`shard_sizes`): ``row_group_bytes = clamp(text_bytes / (ROW_GROUPS_PER_SLOT x slots), MIN_ROW_GROUP_BYTES,
MAX_ROW_GROUP_BYTES)`` with slots = ``--target-ranks x --target-loader-workers`` (default 1,024 x 8), so any job
up to that size gets at least ROW_GROUPS_PER_SLOT row groups per slot once the corpus has ``4 x 8192 x 64 KiB
= 2 GiB`` of text; files hold `ROW_GROUPS_PER_SHARD` row groups (8 MiB to 512 MiB files) unless ``--num-shards``
or ``--shard-bytes`` says otherwise.

Safe to rerun and resumable: everything is written under ``<output>.prepare-tmp/`` and renamed to ``<output>``
when complete. A rerun with the same inputs and options resumes there (finished scan pieces and shards are
kept); a rerun on a complete output says so and exits 0; ``--overwrite`` replaces a previous prepare output
(only one: a directory without our manifest is never deleted). Deterministic: the same inputs and options give
byte-identical shards whatever ``--workers`` is (tested), so the manifest's checksums can be trusted.
One prepare per output at a time (`OutputLock`: a second is refused naming the holder).

Object stores: ``--input`` and ``--output`` may be fsspec URLs (``s3://``, ``gs://``; `albert_dist.data.sources.store`).
A URL output is built in a local work directory (`remote_work_root`) and uploaded when complete (`publish`: the
shards, then the manifest last), so a reader of the bucket never sees a manifest naming a missing shard.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from albert_dist.data.prepare.dedup import find_duplicates
from albert_dist.data.prepare.lock import LOCK_SUFFIX, OutputLock
from albert_dist.data.prepare.options import FORMAT_VERSION, PrepareOptions, shard_sizes
from albert_dist.data.prepare.pool import Workers
from albert_dist.data.prepare.publish import MANIFEST_NAME, load_manifest, publish, remote_work_root
from albert_dist.data.prepare.scan import SKIP_EXAMPLES, SPOOL_FORMAT, ScanTask, scan_tasks, read_hashes, scan_task
from albert_dist.data.prepare.tokens import estimate_tokens
from albert_dist.data.prepare.write import shard_slices, write_shard
from albert_dist.sizes import fmt_bytes, peak_rss_bytes

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".prepare-tmp"
#: Skips of each reason logged as warnings.
SKIP_WARNINGS = 3


class AlreadyComplete(Exception):
    """The output directory already holds this exact prepare's result (the message says so)."""


def prepare(opts: PrepareOptions, command: str) -> dict:
    """Run the whole pipeline (module docstring) and return the manifest written to ``<output>/manifest.json``.

    Raises:
        AlreadyComplete: ``opts.output`` holds a complete output of the same inputs and options.
        OutputBusy: another prepare is writing ``opts.output`` (`OutputLock`).
        ValueError: bad inputs (missing paths, unknown format, text field), an output directory that is not a
            prepare output, or one of another command without ``overwrite``; no usable document at all.
    """
    from albert_dist.data.sources import store

    t0 = time.time()
    remote = store.is_url(opts.output)
    url = opts.output.rstrip("/")
    # an object-store output is built in a local work directory and uploaded when complete (`publish`)
    out = remote_work_root(url) / "output" if remote else Path(opts.output).expanduser().resolve()
    if not remote:
        _refuse_output_inside_an_input(opts, out)
    lock_path = (out.parent.parent / (out.parent.name + ".lock")) if remote else out.parent / f".{out.name}{LOCK_SUFFIX}"
    lock = OutputLock(lock_path, url if remote else str(out)).acquire()
    try:
        return _prepare_locked(opts, command, t0, remote, url, out)
    finally:
        lock.release()


def _refuse_output_inside_an_input(opts: PrepareOptions, out: Path) -> None:
    """An output inside an input directory would be read as input by the next run (which then sees other inputs
    and refuses) and by a training source naming that directory (every document twice): refuse it up front.

    Raises:
        ValueError: naming the input directory and the output.
    """
    for i, source in enumerate(opts.sources):
        for raw in source.paths:
            p = Path(raw).expanduser()
            if p.is_dir() and out.is_relative_to(p.resolve()):
                raise ValueError(f"--output {out} lies inside the input directory {raw} (input[{i}]): a rerun, and "
                                 f"a training source of {raw}, would read the prepared shards as input; choose an "
                                 "output outside it")


def _prepare_locked(opts: PrepareOptions, command: str, t0: float, remote: bool, url: str, out: Path) -> dict:
    """`prepare` with the output's lock held."""
    from albert_dist.data.sources import store

    tasks, inputs, plan_skips = scan_tasks(opts.sources)
    if opts.tokenizer_path:  # used only for the token estimate at the end: a bad path must not cost the whole run
        from albert_dist.data.tokenizer import load_tokenizer

        load_tokenizer(opts.tokenizer_path)
    fingerprint = opts.fingerprint([{k: f[k] for k in ("path", "bytes", "mtime_ns")} for f in inputs])
    if remote:
        what, found = store.expand(url)
        out_exists, out_empty = what != "missing", not found
    else:
        out_exists = out.exists()
        out_empty = out_exists and out.is_dir() and not any(out.iterdir())
    shown = url if remote else out
    existing = load_manifest(url if remote else out) if out_exists else None
    if existing is not None and existing.get("fingerprint") == fingerprint and not opts.overwrite:
        raise AlreadyComplete(f"{shown} is already complete ({existing.get('documents')} documents in "
                              f"{existing.get('num_shards')} shards, same inputs and options); nothing to do")
    if out_exists:
        if existing is None and not out_empty:
            raise ValueError(f"--output {shown} exists and is not an albert-dist data prepare output (no "
                             f"{MANIFEST_NAME}); choose another directory, it is never deleted")
        if existing is not None and not opts.overwrite:
            raise ValueError(f"--output {shown} holds a prepare output of other inputs or options (its command: "
                             f"{existing.get('command')!r}); pass --overwrite to replace it, or choose another "
                             "directory")
    work = out.parent / (out.name + TMP_SUFFIX)
    state = {"fingerprint": fingerprint, "command": command, "spool_format": SPOOL_FORMAT}
    if work.exists():
        try:
            previous = json.loads((work / "state.json").read_text())
        except (OSError, ValueError):
            previous = {}
        # a work directory of another version's spool files (SPOOL_FORMAT) is not resumed either
        if (previous.get("fingerprint"), previous.get("spool_format")) != (fingerprint, SPOOL_FORMAT):
            logger.info("discarding %s: left by a run of another command (%s)", work, previous.get("command"))
            shutil.rmtree(work)
        else:
            logger.info("resuming the unfinished run in %s", work)
    spool, shards_dir = work / "spool", work / "output"
    spool.mkdir(parents=True, exist_ok=True)
    shards_dir.mkdir(parents=True, exist_ok=True)
    (work / "state.json").write_text(json.dumps(state))

    disk_bytes = sum(t.disk_bytes for t in tasks)
    logger.info("prepare: %d input files (%s on disk) in %d scan pieces, %d workers -> %s", len(inputs),
                fmt_bytes(disk_bytes), len(tasks), opts.workers, f"{url} (built in {out})" if remote else out)
    with Workers(opts.workers, opts.progress) as pool:
        manifest = _scan_dedup_write(opts, command, t0, work, tasks, inputs, plan_skips, fingerprint, pool)
    for e in manifest["files"]:
        (shards_dir / f".{e['path']}.json").unlink(missing_ok=True)
    (shards_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    if remote:
        publish(shards_dir, url, manifest, existing)
        shutil.rmtree(work.parent)
        return manifest
    if out.exists():  # --overwrite of an earlier prepare output (checked above): replaced only now it is ready
        shutil.rmtree(out)
    os.replace(shards_dir, out)
    shutil.rmtree(work)
    return manifest


def _scan_dedup_write(opts: PrepareOptions, command: str, t0: float, work: Path, tasks: list[ScanTask],
                      inputs: list[dict], plan_skips: list[dict], fingerprint: str, pool: Workers) -> dict:
    """Stages 1-3 and the manifest (see `prepare`)."""
    spool, shards_dir = work / "spool", work / "output"
    disk_bytes = sum(t.disk_bytes for t in tasks)
    t_scan = time.time()
    summaries = pool.map(scan_task, [(t, str(spool), opts.max_document_bytes) for t in tasks], disk_bytes, "scan")
    scan_s = time.time() - t_scan
    counts = [s["documents"] for s in summaries]
    hash_files = [spool / f"{t.index:06d}.hash" for t in tasks]
    skipped, examples = _tally_skips(plan_skips, summaries)

    t_dedup = time.time()
    dups = (find_duplicates(hash_files, counts, opts.dedup_memory_bytes, work / "dedup") if opts.dedup
            else np.empty(0, np.int64))
    drops, drop_files, dup_bytes = _drops_per_task(dups, counts, hash_files, spool)
    dedup_s = time.time() - t_dedup
    documents = int(sum(counts)) - len(dups)
    text_bytes = int(sum(s["bytes"] for s in summaries)) - dup_bytes
    if documents == 0:
        raise ValueError(f"no usable document in the inputs ({len(inputs)} files; skipped {dict(skipped) or 'none'})")

    sizes = shard_sizes(text_bytes, documents, opts)
    slices = shard_slices(hash_files, drops, text_bytes, sizes.num_shards)
    n = len(slices)
    t_write = time.time()
    release = _SpoolRelease(spool, len(tasks), slices)
    entries = pool.map(write_shard, [(i, n, sl, str(spool), drop_files, str(shards_dir), sizes.row_group_bytes)
                                     for i, sl in enumerate(slices)], text_bytes, "write", release.shard_done)
    write_s = time.time() - t_write
    worker_peak = max(r.get("peak_rss_bytes", 0) for r in [*summaries, *entries])
    entries = [{k: v for k, v in e.items() if k != "peak_rss_bytes"} for e in entries]
    tokens = estimate_tokens(shards_dir, opts.tokenizer_path, text_bytes)
    row_groups = sum(e["row_groups"] for e in entries)
    manifest = {
        "format_version": FORMAT_VERSION,
        "command": command,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint,
        "text_field": "text",
        "documents": documents,
        "bytes": text_bytes,
        "tokens_estimate": tokens["tokens"] if tokens else None,
        "tokens": tokens,
        "num_shards": n,
        "row_groups": row_groups,
        "row_group_bytes": sizes.row_group_bytes,
        "sizing": {"target_ranks": opts.target_ranks, "target_loader_workers": opts.target_loader_workers,
                   "target_slots": sizes.target_slots, "row_groups_per_target_slot": round(row_groups / sizes.target_slots, 3),
                   "rule": sizes.rule},
        "files": entries,
        "dedup": {"enabled": opts.dedup, "hash": "xxh3-128 of the UTF-8 text (after the reader's strip)",
                  "duplicates_dropped": int(len(dups)), "duplicate_bytes_dropped": dup_bytes,
                  "first_occurrence_kept": True},
        "records_read": int(sum(s["records"] for s in summaries)),
        "skipped": dict(sorted(skipped.items())),
        "skip_examples": examples,
        "inputs": [{k: f[k] for k in ("path", "bytes", "kind", "compression", "source")} for f in inputs],
        "input_files": len(inputs),
        "input_bytes": sum(f["bytes"] for f in inputs),
        "sources": [asdict(s) for s in opts.sources],
        "max_document_bytes": opts.max_document_bytes,
        "seconds": {"scan": round(scan_s, 2), "dedup": round(dedup_s, 2), "write": round(write_s, 2),
                    "total": round(time.time() - t0, 2)},
        # VmHWM of this process and the largest of the worker processes (the same process with one worker)
        "peak_rss_bytes": {"main": peak_rss_bytes(), "worker": worker_peak},
    }
    return manifest


def _tally_skips(plan_skips: list[dict], summaries: list[dict]) -> tuple[Counter, list[dict]]:
    """The skipped records' count per reason (the planner's and the scan's), and the first SKIP_EXAMPLES of each
    reason in input order; the first SKIP_WARNINGS of each reason are logged."""
    skipped: Counter = Counter(ex["reason"] for ex in plan_skips)
    for s in summaries:
        skipped.update(s["skipped"])
    examples: list[dict] = []
    kept: Counter = Counter()
    for ex in plan_skips + [ex for s in summaries for ex in s["skip_examples"]]:
        kept[ex["reason"]] += 1
        if kept[ex["reason"]] <= SKIP_EXAMPLES:
            examples.append(ex)
        if kept[ex["reason"]] <= SKIP_WARNINGS:
            logger.warning("skipped a record (%s) at %s%s", ex["reason"], ex["where"],
                           f": {ex['detail']}" if ex.get("detail") else "")
    return skipped, examples


def _drops_per_task(dups: np.ndarray, counts: list[int], hash_files: list[Path],
                    spool: Path) -> tuple[list[np.ndarray], dict[int, str], int]:
    """The global duplicate indices `dups` (sorted) as each scan task's local ones: (per task its drops, the
    ``<task>.drops.npy`` file written for each task with any, the dropped documents' text bytes)."""
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    drops: list[np.ndarray] = []
    drop_files: dict[int, str] = {}
    dup_bytes = 0
    for t, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        local = dups[np.searchsorted(dups, a):np.searchsorted(dups, b)] - a
        drops.append(local)
        if len(local):
            path = spool / f"{t:06d}.drops.npy"
            np.save(path, local)
            drop_files[t] = str(path)
            dup_bytes += int(read_hashes(hash_files[t])["len"][local].sum())
    return drops, drop_files, dup_bytes


class _SpoolRelease:
    """Deletes a scan task's spool text (``<task>.arrow``) as soon as every shard that reads it is written.

    Why: the freed page-cache pages are what the shards are then written into. On a VM whose host takes back
    free guest memory, first-touched pages cost the kernel's write ~2 s per GB (1 GB, ``--workers 1``: 0.5 s
    of CPU less with this; docs/data-scale.md); elsewhere it frees the work directory's disk a shard at a time.
    A resumed run is unaffected: a task's text is deleted only after the done markers of all its shards
    (`write_shard`) exist, so a rerun never needs it, and its hashes and counts (``.hash``, ``.json``) stay.
    """

    def __init__(self, spool: Path, tasks: int, slices: list[list[tuple[int, int, int]]]) -> None:
        self.spool = spool
        self.readers: Counter = Counter(t for sl in slices for t in {t for t, _, _ in sl})
        self.shard_tasks = [sorted({t for t, _, _ in sl}) for sl in slices]
        for t in range(tasks):  # no kept document (all skipped or duplicates): no shard reads it
            if not self.readers[t]:
                self._delete(t)

    def shard_done(self, shard: int, _entry: object) -> None:
        for t in self.shard_tasks[shard]:
            self.readers[t] -= 1
            if self.readers[t] == 0:
                self._delete(t)

    def _delete(self, task: int) -> None:
        (self.spool / f"{task:06d}.arrow").unlink(missing_ok=True)
