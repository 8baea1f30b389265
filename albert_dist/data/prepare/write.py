"""Stage 3 of `albert-dist data prepare`: the kept documents, in input order, cut into shards of equal bytes
and each shard into row groups of ``row_group_bytes`` of text (zstd parquet, one ``text`` column)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from albert_dist.data.prepare.pool import advance
from albert_dist.data.prepare.scan import read_hashes
from albert_dist.sizes import peak_rss_bytes

#: zstd level of the output shards.
SHARD_ZSTD_LEVEL = 1
#: A shard of at most this much text is built in memory and written with one call (`write_shard`).
SHARD_IN_MEMORY_BYTES = 64 << 20


def shard_slices(hash_files: list[Path], drops: list[np.ndarray], total_bytes: int,
                 num_shards: int) -> list[list[tuple[int, int, int]]]:
    """Per shard, the ``(task, first, last + 1)`` slices of *spool rows* it holds: kept documents go to shard
    ``floor(bytes before them x num_shards / total_bytes)`` (contiguous, equal bytes). Empty shards (a document
    larger than a shard) are dropped, so the result may be shorter than ``num_shards``."""
    per_shard: list[list[tuple[int, int, int]]] = [[] for _ in range(num_shards)]
    before = 0
    for t, (f, drop) in enumerate(zip(hash_files, drops)):
        lens = read_hashes(f)["len"].astype(np.int64)
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
        advance(entry["bytes"])
        return entry
    spool = Path(spool_dir)
    schema = pa.schema([("text", pa.string())])
    tmp = out / f".{name}.tmp"
    # a shard of the default size (128 row groups: 8 MiB of text at 64 KiB) is built in memory and written in one
    # call, its sha256 taken from memory: the writer's many small writes (and a seek each) and reading the file
    # back cost more than the copy; a larger one (--num-shards, --shard-bytes) streams to disk and is read back
    in_memory = _shard_text_bytes(spool, slices, drop_files) <= SHARD_IN_MEMORY_BYTES
    sink = pa.BufferOutputStream() if in_memory else tmp
    # zstd level 1 (pyarrow's default): real text in 64 KiB blocks compresses 2.50x against level 3's 2.63x
    # (bench/data_scale.py, section prepare) for about a third less compression CPU, and at level 3 the shards'
    # compression was a third of all of prepare's CPU (docs/data-scale.md)
    writer = pq.ParquetWriter(sink, schema, compression="zstd", compression_level=SHARD_ZSTD_LEVEL, use_dictionary=False,
                              write_statistics=False)
    documents = nbytes = row_groups = 0
    buf: list = []
    buf_bytes = 0
    current_group = 0

    def flush() -> None:
        nonlocal buf, buf_bytes, row_groups
        if buf:
            table = pa.Table.from_arrays([pa.chunked_array(buf, pa.string())], schema=schema)  # no concatenated copy
            writer.write_table(table, row_group_size=len(table))
            row_groups += 1
            advance(buf_bytes)
        buf, buf_bytes = [], 0

    try:
        for task, first, last in slices:
            for texts, sizes in _kept_texts(spool, task, first, last, drop_files):
                starts = nbytes + np.concatenate([[0], np.cumsum(sizes)[:-1]])
                groups = starts // row_group_bytes
                cuts = np.flatnonzero(np.diff(groups)) + 1
                for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(sizes)]])):
                    if groups[a] != current_group:
                        flush()
                        current_group = int(groups[a])
                    buf.append(texts.slice(int(a), int(b - a)))
                    buf_bytes += int(sizes[a:b].sum())
                documents += len(sizes)
                nbytes += int(sizes.sum())
        flush()
    finally:
        writer.close()
    sha256 = _publish(sink if in_memory else None, tmp, out / name)
    entry = {"path": name, "documents": documents, "bytes": nbytes, "row_groups": row_groups,
             "file_bytes": os.path.getsize(out / name), "sha256": sha256}
    done.write_text(json.dumps(entry))
    return {**entry, "peak_rss_bytes": peak_rss_bytes()}


def _shard_text_bytes(spool: Path, slices: list[tuple[int, int, int]], drop_files: dict[int, str]) -> int:
    """Text bytes of a shard: its slices' documents less the duplicates dropped inside them."""
    total = 0
    for task, first, last in slices:
        lens = read_hashes(spool / f"{task:06d}.hash")["len"]
        total += int(lens[first:last].sum())
        if task in drop_files:
            drop = np.load(drop_files[task])
            total -= int(lens[drop[(drop >= first) & (drop < last)]].sum())
    return total


def _kept_texts(spool: Path, task: int, first: int, last: int,
                drop_files: dict[int, str]) -> Iterator[tuple[Any, np.ndarray]]:
    """Spool task `task`'s rows [first, last) without its dropped ones (`drop_files`), one spool batch at a time:
    (the texts, a pyarrow string array; their sizes in bytes, int64), only the batches the rows overlap."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    lens = read_hashes(spool / f"{task:06d}.hash")["len"].astype(np.int64)
    keep = np.zeros(len(lens), dtype=bool)
    keep[first:last] = True
    if task in drop_files:
        keep[np.load(drop_files[task])] = False
    reader = ipc.open_file(pa.memory_map(str(spool / f"{task:06d}.arrow")))
    hi = 0
    for g in range(reader.num_record_batches):
        if hi >= last:
            break
        batch = reader.get_batch(g)  # memory-mapped: nothing is read until its bytes are used
        lo, hi = hi, hi + batch.num_rows
        if hi <= first:
            continue
        sel = np.flatnonzero(keep[lo:hi])
        if len(sel) == 0:
            continue
        column = batch.column(0)
        # a run without a dropped document is a slice (no copy until the row group is assembled)
        texts = (column.slice(int(sel[0]), len(sel)) if sel[-1] - sel[0] + 1 == len(sel)
                 else column.take(pa.Array.from_buffers(  # not pa.array: it imports pandas (jsonl.py)
                     pa.int64(), len(sel), [None, pa.py_buffer(sel.astype(np.int64))])))
        yield texts, lens[lo:hi][sel]


def _publish(buffer: Any, tmp: Path, final: Path) -> str:
    """Put the written shard at `final` (renamed from `tmp`: a reader never sees half of it); returns its sha256.
    `buffer`: the shard built in memory (a pyarrow BufferOutputStream), written to `tmp` here; None: the writer
    streamed it to `tmp`, which is read back."""
    digest = hashlib.sha256()
    if buffer is not None:
        data = buffer.getvalue()
        digest.update(data)
        with open(tmp, "wb") as f:
            f.write(data)
        del data
    else:
        with open(tmp, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    os.replace(tmp, final)
    return digest.hexdigest()
