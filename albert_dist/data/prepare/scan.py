"""Stage 1 of `albert-dist data prepare`: input pieces -> spool files (usable documents + their hashes).

The spool of scan task ``i`` under the work directory's ``spool/``: ``<i>.arrow`` (the documents, in input
order, an Arrow IPC file), ``<i>.hash`` (one `HASH_DTYPE` row per document: xxh3-128 halves and UTF-8 length)
and ``<i>.json`` (the counts; written last, it marks the task done for a resumed run).
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from albert_dist.data.config import SourceConfig
from albert_dist.data.prepare.pool import advance
from albert_dist.sizes import peak_rss_bytes

logger = logging.getLogger(__name__)

#: Uncompressed txt/jsonl inputs are scanned in byte ranges of this size (parallelism inside big files).
SCAN_PIECE_BYTES = 256 << 20
#: The record-by-record scan buffers this much text before writing it to the spool.
SPOOL_BATCH_BYTES = 8 << 20
#: Skips of each reason reported with their location in the manifest (the counts are always complete).
SKIP_EXAMPLES = 20
#: Bumped when the spool files change (a work directory of another format is not resumed: `run`).
SPOOL_FORMAT = 2
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


def scan_tasks(sources: list[SourceConfig]) -> tuple[list[ScanTask], list[dict], list[dict]]:
    """The scan tasks of all sources in input order (source, file path, offset), the input file list (``path``,
    ``bytes``, ``kind``, ``compression``, ``mtime_ns``, ``source``) and the files skipped while planning (a
    0-byte file, a parquet footer that does not parse: ``reason``, ``where``, ``detail``). Raises ValueError as
    find_files and check_text_field do."""
    from albert_dist.data.sources.read import check_text_field
    from albert_dist.data.sources.discover import find_files

    tasks: list[ScanTask] = []
    inputs: list[dict] = []
    skipped: list[dict] = []
    for i, source in enumerate(sources):
        where = f"input[{i}]"
        files = find_files(source, where)
        check_text_field(source, where, files)
        for file in files:
            path, kind, compression, size = file.path, file.kind, file.compression, file.size
            # an object's version is its ETag/generation, a file's its mtime
            inputs.append({"path": path, "bytes": size, "kind": kind, "compression": compression,
                           "mtime_ns": int(file.version) if file.version.isdigit() else file.version,
                           "source": i})
            common = dict(path=path, kind=kind, compression=compression, text_field=source.text_field,
                          txt_documents=source.txt_documents)
            if size == 0:  # counted like the training loader does: a 0-byte shard is often a failed download
                skipped.append({"reason": "empty_file", "where": path})  # warned with the other skips
                continue
            if kind == "parquet":
                import pyarrow as pa

                try:
                    meta = file.footer()
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


def _location(task: ScanTask, pos: int, row_group: int = -1) -> str:
    from albert_dist.data.sources.read import record_location

    return record_location(task.kind, task.compression, task.path, pos, row_group)


class _Spool:
    """One scan task's spool files, written under temporary names and renamed by `commit`: the documents as an
    Arrow IPC file (uncompressed: the spool is written and read once, by this machine, and lz4 on it cost a
    quarter of the scan; the price is the kept text's size on the work directory's disk) and their
    `HASH_DTYPE` rows (xxh3-128 of the UTF-8 text; the first 8 bytes of the canonical digest are ``hi``)."""

    def __init__(self, spool: Path, index: int) -> None:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        self.final = (spool / f"{index:06d}.arrow", spool / f"{index:06d}.hash")
        self.tmp = tuple(p.with_name(p.name + ".tmp") for p in self.final)
        self.schema = pa.schema([("text", pa.string())])
        self._writer = ipc.new_file(str(self.tmp[0]), self.schema)
        self._hashes = open(self.tmp[1], "wb")
        self.documents = self.bytes = 0
        self._open = True

    def add(self, texts) -> None:
        """Append a `pyarrow.StringArray` of usable documents (no nulls)."""
        import pyarrow as pa
        import xxhash

        if len(texts) == 0:
            return
        offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32, count=len(texts) + 1, offset=texts.offset * 4)
        data = memoryview(texts.buffers()[2])
        digest = xxhash.xxh3_128_digest
        bounds = offsets.tolist()
        halves = np.frombuffer(b"".join([digest(data[a:b]) for a, b in zip(bounds, bounds[1:])]), dtype=">u8")
        rows = np.empty(len(texts), dtype=HASH_DTYPE)
        rows["hi"], rows["lo"], rows["len"] = halves[0::2], halves[1::2], np.diff(offsets)
        rows.tofile(self._hashes)
        self._writer.write_batch(pa.record_batch([texts], schema=self.schema))
        self.documents += len(texts)
        self.bytes += int(offsets[-1] - offsets[0])

    def close(self) -> None:
        if self._open:
            self._open = False
            self._writer.close()
            self._hashes.close()

    def discard(self) -> None:
        """Close and delete the temporary files (an attempt that did not finish)."""
        self.close()
        for tmp in self.tmp:
            tmp.unlink(missing_ok=True)

    def commit(self) -> None:
        self.close()
        for tmp, final in zip(self.tmp, self.final):
            os.replace(tmp, final)
        self.tmp = ()


class _Counts:
    """A scan task's record counts and the first `SKIP_EXAMPLES` skips of each reason (in record order)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.examples: list[dict] = []

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        self.counts[f"skipped_{reason}"] += 1
        # capped per reason: a damaged file (the rest of a piece lost) must not hide behind bad records
        if self.counts[f"skipped_{reason}"] <= SKIP_EXAMPLES:
            self.examples.append({"reason": reason, "where": where, **({"detail": detail} if detail else {})})

    def summary(self, spool: _Spool) -> dict:
        return {"documents": spool.documents, "bytes": spool.bytes, "records": self.counts["records"],
                "skipped": {k[len("skipped_"):]: v for k, v in self.counts.items() if k.startswith("skipped_")},
                "skip_examples": self.examples}


class _Progress:
    """Progress in on-disk bytes: the raw bytes read, scaled to the piece's share of the file (a compressed
    file's decompressed size is guessed with a typical ratio; the bar is set right when the piece is done)."""

    def __init__(self, task: ScanTask) -> None:
        from albert_dist.data.sample import DEFAULT_RATIO

        self.task, self.raw_read, self.reported = task, 0, 0.0
        self.total_raw = (None if task.kind == "parquet" else task.disk_bytes * DEFAULT_RATIO if task.compression
                          else max(1, task.end - task.start))

    def read(self, nbytes: int) -> None:
        self.raw_read += nbytes

    def report(self) -> None:
        if self.total_raw:
            now = self.task.disk_bytes * min(0.99, self.raw_read / self.total_raw)
            advance(now - self.reported)
            self.reported = now

    def finish(self) -> None:
        advance(self.task.disk_bytes - self.reported)


def scan_task(task: ScanTask, spool_dir: str, max_document_bytes: int) -> dict:
    """Read one input piece; write its usable documents to ``<spool_dir>/<index>.arrow`` and their hashes and
    lengths to ``<index>.hash`` (`_Spool`); return (and write as ``<index>.json``, the completion marker) the
    counts: documents, bytes, records, skipped by reason, skip examples.

    A JSON-lines piece is read a block at a time (`albert_dist.data.prepare.jsonl`); every other piece, and a
    JSON-lines piece whose stream turns out damaged (read again from its start), record by record with the
    training reader (`albert_dist.data.sources.read.read_piece`). Both give the same documents and skips.
    """
    from albert_dist.data.sources.read import DamagedInput

    spool = Path(spool_dir)
    done = spool / f"{task.index:06d}.json"
    if done.exists():  # resumed: this piece was scanned by an earlier run of the same command
        summary = json.loads(done.read_text())
        advance(task.disk_bytes)
        return summary
    summary = None
    if task.kind == "jsonl":
        try:
            summary = _scan_blocks(task, spool, max_document_bytes)
        except (DamagedInput, OSError) as err:  # the training reader says where and why, as a counted skip
            logger.debug("%s: reading it record by record (%s)", task.path, err)
    if summary is None:
        summary = _scan_records(task, spool, max_document_bytes)
    done.write_text(json.dumps(summary))
    return {**summary, "peak_rss_bytes": peak_rss_bytes()}


def _scan_records(task: ScanTask, spool_dir: Path, max_document_bytes: int) -> dict:
    """`scan_task` with the training reader, one record at a time."""
    from albert_dist.data.sources.read import read_piece
    from albert_dist.data.prepare.jsonl import arrow_strings

    counts, progress = _Counts(), _Progress(task)
    texts: list[str] = []
    buffered = 0
    spool = _Spool(spool_dir, task.index)
    try:
        for piece in _task_pieces(task):
            records = read_piece(piece, task.text_field, task.txt_documents, max_document_bytes)
            try:
                for rec in records:
                    if rec["skip"] == "damaged":  # the reader's marker, the last of this piece: not a record
                        counts.skip("damaged", _location(task, rec["pos"], rec["group"]), rec.get("detail", ""))
                        continue
                    counts.counts["records"] += 1
                    progress.read(rec["nbytes"])
                    if rec["skip"]:
                        counts.skip(rec["skip"], _location(task, rec["pos"], rec["group"]), rec.get("detail", ""))
                        continue
                    try:
                        buffered += len(rec["text"].encode("utf-8"))
                    except UnicodeEncodeError:  # a JSON "\\ud800" escape: a lone surrogate has no UTF-8
                        counts.skip("invalid_utf8", _location(task, rec["pos"], rec["group"]))
                        continue
                    texts.append(rec["text"])
                    if buffered >= SPOOL_BATCH_BYTES:
                        spool.add(arrow_strings(texts))
                        texts, buffered = [], 0
                        progress.report()
            finally:
                records.close()
        spool.add(arrow_strings(texts))
        spool.commit()
    finally:
        spool.discard()  # a no-op after commit
    progress.finish()
    return counts.summary(spool)


def _scan_blocks(task: ScanTask, spool_dir: Path, max_document_bytes: int) -> dict:
    """`scan_task` of a JSON-lines piece, a block of lines at a time (`albert_dist.data.prepare.jsonl`); a block
    pyarrow cannot take whole goes line by line through the training reader's per-record function. Raises
    `DamagedInput` (or OSError) for a stream that cannot be read to its end: nothing is kept of this attempt."""
    from albert_dist.data.sources.read import _json_record, open_stream
    from albert_dist.data.prepare.jsonl import arrow_strings, line_blocks, parse_block

    counts, progress = _Counts(), _Progress(task)
    end = task.end if not task.compression else float("inf")
    spool = _Spool(spool_dir, task.index)
    stream = open_stream(task.path, task.compression, max(0, task.start - 1))
    try:
        read = getattr(stream, "read_chunk", stream.read)  # a decoded stream's, without a copy
        for block in line_blocks(read, task.start, end, max_document_bytes):
            progress.read(block.nbytes)
            if block.data is None:
                counts.counts["records"] += 1
                counts.skip("too_long", _location(task, block.offset))
                continue
            parsed = parse_block(block, task.text_field, max_document_bytes)
            if parsed is not None:
                counts.counts["records"] += parsed.records
                for reason, pos in parsed.skipped:
                    counts.skip(reason, _location(task, pos))
                spool.add(parsed.texts)
            else:
                texts: list[str] = []
                lines = block.data.split(b"\n")
                pos = block.offset
                for raw in lines[:-1] if block.data.endswith(b"\n") else lines:
                    counts.counts["records"] += 1
                    rec = _json_record(raw if len(raw) <= max_document_bytes else None, len(raw), task.text_field)
                    if not rec["skip"]:
                        try:
                            rec["text"].encode("utf-8")
                        except UnicodeEncodeError:  # a lone surrogate escape has no UTF-8
                            rec["skip"] = "invalid_utf8"
                    if rec["skip"]:
                        counts.skip(rec["skip"], _location(task, pos))
                    else:
                        texts.append(rec["text"])
                    pos += len(raw) + 1
                spool.add(arrow_strings(texts))
            progress.report()
        spool.commit()
    finally:
        stream.close()
        spool.discard()  # a no-op after commit
    progress.finish()
    return counts.summary(spool)


def read_hashes(path: Path) -> np.ndarray:
    """The `HASH_DTYPE` rows of a spool hash file, memory-mapped (an empty file gives an empty array)."""
    if os.path.getsize(path) == 0:
        return np.empty(0, dtype=HASH_DTYPE)
    return np.memmap(path, dtype=HASH_DTYPE, mode="r")
