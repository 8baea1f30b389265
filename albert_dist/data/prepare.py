"""Raw corpora -> deduplicated parquet shards sized for a cluster, plus a manifest (`albert-dist data prepare`).

    albert-dist data prepare --input '/corpora/pile/*.jsonl.zst' [--input more/ ...] --output /data/pile-prepared
    albert-dist data prepare --config configs/pretrain/<recipe>.yaml --output DIR   (the recipe's data.train)

The command line (arguments, the recipe, exit codes) is the app's: `albert_dist.cli.data`; this module is the
work, `prepare(PrepareOptions(...), command)`.

Why: a ``.gz``/``.zst`` file cannot be split, so a job with more slots (ranks x loader workers) than such files
reads some of them several times per epoch. The output is the format NVIDIA's LDDL and the HF Hub use: parquet
files of one ``text`` column (zstd), cut into row groups of a size chosen for the cluster, and the training
loader takes each row group as a piece (`albert_dist.data.paths.plan_pieces`). With at least as many row
groups as slots every slot reads only its own row groups: each byte once per epoch.

Pipeline (every stage streams; nothing holds the corpus in memory):

1. *scan*, parallel over input pieces (``--workers`` processes; a compressed file is one piece, an uncompressed
   file is cut into `SCAN_PIECE_BYTES` byte ranges, a parquet file into runs of row groups): read the records
   with the training readers, count skips by reason (with file and offset), write the usable documents to a
   spool parquet file and their 128-bit BLAKE2b hashes and byte lengths to a side file (24 bytes/document).
2. *dedup*: exact duplicates (the same text after the reader's strip) are found from the hashes; the first
   occurrence in input order is kept, across all files and workers. Memory: `DEDUP_ROW_BYTES` (48) per
   document while that fits ``--dedup-memory`` (default 1 GiB: 22M documents); beyond that the hashes are
   partitioned on disk into buckets by hash value and each bucket is deduplicated alone, so peak memory stays
   ~``--dedup-memory`` at any corpus size (1 TB of 4 KB documents = 250M documents = 6 GB of temporary hash
   files, 13 buckets).
3. *write*, parallel over output shards: the kept documents, in input order, are cut into ``num_shards``
   contiguous shards of equal bytes and each shard into row groups of ``row_group_bytes`` of text.
4. a token estimate (a byte-budgeted sample of the output encoded with the tokenizer), ``manifest.json``, and a
   rename of the finished directory to ``--output``.

Sizing (`plan_sizes`): ``row_group_bytes = clamp(text_bytes / (ROW_GROUPS_PER_SLOT x slots), MIN_ROW_GROUP_BYTES,
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

Object stores: ``--input`` and ``--output`` may be fsspec URLs (``s3://``, ``gs://``; `albert_dist.data.store`).
A URL output is built in a local work directory (`_remote_work_root`) and uploaded when complete (`publish`: the
shards, then the manifest last), so a reader of the bucket never sees a manifest naming a missing shard.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import math
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.sizes import fmt_bytes, peak_rss_bytes

logger = logging.getLogger(__name__)

#: Bumped when the output layout or the manifest's meaning changes.
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
TMP_SUFFIX = ".prepare-tmp"
#: the lock beside a local output, ``.<name>.prepare-lock`` (`OutputLock`): kept after the run (deleting it while
#: a holder runs would let a second prepare lock a new file); a dotfile, so a glob or directory source skips it
LOCK_SUFFIX = ".prepare-lock"
#: Uncompressed txt/jsonl inputs are scanned in byte ranges of this size (parallelism inside big files).
SCAN_PIECE_BYTES = 256 << 20
#: Spool and shard writers buffer this much text before writing (scan) or at most a row group (write).
SPOOL_BATCH_BYTES = 8 << 20
#: Row-group sizing (see the module docstring and docs/data.md).
ROW_GROUPS_PER_SLOT = 4
MIN_ROW_GROUP_BYTES = 64 << 10
MAX_ROW_GROUP_BYTES = 4 << 20
ROW_GROUPS_PER_SHARD = 128
DEFAULT_TARGET_RANKS = 1024
DEFAULT_TARGET_LOADER_WORKERS = 8
#: Memory of the duplicate search per document: the hash halves (16 B), the sort order (8 B), sorted copies of
#: the halves (16 B), a mask (1 B), rounded up; a bucket also holds each document's index (8 B).
DEDUP_ROW_BYTES = 48
DEFAULT_DEDUP_MEMORY_BYTES = 1 << 30
#: zstd level of the output shards.
SHARD_ZSTD_LEVEL = 3
#: Bytes of output text the token estimate encodes.
TOKEN_SAMPLE_BYTES = 4 << 20
#: Skips of each reason reported with their location in the manifest (the counts are always complete).
SKIP_EXAMPLES = 20
#: Skips of each reason logged as warnings.
SKIP_WARNINGS = 3
_HASH_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("len", "<u8")])


# ---------------------------------------------------------------------------------------------------- options
@dataclass
class PrepareOptions:
    """What `prepare` does. Sizes in bytes of UTF-8 document text; ``None`` = derived by `plan_sizes`."""

    sources: list[SourceConfig]
    output: str
    num_shards: Optional[int] = None
    shard_bytes: Optional[int] = None
    row_group_bytes: Optional[int] = None
    target_ranks: int = DEFAULT_TARGET_RANKS
    target_loader_workers: int = DEFAULT_TARGET_LOADER_WORKERS
    workers: int = 1
    dedup: bool = True
    dedup_memory_bytes: int = DEFAULT_DEDUP_MEMORY_BYTES
    max_document_bytes: int = DataConfig.max_document_bytes
    tokenizer_path: Optional[str] = DataConfig.tokenizer_path
    overwrite: bool = False
    progress: Optional[bool] = None  # None: a progress bar only on a terminal

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("no input: give --input PATH (repeatable) or --config RECIPE")
        for i, s in enumerate(self.sources):
            if s.format == "hub":
                raise ValueError(f"input[{i}]: hub dataset {s.paths[0]!r}: prepare reads local files only "
                                 "(download it first, e.g. huggingface-cli download --repo-type dataset)")
        if not self.output:
            raise ValueError("--output must name a directory")
        if self.num_shards is not None and self.shard_bytes is not None:
            raise ValueError("give --num-shards or --shard-bytes, not both")
        for name in ("num_shards", "shard_bytes", "row_group_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        for name in ("target_ranks", "target_loader_workers", "workers", "dedup_memory_bytes",
                     "max_document_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

    def fingerprint(self, inputs: list[dict]) -> str:
        """Hash of everything the output depends on (inputs with sizes and mtimes, options; not ``workers``)."""
        opts = {k: v for k, v in asdict(self).items() if k not in ("workers", "overwrite", "progress", "output")}
        blob = json.dumps({"format_version": FORMAT_VERSION, "options": opts, "inputs": inputs}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Sizes:
    """Output sizing: shards (files), text bytes per shard, row-group text bytes, and the rule that chose them."""

    num_shards: int
    row_group_bytes: int
    target_slots: int
    rule: str


def plan_sizes(text_bytes: int, documents: int, opts: PrepareOptions) -> Sizes:
    """Shard count and row-group size for ``text_bytes`` of kept text (see the module docstring)."""
    slots = opts.target_ranks * opts.target_loader_workers
    if opts.row_group_bytes is not None:
        rg, rule = opts.row_group_bytes, "--row-group-bytes"
    else:
        per_slot = math.ceil(max(1, text_bytes) / (ROW_GROUPS_PER_SLOT * slots))
        rg = min(MAX_ROW_GROUP_BYTES, max(MIN_ROW_GROUP_BYTES, per_slot))
        rule = (f"row groups: text / ({ROW_GROUPS_PER_SLOT} x {opts.target_ranks} ranks x "
                f"{opts.target_loader_workers} loader workers), within [{fmt_bytes(MIN_ROW_GROUP_BYTES)}, "
                f"{fmt_bytes(MAX_ROW_GROUP_BYTES)}]")
    if opts.num_shards is not None:
        shards, srule = opts.num_shards, "--num-shards"
    elif opts.shard_bytes is not None:
        shards, srule = math.ceil(text_bytes / opts.shard_bytes), "--shard-bytes"
    else:
        shards, srule = math.ceil(text_bytes / (ROW_GROUPS_PER_SHARD * rg)), f"{ROW_GROUPS_PER_SHARD} row groups per file"
    return Sizes(max(1, min(shards, documents)), rg, slots, f"{rule}; files: {srule}")


# ---------------------------------------------------------------------------------------------------- progress
_PROGRESS = None  # a multiprocessing Value in each worker (set by _init_worker), or in-process


def _init_worker(counter) -> None:
    global _PROGRESS
    _PROGRESS = counter
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _advance(n: float) -> None:
    if _PROGRESS is not None and n > 0:
        with _PROGRESS.get_lock():
            _PROGRESS.value += int(n)


class _Workers:
    """A process pool shared by the scan and write stages (spawned once: starting a Python with pyarrow costs ~1 s
    of CPU) or, with one worker, the caller's process. ``map`` runs ``fn(*job)`` for every job, returns the
    results in job order and feeds a tqdm bar from the jobs' `_advance` calls (shown only on a terminal unless
    ``progress`` says otherwise); the first failing job's exception is raised after the rest are cancelled."""

    def __init__(self, workers: int, progress: Optional[bool]) -> None:
        self._ctx = mp.get_context("spawn")  # no state (threads, open files) forked from the caller
        self._counter = self._ctx.Value("q", 0)
        self._workers, self._progress = workers, progress
        self._pool: Optional[cf.ProcessPoolExecutor] = None

    def __enter__(self) -> "_Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(self, fn: Callable, jobs: Sequence[tuple], bar_total: float, bar_desc: str) -> list:
        global _PROGRESS
        from tqdm import tqdm

        with self._counter.get_lock():
            self._counter.value = 0
        results: list = [None] * len(jobs)
        disable = None if self._progress is None else not self._progress
        with tqdm(total=int(bar_total), desc=bar_desc, unit="B", unit_scale=True, disable=disable,
                  file=sys.stderr, dynamic_ncols=True) as bar:
            def update() -> None:
                bar.update(max(0, self._counter.value - bar.n))

            if self._workers == 1 or len(jobs) <= 1:
                _PROGRESS = self._counter
                try:
                    for i, job in enumerate(jobs):
                        results[i] = fn(*job)
                        update()
                finally:
                    _PROGRESS = None
                return results
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(max_workers=self._workers, mp_context=self._ctx,
                                                    initializer=_init_worker, initargs=(self._counter,))
            futures = {self._pool.submit(fn, *job): i for i, job in enumerate(jobs)}
            pending = set(futures)
            try:
                while pending:
                    done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        results[futures[fut]] = fut.result()
                    update()
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
        return results


# ---------------------------------------------------------------------------------------------------- 1. scan
@dataclass
class ScanTask:
    """One input piece: a byte range of an uncompressed file, a compressed file, or a run of parquet row groups."""

    index: int
    path: str
    kind: str
    compression: str
    start: int
    end: int
    row_groups: list[int] = field(default_factory=list)
    text_field: str = "text"
    txt_documents: str = "blank_line"
    disk_bytes: int = 0


def plan_scan(sources: list[SourceConfig]) -> tuple[list[ScanTask], list[dict], list[dict]]:
    """The scan tasks of all sources in input order (source, file path, offset), the input file list (``path``,
    ``bytes``, ``kind``, ``compression``, ``mtime_ns``, ``source``) and the files skipped while planning (a
    0-byte file, a parquet footer that does not parse: ``reason``, ``where``, ``detail``). Raises ValueError as discover_files
    and check_text_field do."""
    from albert_dist.data import store
    from albert_dist.data.files import check_text_field
    from albert_dist.data.paths import discover_files, file_format, parquet_metadata

    tasks: list[ScanTask] = []
    inputs: list[dict] = []
    skipped: list[dict] = []
    for i, source in enumerate(sources):
        where = f"input[{i}]"
        files = discover_files(source, where)
        check_text_field(source, where, files)
        for path in files:
            kind, compression = file_format(path, source.format)
            st = store.stat(path)  # an object's version is its ETag/generation, a file's its mtime
            size = st["size"]
            inputs.append({"path": path, "bytes": size, "kind": kind, "compression": compression,
                           "mtime_ns": int(st["version"]) if st["version"].isdigit() else st["version"],
                           "source": i})
            common = dict(path=path, kind=kind, compression=compression, text_field=source.text_field,
                          txt_documents=source.txt_documents)
            if size == 0:  # counted like the training loader does: a 0-byte shard is often a failed download
                skipped.append({"reason": "empty_file", "where": path})  # warned with the other skips
                continue
            if kind == "parquet":
                import pyarrow as pa

                try:
                    meta = parquet_metadata(path)
                except (OSError, pa.ArrowException) as err:  # a footer that does not parse: the file is skipped
                    reason = f"{type(err).__name__}: {err}".strip()
                    skipped.append({"reason": "damaged", "where": path, "detail": f"parquet footer: {reason}"})
                    logger.warning("%s: skipping %s: not a readable parquet file (%s)", where, path, reason)
                    continue
                group_bytes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
                run: list[int] = []
                run_bytes = 0
                for g, nbytes in enumerate(group_bytes):
                    run.append(g)
                    run_bytes += nbytes
                    if run_bytes >= SCAN_PIECE_BYTES or g == len(group_bytes) - 1:
                        # progress is in on-disk bytes: the run's share of the file
                        share = size * run_bytes // max(1, sum(group_bytes))
                        tasks.append(ScanTask(len(tasks), start=0, end=size, row_groups=run,
                                              disk_bytes=int(share), **common))
                        run, run_bytes = [], 0
            elif compression or (kind == "txt" and source.txt_documents == "file"):
                tasks.append(ScanTask(len(tasks), start=0, end=size, disk_bytes=size, **common))
            else:
                for start in range(0, size, SCAN_PIECE_BYTES):
                    end = min(size, start + SCAN_PIECE_BYTES)
                    tasks.append(ScanTask(len(tasks), start=start, end=end, disk_bytes=end - start, **common))
    return tasks, inputs, skipped


def _task_pieces(task: ScanTask) -> list[dict]:
    base = {"path": task.path, "kind": task.kind, "compression": task.compression, "start": task.start,
            "end": task.end, "nbytes": task.end - task.start}
    if task.kind == "parquet":
        return [{**base, "row_group": g} for g in task.row_groups]
    return [{**base, "row_group": -1}]


def _location(task: ScanTask, rec: dict) -> str:
    from albert_dist.data.files import record_location

    return record_location(task.kind, task.compression, task.path, int(rec.get("pos", 0)), int(rec.get("group", -1)))


def scan_task(task: ScanTask, spool_dir: str, max_document_bytes: int) -> dict:
    """Read one input piece; write its usable documents to ``<spool_dir>/<index>.parquet`` and their hashes and
    lengths to ``<index>.hash`` (`_HASH_DTYPE` rows); return (and write as ``<index>.json``, the completion
    marker) the counts: documents, bytes, records, skipped by reason, skip examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from albert_dist.data.files import read_piece

    spool = Path(spool_dir)
    done = spool / f"{task.index:06d}.json"
    if done.exists():  # resumed: this piece was scanned by an earlier run of the same command
        summary = json.loads(done.read_text())
        _advance(task.disk_bytes)
        return summary
    tmp_parquet, tmp_hash = spool / f"{task.index:06d}.parquet.tmp", spool / f"{task.index:06d}.hash.tmp"
    counts: Counter = Counter()
    examples: list[dict] = []
    texts: list[str] = []
    rows: list[tuple[int, int, int]] = []
    buffered = 0
    reported = 0.0
    raw_read = 0
    schema = pa.schema([("text", pa.string())])
    # LZ4: the spool is read once, by this machine; the fastest codec pyarrow has (zstd is for the output)
    writer = pq.ParquetWriter(tmp_parquet, schema, compression="lz4", use_dictionary=False, write_statistics=False)

    def flush() -> None:
        nonlocal texts, rows, buffered
        if texts:
            writer.write_table(pa.table({"text": texts}, schema=schema))
            np.array(rows, dtype=_HASH_DTYPE).tofile(hash_file)
        texts, rows, buffered = [], [], 0

    def skip(reason: str, where: str, detail: str = "") -> None:
        counts[f"skipped_{reason}"] += 1
        # capped per reason: a damaged file (the rest of a piece lost) must not hide behind bad records
        if counts[f"skipped_{reason}"] <= SKIP_EXAMPLES:
            examples.append({"reason": reason, "where": where, **({"detail": detail} if detail else {})})

    # Progress in on-disk bytes: the raw bytes read, scaled to the piece's share of the file (a compressed file's
    # decompressed size is guessed with a typical ratio; the bar is set right when the piece is done).
    from albert_dist.data.sample import DEFAULT_RATIO

    total_raw = (None if task.kind == "parquet" else task.disk_bytes * DEFAULT_RATIO if task.compression
                 else max(1, task.end - task.start))
    with open(tmp_hash, "wb") as hash_file:
        try:
            for piece in _task_pieces(task):
                records = read_piece(piece, task.text_field, task.txt_documents, max_document_bytes)
                try:
                    for rec in records:
                        if rec["skip"] == "damaged":  # the reader's marker, the last of this piece: not a record
                            skip("damaged", _location(task, rec), rec.get("detail", ""))
                            continue
                        counts["records"] += 1
                        raw_read += rec["nbytes"]
                        if rec["skip"]:
                            skip(rec["skip"], _location(task, rec), rec.get("detail", ""))
                            continue
                        data = rec["text"].encode("utf-8")
                        digest = hashlib.blake2b(data, digest_size=16).digest()
                        rows.append((int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little"),
                                     len(data)))
                        texts.append(rec["text"])
                        buffered += len(data)
                        counts["documents"] += 1
                        counts["bytes"] += len(data)
                        if buffered >= SPOOL_BATCH_BYTES:
                            flush()
                            if total_raw:
                                now = task.disk_bytes * min(0.99, raw_read / total_raw)
                                _advance(now - reported)
                                reported = now
                finally:
                    records.close()
            flush()
        finally:
            writer.close()
    os.replace(tmp_parquet, spool / f"{task.index:06d}.parquet")
    os.replace(tmp_hash, spool / f"{task.index:06d}.hash")
    summary = {"documents": counts["documents"], "bytes": counts["bytes"], "records": counts["records"],
               "skipped": {k[len("skipped_"):]: v for k, v in counts.items() if k.startswith("skipped_")},
               "skip_examples": examples}
    done.write_text(json.dumps(summary))
    _advance(task.disk_bytes - reported)
    return {**summary, "peak_rss_bytes": peak_rss_bytes()}


# ---------------------------------------------------------------------------------------------------- 2. dedup
def _duplicates(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Positions (into ``hi``/``lo``, in increasing order of position = input order) of every document whose
    128-bit hash ``(hi, lo)`` equals that of an earlier position. Memory: ~33 bytes per document on top of the
    keys (the sort order, sorted copies, a mask)."""
    if len(hi) < 2:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((lo, hi))  # stable: equal hashes keep input order, so the first occurrence comes first
    h, l = hi[order], lo[order]
    dup = np.empty(len(order), dtype=bool)
    dup[0] = False
    dup[1:] = (h[1:] == h[:-1]) & (l[1:] == l[:-1])
    del h, l
    return np.sort(order[dup])


def _hashes(path: Path) -> np.ndarray:
    """The `_HASH_DTYPE` rows of a spool hash file, memory-mapped (an empty file gives an empty array)."""
    if os.path.getsize(path) == 0:
        return np.empty(0, dtype=_HASH_DTYPE)
    return np.memmap(path, dtype=_HASH_DTYPE, mode="r")


def find_duplicates(hash_files: list[Path], counts: list[int], memory_bytes: int, work: Path) -> np.ndarray:
    """Sorted global indices (documents numbered in input order) of every exact duplicate but the first.

    In memory when ``DEDUP_ROW_BYTES x documents <= memory_bytes`` (the two hash halves, 16 bytes, plus what
    `_duplicates` needs); else the hashes and indices (24 bytes per document) go to ``B`` bucket files under
    ``work`` by ``hi mod B`` (a uniform hash, so equal hashes meet in one bucket) and each bucket is searched
    alone: peak memory ~``memory_bytes`` at any corpus size.
    """
    total = int(sum(counts))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # a bucket also holds its documents' indices (8 B each)
    buckets = 1 if total * DEDUP_ROW_BYTES <= memory_bytes else math.ceil(total * (DEDUP_ROW_BYTES + 8) / memory_bytes)
    if buckets == 1:
        hi, lo = np.empty(total, np.uint64), np.empty(total, np.uint64)
        for f, a, b in zip(hash_files, offsets[:-1], offsets[1:]):
            rows = _hashes(f)
            hi[a:b], lo[a:b] = rows["hi"], rows["lo"]
        return _duplicates(hi, lo)
    bucket_dtype = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("gidx", "<i8")])
    work.mkdir(parents=True, exist_ok=True)
    handles = [open(work / f"bucket-{b:05d}.bin", "wb") for b in range(buckets)]
    try:
        # files in input order, chunks in order: each bucket file lists its documents in increasing gidx
        step = min(1 << 22, max(1 << 16, memory_bytes // 256))  # rows at a time: ~60 bytes each while split
        for f, base in zip(hash_files, offsets[:-1]):
            rows = _hashes(f)
            for s in range(0, len(rows), step):
                chunk = np.asarray(rows[s:s + step])
                out = np.empty(len(chunk), dtype=bucket_dtype)
                out["hi"], out["lo"] = chunk["hi"], chunk["lo"]
                out["gidx"] = base + s + np.arange(len(chunk))
                which = (chunk["hi"] % np.uint64(buckets)).astype(np.int64)
                for b in np.unique(which):
                    out[which == b].tofile(handles[b])
    finally:
        for h in handles:
            h.close()
    dups = []
    for b in range(buckets):
        path = work / f"bucket-{b:05d}.bin"
        rows = np.fromfile(path, dtype=bucket_dtype)
        dups.append(rows["gidx"][_duplicates(rows["hi"], rows["lo"])])
        del rows
        path.unlink()
    return np.sort(np.concatenate(dups)) if dups else np.empty(0, np.int64)


# ---------------------------------------------------------------------------------------------------- 3. write
def shard_slices(hash_files: list[Path], drops: list[np.ndarray], total_bytes: int,
                 num_shards: int) -> list[list[tuple[int, int, int]]]:
    """Per shard, the ``(task, first, last + 1)`` slices of *spool rows* it holds: kept documents go to shard
    ``floor(bytes before them x num_shards / total_bytes)`` (contiguous, equal bytes). Empty shards (a document
    larger than a shard) are dropped, so the result may be shorter than ``num_shards``."""
    per_shard: list[list[tuple[int, int, int]]] = [[] for _ in range(num_shards)]
    before = 0
    for t, (f, drop) in enumerate(zip(hash_files, drops)):
        lens = _hashes(f)["len"].astype(np.int64)
        keep = np.ones(len(lens), dtype=bool)
        keep[drop] = False
        kept_rows = np.flatnonzero(keep)
        if len(kept_rows) == 0:
            continue
        kept_lens = lens[kept_rows]
        starts = before + np.concatenate([[0], np.cumsum(kept_lens)[:-1]])
        shard = np.minimum(num_shards - 1, (starts * num_shards) // max(1, total_bytes))
        before += int(kept_lens.sum())
        cuts = np.flatnonzero(np.diff(shard)) + 1
        for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(shard)]])):
            # spool rows kept_rows[a] .. kept_rows[b-1]; dropped rows inside are filtered by the writer
            per_shard[int(shard[a])].append((t, int(kept_rows[a]), int(kept_rows[b - 1]) + 1))
    return [s for s in per_shard if s]


def shard_name(i: int, n: int) -> str:
    """File name of shard ``i`` of ``n`` (the HF Hub's ``*-00000-of-00016.parquet`` pattern)."""
    return f"shard-{i:05d}-of-{n:05d}.parquet"


def write_shard(index: int, num_shards: int, slices: list[tuple[int, int, int]], spool_dir: str,
                drop_files: dict[int, str], out_dir: str, row_group_bytes: int) -> dict:
    """Write shard ``index`` from its spool slices; row group k holds the documents that start in its
    ``[k, k + 1) x row_group_bytes`` of the shard's text. Returns (and writes beside it) its manifest entry."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    name = shard_name(index, num_shards)
    done = out / f".{name}.json"
    if done.exists() and (out / name).exists():
        entry = json.loads(done.read_text())
        _advance(entry["bytes"])
        return entry
    spool = Path(spool_dir)
    schema = pa.schema([("text", pa.string())])
    tmp = out / f".{name}.tmp"
    # zstd level 3 (the zstd CLI's default; pyarrow's is 1): row groups of 64 KiB lose some ratio against one
    # stream per file, level 3 wins most of it back for a few % of the write time (bench/data_scale.py)
    writer = pq.ParquetWriter(tmp, schema, compression="zstd", compression_level=SHARD_ZSTD_LEVEL, use_dictionary=False,
                              write_statistics=False)
    documents = nbytes = row_groups = 0
    buf: list = []
    buf_bytes = 0
    current_group = 0

    def flush() -> None:
        nonlocal buf, buf_bytes, row_groups
        if buf:
            table = pa.Table.from_arrays([pa.concat_arrays(buf)], schema=schema)
            writer.write_table(table, row_group_size=len(table))
            row_groups += 1
            _advance(buf_bytes)
        buf, buf_bytes = [], 0

    try:
        for task, first, last in slices:
            lens = _hashes(spool / f"{task:06d}.hash")["len"].astype(np.int64)
            keep = np.zeros(len(lens), dtype=bool)
            keep[first:last] = True
            if task in drop_files:
                keep[np.load(drop_files[task])] = False
            pf = pq.ParquetFile(spool / f"{task:06d}.parquet")
            group_rows = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
            group_start = np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64)
            for g in range(len(group_rows)):
                lo, hi = int(group_start[g]), int(group_start[g + 1])
                if hi <= first or lo >= last:  # only the spool row groups (~8 MiB each) this slice overlaps
                    continue
                batch = pf.read_row_group(g, columns=["text"])
                sel = np.flatnonzero(keep[lo:hi])
                if len(sel) == 0:
                    continue
                texts = batch.column(0).combine_chunks().take(pa.array(sel))
                sizes = lens[lo:hi][sel]
                starts = nbytes + np.concatenate([[0], np.cumsum(sizes)[:-1]])
                groups = starts // row_group_bytes
                cuts = np.flatnonzero(np.diff(groups)) + 1
                for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(sel)]])):
                    if groups[a] != current_group:
                        flush()
                        current_group = int(groups[a])
                    buf.append(texts.slice(int(a), int(b - a)))
                    buf_bytes += int(sizes[a:b].sum())
                documents += len(sel)
                nbytes += int(sizes.sum())
        flush()
    finally:
        writer.close()
    os.replace(tmp, out / name)
    digest = hashlib.sha256()
    with open(out / name, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    entry = {"path": name, "documents": documents, "bytes": nbytes, "row_groups": row_groups,
             "file_bytes": os.path.getsize(out / name), "sha256": digest.hexdigest()}
    done.write_text(json.dumps(entry))
    return {**entry, "peak_rss_bytes": peak_rss_bytes()}


# ---------------------------------------------------------------------------------------------------- 4. finish
def estimate_tokens(shard_dir: Path, tokenizer_path: Optional[str], text_bytes: int) -> Optional[dict]:
    """Tokens of the output, estimated from a `TOKEN_SAMPLE_BYTES` sample of it spread over every shard and
    encoded as the pretraining pipeline encodes (sentences, then sentencepiece). None without a tokenizer."""
    if not tokenizer_path:
        return None
    from albert_dist.data.sample import ByteBudgetSample
    from albert_dist.data.text import split_sentences
    from albert_dist.data.tokenizer import load_tokenizer

    sp = load_tokenizer(tokenizer_path)
    sample = ByteBudgetSample([SourceConfig(paths=[str(shard_dir / "*.parquet")])], "output", TOKEN_SAMPLE_BYTES)
    tokens = 0
    for text in sample:
        tokens += sum(len(ids) for ids in sp.encode(split_sentences(text)))
    sampled = sum(sample.taken.values())
    if not sampled:
        return None
    from albert_dist.data.paths import resolve_path

    per_byte = tokens / sampled
    return {"tokens": int(round(per_byte * text_bytes)), "tokens_per_byte": round(per_byte, 6),
            "sample_bytes": sampled, "sample_documents": sample.documents,
            "tokenizer": str(resolve_path(tokenizer_path))}


def load_manifest(output: str | Path) -> Optional[dict]:
    """The manifest of a prepare output directory or object-store prefix, or None when there is none (or it does
    not parse). Raises `albert_dist.data.store.StoreError` for a denied prefix or missing credentials."""
    from albert_dist.data import store

    try:
        text = store.read_text(store.join(str(output), MANIFEST_NAME))
        return None if text is None else json.loads(text)
    except (OSError, ValueError) as err:
        if isinstance(err, store.StoreError):
            raise
        return None


def _remote_work_root(output: str) -> Path:
    """Local work directory of a prepare whose ``--output`` is a URL: the same for every run on that URL (so a
    rerun resumes), under ``$ALBERT_DIST_PREPARE_TMP`` or the system temporary directory."""
    import tempfile

    root = Path(os.environ.get("ALBERT_DIST_PREPARE_TMP") or tempfile.gettempdir())
    return root / f"albert-dist-prepare-{hashlib.sha256(output.encode()).hexdigest()[:16]}"


def publish(shards_dir: Path, output: str, manifest: dict, previous: Optional[dict]) -> None:
    """Upload a finished local output (shards + manifest.json) to the object-store prefix ``output``.

    Order is what makes it safe for readers (`albert_dist.data.plan` and the loader read the manifest and the
    shards it names): a previous manifest (``--overwrite``) is deleted first, so no reader pairs it with new
    shards; each shard is one PUT (a multipart upload for a large one), which an object store makes visible only
    once complete, so no reader sees a half-written shard; the manifest is uploaded last, one PUT as well (no
    temporary key and move: an object store has no rename, a move is a copy, and a PUT is already all or
    nothing), so a manifest never names a shard that is not there. Shards of the previous
    output that the new one does not name are deleted at the end. Raises `albert_dist.data.store.StoreError`.
    """
    from albert_dist.data import store

    fs, root = store.filesystem(output)
    root = root.rstrip("/")
    url = output.rstrip("/")
    if previous is not None:
        store.call(url, "delete the previous manifest", fs.rm_file, f"{root}/{MANIFEST_NAME}")
    names = [e["path"] for e in manifest["files"]]
    for name in names:
        store.call(url, f"upload {name}", fs.put_file, str(shards_dir / name), f"{root}/{name}")
    store.call(url, "upload the manifest", fs.put_file, str(shards_dir / MANIFEST_NAME), f"{root}/{MANIFEST_NAME}")
    stale = [e["path"] for e in (previous or {}).get("files", []) if e.get("path") not in names]
    for name in stale:
        store.call(url, f"delete the previous {name}", fs.rm_file, f"{root}/{name}")


class OutputBusy(ValueError):
    """Another `albert-dist data prepare` is writing the same output (exit 2; the message names the holder)."""


class OutputLock:
    """One prepare per output: an exclusive ``fcntl.flock`` on ``path`` (beside the output's work directory), held
    until `release` or the process's end (the kernel drops it however the process ends, so a killed prepare never
    leaves it stuck). The holder writes its pid, host and start time into the file for the refusal message.

    Why: two prepares on one output each took the other's live work directory for an interrupted run, and one
    could finish with a manifest whose sha256 did not match a shard the other had rewritten (issue 26). An
    object-store output is built in a local work directory per URL (`_remote_work_root`), so this refuses a second
    prepare of one URL on the same node; two nodes preparing one URL are not detected (object stores have no
    lock), and the last upload wins whole: each one's manifest still matches the shards it names.
    """

    def __init__(self, path: Path, output: str) -> None:
        self.path, self.output = path, output
        self._fd: Optional[int] = None

    def acquire(self) -> "OutputLock":
        """Take the lock without waiting. Raises `OutputBusy` naming the holder, OSError if the file cannot be made."""
        import fcntl
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                who = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                who = {}
            holder = (f"pid {who['pid']} on host {who.get('host', '?')} since {who.get('started', '?')}"
                      if who.get("pid") else "a process that has not written its pid yet")
            raise OutputBusy(f"--output {self.output} is being written by another albert-dist data prepare: "
                             f"{holder} (lock {self.path}); wait for it to end, or choose another output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
    from albert_dist.data import store

    t0 = time.time()
    remote = store.is_url(opts.output)
    url = opts.output.rstrip("/")
    # an object-store output is built in a local work directory and uploaded when complete (`publish`)
    out = _remote_work_root(url) / "output" if remote else Path(opts.output).expanduser().resolve()
    lock_path = (out.parent.parent / (out.parent.name + ".lock")) if remote else out.parent / f".{out.name}{LOCK_SUFFIX}"
    lock = OutputLock(lock_path, url if remote else str(out)).acquire()
    try:
        return _prepare_locked(opts, command, t0, remote, url, out)
    finally:
        lock.release()


def _prepare_locked(opts: PrepareOptions, command: str, t0: float, remote: bool, url: str, out: Path) -> dict:
    """`prepare` with the output's lock held."""
    from albert_dist.data import store

    tasks, inputs, plan_skips = plan_scan(opts.sources)
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
    state = {"fingerprint": fingerprint, "command": command}
    if work.exists():
        try:
            previous = json.loads((work / "state.json").read_text())
        except (OSError, ValueError):
            previous = {}
        if previous.get("fingerprint") != fingerprint:
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
    with _Workers(opts.workers, opts.progress) as pool:
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
                      inputs: list[dict], plan_skips: list[dict], fingerprint: str, pool: _Workers) -> dict:
    """Stages 1-3 and the manifest (see `prepare`)."""
    spool, shards_dir = work / "spool", work / "output"
    disk_bytes = sum(t.disk_bytes for t in tasks)
    t_scan = time.time()
    summaries = pool.map(scan_task, [(t, str(spool), opts.max_document_bytes) for t in tasks], disk_bytes, "scan")
    scan_s = time.time() - t_scan
    counts = [s["documents"] for s in summaries]
    hash_files = [spool / f"{t.index:06d}.hash" for t in tasks]
    skipped: Counter = Counter(ex["reason"] for ex in plan_skips)
    for s in summaries:
        skipped.update(s["skipped"])
    # the first SKIP_EXAMPLES of each reason, in input order; the first few of each reason on the console
    examples: list[dict] = []
    kept: Counter = Counter()
    for ex in plan_skips + [ex for s in summaries for ex in s["skip_examples"]]:
        kept[ex["reason"]] += 1
        if kept[ex["reason"]] <= SKIP_EXAMPLES:
            examples.append(ex)
        if kept[ex["reason"]] <= SKIP_WARNINGS:
            logger.warning("skipped a record (%s) at %s%s", ex["reason"], ex["where"],
                           f": {ex['detail']}" if ex.get("detail") else "")

    t_dedup = time.time()
    dups = (find_duplicates(hash_files, counts, opts.dedup_memory_bytes, work / "dedup") if opts.dedup
            else np.empty(0, np.int64))
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
            dup_bytes += int(_hashes(hash_files[t])["len"][local].sum())
    dedup_s = time.time() - t_dedup
    documents = int(sum(counts)) - len(dups)
    text_bytes = int(sum(s["bytes"] for s in summaries)) - dup_bytes
    if documents == 0:
        raise ValueError(f"no usable document in the inputs ({len(inputs)} files; skipped {dict(skipped) or 'none'})")

    sizes = plan_sizes(text_bytes, documents, opts)
    slices = shard_slices(hash_files, drops, text_bytes, sizes.num_shards)
    n = len(slices)
    t_write = time.time()
    entries = pool.map(write_shard, [(i, n, sl, str(spool), drop_files, str(shards_dir), sizes.row_group_bytes)
                                     for i, sl in enumerate(slices)], text_bytes, "write")
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
        "dedup": {"enabled": opts.dedup, "hash": "blake2b-128 of the UTF-8 text (after the reader's strip)",
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
