"""Where a corpus is and how it is cut: file discovery, formats, pieces, and which slot reads which piece.

A *slot* is one reader of the training stream: slot = rank x num_workers + worker, slots = world_size x
max(1, num_workers). A *piece* is the unit of splitting, shuffling and resuming:

* uncompressed ``.txt`` (blank-line documents) and ``.jsonl``: byte ranges. A piece owns every record whose
  first byte lies in its range (the Hadoop input-split rule), so pieces are disjoint and cover the file
  whatever the cut points. Their size is chosen per source and slot count by `piece_bytes_for`:
  ``min(shard_piece_bytes, max(MIN_PIECE_BYTES, total / (PIECES_PER_SLOT x slots)))``, i.e. a few pieces per
  slot at any cluster size, never pieces so small that reading to the end of the record that straddles a cut
  costs much;
* ``.parquet``: one piece per row group (the smallest unit a parquet reader can seek to);
* compressed ``.gz``/``.zst`` files and one-document-per-file ``.txt``: one piece per file (a compressed stream
  cannot be entered in the middle).

Slot assignment (`slot_shares`; the loader and ``albert-dist data plan`` both call it):

* pieces >= slots: piece i (pieces ordered largest first) belongs to slot i mod slots; each slot reads only
  its own pieces (read amplification 1, bytes balanced by the largest-first round robin);
* pieces < slots: piece i is *shared* by the k slots s with s mod pieces == i; the j-th of them (j = s //
  pieces) keeps the records j, j+k, j+2k, ... of the piece. Disjoint and covering, but each of the k sharers
  reads the whole piece: the read amplification is about slots / pieces (`read_amplification`). For
  uncompressed txt/jsonl this happens only when a source is smaller than ``MIN_PIECE_BYTES`` x slots (a few
  MB per slot at most); for compressed files and parquet files with few row groups it is how they ship, and
  ``albert-dist data prepare`` rewrites them as parquet shards with enough row groups (the loader's warning
  prints the command: `albert_dist.data.sources.pieces`).

Planning reads only metadata: file sizes and parquet footers (never a record), so it is cheap for 10,000 files.
Each file is described once, when the source's files are found (`find_files` -> `CorpusFile`: path, size,
version, format, compression, parquet footer), and that record is handed on: the text-field check, `cut_pieces`,
the sampler and prepare's scan read it, and each piece carries its file's format, size and version to the
readers, so no stage derives them again. `read_footer` is the one reader of a parquet footer. An object store's
requests are retried under the policy the caller hands in (``retry``: `albert_dist.data.sources.store.RetryPolicy`,
the job's ``data.store_retry_s``), which each `CorpusFile` keeps for its footer.
"""
from __future__ import annotations

import functools
import glob as globlib
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from albert_dist.data.sources import store
from albert_dist.data.sources.store import DEFAULT_RETRY, RetryPolicy
from albert_dist.data.config import SourceConfig

logger = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[3]
#: stream compressions understood for txt/jsonl (parquet compresses inside, by column chunk)
COMPRESSIONS = (".gz", ".zst")
#: suffixes of each kind, after the compression suffix is removed
KIND_SUFFIXES = (("txt", (".txt",)), ("jsonl", (".jsonl", ".json")), ("parquet", (".parquet", ".pq")))
#: file names a directory or glob source never reads: the manifest `albert-dist data prepare` writes beside its
#: shards (a .json file that is no corpus)
NOT_CORPUS_FILES = ("manifest.json",)
#: Conventional side files beside a corpus's shards, skipped (with one counted line per source) when found through
#: a directory or glob, as Spark and HF datasets skip them: Spark/Hadoop's ``_SUCCESS``, ``_committed_*``,
#: ``_started_*`` markers and ``.crc`` checksums, an HF dataset snapshot's README/LICENSE, and dotfiles.
SIDE_FILE_PREFIXES = ("_SUCCESS", "_committed_", "_started_", "README", "LICENSE", "LICENCE", ".")
SIDE_FILE_SUFFIXES = (".crc",)
#: Smallest automatic piece of an uncompressed file. Reading a piece reads past its end to finish the record
#: that straddles the cut and skips the start of the one straddling its beginning, so pieces well above a
#: typical document (a few KB) keep that overhead to a few percent.
MIN_PIECE_BYTES = 64 << 10
#: Uncompressed pieces aimed at per slot: several, so bytes balance across slots and a slot's epoch is shuffled
#: over several pieces.
PIECES_PER_SLOT = 4


def resolve_path(path: str) -> Path:
    """Absolute path of ``path``: as given if absolute or existing relative to the cwd, else relative to the repo root.

    Globs are resolved the same way (on the part before the first wildcard). For a path that may be an object
    store URL use `resolve_location`.
    """
    p = Path(store.local_path(path)).expanduser()
    if p.is_absolute():
        return p
    if globlib.glob(str(p)) or p.exists():
        return p.resolve()
    return _REPO_ROOT / p


def resolve_location(path: str) -> str:
    """An fsspec URL (``s3://...``, `albert_dist.data.sources.store.is_url`) as given, else `resolve_path` as a string."""
    return path if store.is_url(path) else str(resolve_path(path))


def _corpus_file(path: str) -> bool:
    name = os.path.basename(path)
    return name not in NOT_CORPUS_FILES and not is_side_file(name)


def is_side_file(name: str) -> bool:
    """True for a conventional side file (`SIDE_FILE_PREFIXES`, `SIDE_FILE_SUFFIXES`; README matched in any case)."""
    upper = name.upper()
    return (name.startswith(SIDE_FILE_PREFIXES) or upper.startswith(("README", "LICENSE", "LICENCE"))
            or name.lower().endswith(SIDE_FILE_SUFFIXES))


def _corpus_files(where: str, hits: list[str], none_found: str) -> list[str]:
    """The corpus files among a glob's or a directory's `hits`, sorted (side files noted by `_note_side_files`);
    raises ValueError ``<where>.paths: <none_found>`` when there is none."""
    _note_side_files(where, hits)
    matches = sorted(m for m in hits if _corpus_file(m))
    if not matches:
        raise ValueError(f"{where}.paths: {none_found}")
    return matches


def _note_side_files(where: str, found: list[str]) -> None:
    side = [f for f in found if is_side_file(os.path.basename(f))]
    if side:
        names = sorted({os.path.basename(f) for f in side})
        logger.info("%s: ignored %d side file(s) (Spark/Hadoop markers, checksums, README/LICENSE, dotfiles): %s%s",
                    where, len(side), ", ".join(names[:5]), ", ..." if len(names) > 5 else "")


def discover_files(source: SourceConfig, where: str, retry: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Sorted, de-duplicated files of a local source (an object store's listed under ``retry``).

    Directories are walked recursively; ``manifest.json`` (`NOT_CORPUS_FILES`) and conventional side files
    (`is_side_file`: ``_SUCCESS``, ``.crc``, README/LICENSE, dotfiles...) found through a directory or glob are left
    out, the side files with one counted log line (a file named explicitly is always read).

    Raises ValueError naming ``where`` (e.g. ``data.train[0]``) when a path does not exist, a glob matches
    nothing, or a file is not readable, so a typo fails at start instead of silently training on less data.
    """
    files: list[str] = []
    for raw in source.paths:
        if store.is_url(raw):
            try:
                what, found = store.expand(raw, retry)
            except store.StoreError as err:
                raise ValueError(f"{where}.paths: {err}") from None
            if what == "missing":
                raise ValueError(f"{where}.paths: {raw!r} does not exist")
            if what != "file":
                _note_side_files(where, found)
                found = [m for m in found if _corpus_file(m)]
            if not found:
                raise ValueError(f"{where}.paths: {'glob' if what == 'glob' else 'prefix'} {raw!r} "
                                 f"{'matches' if what == 'glob' else 'holds'} no object")
            files.extend(found)
            continue
        p = resolve_path(raw)
        if any(ch in raw for ch in "*?["):
            hits = [m for m in globlib.glob(str(p), recursive=True) if os.path.isfile(m)]
            files.extend(_corpus_files(where, hits, f"glob {raw!r} (resolved to {str(p)!r}) matches no file"))
        elif p.is_dir():
            hits = [str(m) for m in p.rglob("*") if m.is_file()]
            files.extend(_corpus_files(where, hits, f"directory {raw!r} (resolved to {str(p)!r}) holds no file"))
        elif p.is_file():
            files.append(str(p))
        else:
            raise ValueError(f"{where}.paths: {raw!r} (resolved to {str(p)!r}) does not exist")
    files = sorted(set(files))
    unreadable = [f for f in files if not store.is_url(f) and not os.access(f, os.R_OK)]
    if unreadable:
        raise ValueError(f"{where}.paths: {len(unreadable)} file(s) not readable (permission denied), e.g. "
                         f"{unreadable[0]}")
    return files


@dataclass
class CorpusFile:
    """One file of a source, described once when the source's files are found (`find_files`) and handed on.

    ``path``: a local path or an fsspec URL; ``size``: bytes; ``version``: a local file's mtime_ns, an object's
    ETag or generation (`albert_dist.data.sources.store.stat`); ``kind``: txt | jsonl | parquet; ``compression``:
    "" | ".gz" | ".zst" (`file_format`); ``retry``: the policy its object is read under (the job's, handed to
    `find_files`). The parquet footer is read on first use (`footer`)."""

    path: str
    size: int
    version: str
    kind: str
    compression: str
    _footer: Optional[tuple] = field(default=None, repr=False, compare=False)
    retry: RetryPolicy = field(default=DEFAULT_RETRY, repr=False, compare=False)

    def footer(self):
        """The parquet footer (pyarrow ``FileMetaData``, `read_footer`), read once for this record, a damaged one
        included: raises what pyarrow raised for it on every call; a store error (`store.StoreError`,
        `store.StoreUnavailable`) is raised and not kept."""
        if self._footer is None:
            try:
                self._footer = (read_footer(self.path, self.size, self.version, self.retry), None)
            except (store.StoreError, store.StoreUnavailable):
                raise
            except Exception as err:  # noqa: BLE001 - a damaged footer: each caller decides (skip, warn)
                self._footer = (None, err)
        meta, err = self._footer
        if err is not None:
            raise err
        return meta


def find_files(source: SourceConfig, where: str, retry: RetryPolicy = DEFAULT_RETRY) -> list[CorpusFile]:
    """The files of a local or object-store source (`discover_files`), each described once (`CorpusFile`,
    keeping ``retry``, the policy of every request made for them).

    Raises ValueError naming ``where`` as `discover_files` and `file_format` do (every file's format is checked
    before any size is read); `store.StoreError` / OSError for a file that cannot be stat'ed."""
    paths = discover_files(source, where, retry)
    try:
        formats = [file_format(path, source.format, source.paths) for path in paths]
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    records = []
    for path, (kind, compression) in zip(paths, formats):
        st = store.stat(path, retry)
        records.append(CorpusFile(path, int(st["size"]), str(st["version"]), kind, compression, retry=retry))
    return records


def file_format(path: str, declared: str, source_paths: Optional[Sequence[str]] = None) -> tuple[str, str]:
    """(kind, compression) of a file: kind in txt|jsonl|parquet, compression in ""|".gz"|".zst".

    ``source_paths``: the source's ``paths``, so that the refusal of a file of unknown suffix gives the right
    hint: one found through a directory or glob of them (a script or notes beside the data) is left out by a
    glob naming only the data files; a format set for the source would read it as data too.

    Raises ValueError naming the file for a suffix that names no known format when ``declared`` is "auto", and
    for a compressed parquet file (parquet compresses inside; a .gz/.zst around it cannot be read in place).
    """
    name = path.lower()
    compression = next((c for c in COMPRESSIONS if name.endswith(c)), "")
    stem = name[: len(name) - len(compression)]
    kind = declared
    if declared == "auto":
        kind = next((k for k, suffixes in KIND_SUFFIXES if stem.endswith(suffixes)), "")
        if not kind:
            known = ", ".join(s for _, suffixes in KIND_SUFFIXES for s in suffixes)
            base = os.path.basename(path)
            named = source_paths is None or path in {r if store.is_url(r) else str(resolve_path(r))
                                                     for r in source_paths}
            # a side file named one by one is what an unquoted glob gives (the shell expanded dir/* into it)
            if is_side_file(base):
                hint = (f"; {base} is a side file that a quoted glob or a directory skips: quote the glob "
                        "('dir/*') so the shell does not expand it")
            elif not named:
                hint = (f"; {base} is no data file but lies in the source's directory or glob: name only the "
                        f"data files with a glob ('{os.path.dirname(path)}/*.<suffix>') or move it out")
            else:
                hint = "; set the source's format explicitly"
            raise ValueError(f"cannot tell the format of {path} from its suffix (known: {known}, each optionally "
                             f"{' or '.join(COMPRESSIONS)}){hint}")
    if kind == "parquet" and compression:
        raise ValueError(f"{path}: a parquet file compressed as a whole ({compression}) cannot be read in place; "
                         f"decompress it (parquet compresses its column chunks itself) or convert it with "
                         f"`albert-dist data prepare`")
    return kind, compression


def piece_bytes_for(splittable_bytes: int, shard_piece_bytes: int, slots: int) -> int:
    """Size of the byte-range pieces of a source's uncompressed txt/jsonl files (see the module docstring):
    ``min(shard_piece_bytes, max(MIN_PIECE_BYTES, ceil(splittable_bytes / (PIECES_PER_SLOT x slots))))``.

    ``splittable_bytes``: the bytes of the source's uncompressed txt/jsonl files; ``slots``: ranks x workers
    (>= 1). ``shard_piece_bytes`` is an upper bound the user sets (and a lower one too when it is below the floor).
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    per_slot = -(-max(1, splittable_bytes) // (PIECES_PER_SLOT * slots))
    return min(shard_piece_bytes, max(MIN_PIECE_BYTES, per_slot))


#: Parquet footers kept parsed per process (`parquet_file`). A parsed footer costs ~1 KB per row group and
#: column (measured with pyarrow 25: 122 KB for a `data prepare` shard of 128 row groups), so 4096 shards of
#: 128 row groups (a 2 TiB prepared corpus) hold ~0.5 GB in a rank, shared with its forked DataLoader workers.
PARQUET_METADATA_CACHE_FILES = 4096


@functools.lru_cache(maxsize=PARQUET_METADATA_CACHE_FILES)
def read_footer(path: str, size: int, version: str, retry: RetryPolicy = DEFAULT_RETRY):
    """The one reader of a parquet footer: pyarrow ``FileMetaData`` of a local file, or of an object from its
    footer's bytes alone (`albert_dist.data.sources.store.parquet_metadata`: ranged GETs under ``retry``), parsed
    once per process, (path, size in bytes, version) and policy (a job has one; `PARQUET_METADATA_CACHE_FILES`).
    Raises what pyarrow raises for a missing file or a damaged footer (nothing is cached then),
    `store.StoreError` for an unreadable object."""
    import pyarrow.parquet as pq

    if store.is_url(path):
        return store.parquet_metadata(path, size, retry)
    return pq.read_metadata(path)


def parquet_metadata(path: str, size: Optional[int] = None, version: Optional[str] = None,
                     retry: RetryPolicy = DEFAULT_RETRY):
    """`read_footer` of ``path``; its size and version from `store.stat` unless given (a piece carries its file's:
    ``file_bytes``, ``version``)."""
    if size is None or version is None:
        st = store.stat(path, retry)
        size, version = st["size"], st["version"]
    return read_footer(path, int(size), str(version), retry)


def piece_footer(piece: dict[str, Any], retry: RetryPolicy = DEFAULT_RETRY):
    """The parquet footer of a piece's file, from the size and version its `CorpusFile` handed on (`read_footer`;
    read under ``retry`` when this process has not parsed it)."""
    return parquet_metadata(piece["path"], piece.get("file_bytes"), piece.get("version"), retry)


def parquet_file(path: str, meta=None, retry: RetryPolicy = DEFAULT_RETRY):
    """``pyarrow.parquet.ParquetFile(path)`` with its footer parsed once per process and file version (``meta``:
    the footer when the caller holds it: `CorpusFile.footer`, `piece_footer`).

    Why: opening a ParquetFile reads the footer again, and pyarrow reads it with one speculative read of the
    file's last 64 KiB; a reader that opens the file once per row group of a few tens of KB (what `data prepare`
    writes for a cluster) then reads each byte ~3 times (bench/data_scale.py: 3.07 before this cache, 1.0 after).
    Planning (`cut_pieces`) fills the cache in the rank's process, and DataLoader workers forked from it
    inherit it (spawned workers parse each footer they need once). An object's bytes are read under ``retry``.
    Raises what pyarrow raises for a missing file or a damaged footer (nothing is cached then).
    """
    import pyarrow.parquet as pq

    meta = parquet_metadata(path, retry=retry) if meta is None else meta
    if store.is_url(path):  # footer only: the row groups' bytes are fetched by `parquet_row_group`
        return pq.ParquetFile(store.RangedFile(path, retry=retry), metadata=meta)
    return pq.ParquetFile(path, metadata=meta)


def parquet_row_group(path: str, row_group: int, columns: list[str], meta=None, retry: RetryPolicy = DEFAULT_RETRY):
    """A ``pyarrow.parquet.ParquetFile`` to read ``columns`` of ``row_group`` from: the local file, or for a URL
    only those column chunks' byte ranges (`albert_dist.data.sources.store.parquet_row_group_file`, under
    ``retry``). ``meta``: the file's footer when the caller holds it (`piece_footer`)."""
    import pyarrow.parquet as pq

    meta = parquet_metadata(path, retry=retry) if meta is None else meta
    if not store.is_url(path):
        return parquet_file(path, meta)
    return pq.ParquetFile(store.parquet_row_group_file(path, meta, row_group, columns, retry), metadata=meta)


def _parquet_pieces(file: CorpusFile, text_field: str, base: dict[str, Any]) -> list[dict[str, Any]]:
    meta, size = file.footer(), file.size
    leaf = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == text_field), None)
    pieces = []
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        # bytes a reader of the text column fetches; the whole group when the column is nested or absent
        nbytes = group.column(leaf).total_compressed_size if leaf is not None else group.total_byte_size
        pieces.append({**base, "start": 0, "end": size, "row_group": rg, "nbytes": int(nbytes),
                       "rows": int(group.num_rows)})
    return pieces


def cut_pieces(source: SourceConfig, where: str, shard_piece_bytes: int, slots: int = 1,
               files: list[CorpusFile] | None = None,
               retry: RetryPolicy = DEFAULT_RETRY) -> tuple[list[dict[str, Any]], Counter]:
    """The pieces of a local source, largest first (ties in file order), for a job of ``slots`` slots. ``files``:
    the source's `CorpusFile` records (`find_files` under ``retry`` when not given).

    Each piece is a JSON-able dict ``{path, kind, compression, file_bytes, version, start, end, row_group,
    nbytes}`` (parquet pieces also ``rows``; ``start``, ``end`` are 0 and the file size for parquet): ``nbytes``
    is what reading it fetches from disk (the byte range, the compressed file, the row group's text column chunk);
    ``file_bytes`` and ``version`` are its file's (`CorpusFile`), handed on to the readers. Counters: ``files``,
    ``bytes``, ``empty_files``, ``damaged_files`` (a parquet footer that does not parse: skipped with a warning),
    ``piece_bytes`` (the byte-range size chosen by `piece_bytes_for`). Reads only metadata: the text field is checked
    by `albert_dist.data.sources.read.check_text_field`.

    Raises ValueError as `find_files` does.
    """
    stats: Counter = Counter()
    files = find_files(source, where, retry) if files is None else files
    whole_files = source.txt_documents == "file"
    splittable = sum(f.size for f in files
                     if not f.compression and (f.kind == "jsonl" or (f.kind == "txt" and not whole_files)))
    piece_bytes = piece_bytes_for(splittable, shard_piece_bytes, slots)
    stats["piece_bytes"] = piece_bytes
    pieces: list[dict[str, Any]] = []
    for file in files:
        path, kind, compression, size = file.path, file.kind, file.compression, file.size
        stats["files"] += 1
        stats["bytes"] += size
        if size == 0:
            stats["empty_files"] += 1
            logger.warning("%s: skipping 0-byte file %s", where, path)
            continue
        base = {"path": path, "kind": kind, "compression": compression, "file_bytes": size, "version": file.version,
                "row_group": -1}
        if kind == "parquet":
            try:
                pieces.extend(_parquet_pieces(file, source.text_field, base))
            except Exception as err:  # pyarrow raises ArrowInvalid/OSError for a damaged footer  # noqa: BLE001
                stats["damaged_files"] += 1
                logger.warning("%s: skipping %s: not a readable parquet file (%s: %s)", where, path,
                               type(err).__name__, err)
        elif compression or (kind == "txt" and whole_files):
            pieces.append({**base, "start": 0, "end": size, "nbytes": size})
        else:
            n = -(-size // piece_bytes)  # equal cuts: no tail piece much smaller than the others
            cuts = [size * i // n for i in range(n + 1)]
            pieces += [{**base, "start": a, "end": b, "nbytes": b - a} for a, b in zip(cuts[:-1], cuts[1:])]
    # Largest first, ties in file order: round-robin over slots then balances the bytes per slot.
    pieces.sort(key=lambda pc: -pc["nbytes"])
    return pieces, stats


def slot_shares(num_pieces: int, num_slots: int, slot: int) -> list[tuple[int, int, int]]:
    """The ``(piece index, sharers k, offset j)`` triples slot ``slot`` of ``num_slots`` reads: it keeps the
    records j, j+k, j+2k, ... (file order) of each such piece (k = 1: the whole piece). See the module docstring.

    Raises ValueError for no piece or a slot out of range.
    """
    if num_pieces < 1:
        raise ValueError(f"no piece to read (num_pieces={num_pieces})")
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot must be in [0, {num_slots}), got {slot}")
    if num_pieces >= num_slots:
        return [(i, 1, 0) for i in range(slot, num_pieces, num_slots)]
    piece = slot % num_pieces
    return [(piece, len(range(piece, num_slots, num_pieces)), slot // num_pieces)]


def readers_per_piece(num_pieces: int, num_slots: int) -> np.ndarray:
    """(num_pieces,) int64: how many slots read each piece whole (1 unless pieces < slots), per `slot_shares`."""
    if num_pieces >= num_slots:
        return np.ones(num_pieces, dtype=np.int64)
    return np.array([len(range(i, num_slots, num_pieces)) for i in range(num_pieces)], dtype=np.int64)


def read_amplification(nbytes: Iterable[int], num_slots: int) -> float:
    """Bytes all ``num_slots`` slots read in one epoch each over the bytes of the pieces (1.0 = every byte read
    once): sum_i nbytes_i x readers_i / sum_i nbytes_i, by `slot_shares`. Reading to the end of a straddling
    record at piece boundaries (a few percent) is not counted; bench/data_scale.py measures it."""
    sizes = np.asarray(list(nbytes), dtype=np.float64)
    if not len(sizes) or sizes.sum() <= 0:
        return 1.0
    return float((sizes * readers_per_piece(len(sizes), num_slots)).sum() / sizes.sum())
