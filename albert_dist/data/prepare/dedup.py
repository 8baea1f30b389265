"""Stage 2 of `albert-dist data prepare`: exact duplicates found from the spool's hashes, in bounded memory.

The first occurrence in input order is kept, across all files and workers. Memory: `DEDUP_ROW_BYTES` (48) per
document while that fits ``--dedup-memory`` (default 1 GiB: 22M documents); beyond that the hashes are
partitioned on disk into buckets by hash value and each bucket is deduplicated alone, so peak memory stays
~``--dedup-memory`` at any corpus size (1 TB of 4 KB documents = 250M documents = 6 GB of temporary hash files,
13 buckets).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from albert_dist.data.prepare.scan import read_hashes

#: Memory of the duplicate search per document: the hash halves (16 B), the sort order (8 B), sorted copies of
#: the halves (16 B), a mask (1 B), rounded up; a bucket also holds each document's index (8 B).
DEDUP_ROW_BYTES = 48


def _duplicates(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Positions (into ``hi``/``lo``, in increasing order of position = input order) of every document whose
    128-bit hash ``(hi, lo)`` equals that of an earlier position. Memory: ~33 bytes per document on top of the
    keys (the sort order, sorted copies, a mask).

    Only the documents whose ``hi`` half is shared (found by one unstable sort of ``hi``: numpy's SIMD sort, 11x
    a stable two-key sort here) go through the exact stable two-key search, when they are at most a quarter
    of all (so the memory bound holds); 726k documents: 185 -> ~40 ms."""
    if len(hi) < 2:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(hi)
    h = hi[order]
    shared = np.zeros(len(h), dtype=bool)
    np.equal(h[1:], h[:-1], out=shared[1:])
    del h
    shared[:-1] |= shared[1:]  # both ends of every equal pair
    count = int(np.count_nonzero(shared))
    if count == 0:
        return np.empty(0, dtype=np.int64)
    if count <= len(hi) // 4:
        candidates = np.sort(order[shared])  # input order, so the stable search keeps the first occurrence
        del order, shared
        return candidates[_duplicates_stable(hi[candidates], lo[candidates])]
    del order, shared
    return _duplicates_stable(hi, lo)


def _duplicates_stable(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """`_duplicates` by a stable sort on both halves."""
    if len(hi) < 2:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((lo, hi))  # stable: equal hashes keep input order, so the first occurrence comes first
    h, l = hi[order], lo[order]
    dup = np.empty(len(order), dtype=bool)
    dup[0] = False
    dup[1:] = (h[1:] == h[:-1]) & (l[1:] == l[:-1])
    del h, l
    return np.sort(order[dup])


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
            rows = read_hashes(f)
            hi[a:b], lo[a:b] = rows["hi"], rows["lo"]
        return _duplicates(hi, lo)
    bucket_dtype = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("gidx", "<i8")])
    work.mkdir(parents=True, exist_ok=True)
    handles = [open(work / f"bucket-{b:05d}.bin", "wb") for b in range(buckets)]
    try:
        # files in input order, chunks in order: each bucket file lists its documents in increasing gidx
        step = min(1 << 22, max(1 << 16, memory_bytes // 256))  # rows at a time: ~60 bytes each while split
        for f, base in zip(hash_files, offsets[:-1]):
            rows = read_hashes(f)
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
