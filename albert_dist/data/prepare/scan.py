"""Stage 1 of `albert-dist data prepare`: input pieces -> spool files (usable documents + their hashes).

The spool of scan task ``i`` under the work directory's ``spool/``: ``<i>.parquet`` (the documents, in input
order), ``<i>.hash`` (one `HASH_DTYPE` row per document: hash halves and UTF-8 length) and ``<i>.json`` (the
counts; written last, it marks the task done for a resumed run).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from albert_dist.data.config import SourceConfig
from albert_dist.data.prepare.pool import advance
from albert_dist.data.sizes import peak_rss_bytes

logger = logging.getLogger(__name__)

#: Uncompressed txt/jsonl inputs are scanned in byte ranges of this size (parallelism inside big files).
SCAN_PIECE_BYTES = 256 << 20
#: Spool writers buffer this much text before writing.
SPOOL_BATCH_BYTES = 8 << 20
#: Skips of each reason reported with their location in the manifest (the counts are always complete).
SKIP_EXAMPLES = 20
#: A spool hash file's rows: the 128-bit document hash in two halves, and the document's UTF-8 bytes.
HASH_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("len", "<u8")])


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
    lengths to ``<index>.hash`` (`HASH_DTYPE` rows); return (and write as ``<index>.json``, the completion
    marker) the counts: documents, bytes, records, skipped by reason, skip examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from albert_dist.data.files import read_piece

    spool = Path(spool_dir)
    done = spool / f"{task.index:06d}.json"
    if done.exists():  # resumed: this piece was scanned by an earlier run of the same command
        summary = json.loads(done.read_text())
        advance(task.disk_bytes)
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
            np.array(rows, dtype=HASH_DTYPE).tofile(hash_file)
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
                                advance(now - reported)
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
    advance(task.disk_bytes - reported)
    return {**summary, "peak_rss_bytes": peak_rss_bytes()}


def read_hashes(path: Path) -> np.ndarray:
    """The `HASH_DTYPE` rows of a spool hash file, memory-mapped (an empty file gives an empty array)."""
    if os.path.getsize(path) == 0:
        return np.empty(0, dtype=HASH_DTYPE)
    return np.memmap(path, dtype=HASH_DTYPE, mode="r")
