"""Corpus discovery, splitting into pieces, reading documents, and the per-(rank, worker) document stream.

Unit of splitting and resuming: a *piece*. An uncompressed ``.txt`` (blank-line documents) or ``.jsonl`` file is
cut into byte ranges of about ``DataConfig.shard_piece_bytes``; a piece owns every record whose first byte lies in
its range (the Hadoop input-split rule), so pieces are disjoint and cover the file whatever the cut points. A
compressed file (``.gz``/``.zst``, not seekable) or a one-document-per-file ``.txt`` is one piece; a ``.parquet``
file gives one piece per row group. A hub dataset's own shards play the role of pieces.

Every source becomes one ``datasets.IterableDataset`` (``IterableDataset.from_generator`` over the piece list for
local files, ``datasets.load_dataset(..., streaming=True)`` for the hub), split with
``datasets.distributed.split_dataset_by_node`` over *slots*: slot = rank x num_workers + worker. Strategy:

* pieces >= slots: ``strategy="shards"``; piece i goes to slot i mod slots. Pieces are ordered by size
  (largest first) so the round-robin balances bytes; every slot reads only its own pieces.
* pieces < slots: ``strategy="examples"``: each slot reads all pieces and keeps record k when
  k mod slots == slot. Disjoint and covering, but every slot *reads* the whole source, so this is logged as a
  warning with the read amplification. It only happens for corpora smaller than slots x shard_piece_bytes.

Each slot cycles its own pieces forever (a new order of pieces and of documents inside a piece every epoch),
so no rank or worker ever runs dry; epochs are counted per slot. Hub sources stream in their stored order:
datasets' shuffle buffer is not part of its state_dict, so it would break exact resume. Resume: ``IterableDataset.state_dict()`` records
the piece index and the record index inside it; on resume datasets re-reads only the current piece up to that
record (bounded by the piece size, independent of the position in the corpus).

Bad records (malformed JSON, invalid UTF-8, empty, longer than ``max_document_bytes``, missing text field) are
yielded by the reader as skip markers, counted per reason and logged; 0-byte files are counted at planning time.
A path that does not exist or a glob that matches nothing raises ``ValueError`` when the loader is built.
"""
from __future__ import annotations

import glob as globlib
import gzip
import json
import logging
import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from albert_dist.data.config import SourceConfig

logger = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[2]
_BLOCK_BYTES = 1 << 20
#: record separators: blank-line documents (any run of >= 2 newlines), JSON lines
_SEPARATORS: dict[str, tuple[re.Pattern[bytes], int]] = {
    "blank_line": (re.compile(rb"\n\n+"), 2),
    "line": (re.compile(rb"\n"), 1),
}
_COMPRESSIONS = (".gz", ".zst")
_LOUD_SKIPS = 3  # per reason and slot, logged as warnings
_LOG_EVERY_DOCUMENTS = 100_000
SKIP_REASONS = ("empty", "invalid_utf8", "malformed_json", "missing_field", "too_long")


def resolve_path(path: str) -> Path:
    """Absolute path of ``path``: as given if absolute or existing relative to the cwd, else relative to the repo root.

    Globs are resolved the same way (on the part before the first wildcard).
    """
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if globlib.glob(str(p)) or p.exists():
        return p.resolve()
    return _REPO_ROOT / p


def discover_files(source: SourceConfig, where: str) -> list[str]:
    """Sorted, de-duplicated files of a local source.

    Raises ValueError naming ``where`` (e.g. ``data.train[0]``) when a path does not exist or a glob matches
    nothing, so a typo fails at start instead of silently training on less data.
    """
    files: list[str] = []
    for raw in source.paths:
        p = resolve_path(raw)
        if any(ch in raw for ch in "*?["):
            matches = sorted(m for m in globlib.glob(str(p), recursive=True) if os.path.isfile(m))
            if not matches:
                raise ValueError(f"{where}.paths: glob {raw!r} (resolved to {str(p)!r}) matches no file")
            files.extend(matches)
        elif p.is_dir():
            matches = sorted(str(m) for m in p.rglob("*") if m.is_file() and not m.name.startswith("."))
            if not matches:
                raise ValueError(f"{where}.paths: directory {raw!r} (resolved to {str(p)!r}) holds no file")
            files.extend(matches)
        elif p.is_file():
            files.append(str(p))
        else:
            raise ValueError(f"{where}.paths: {raw!r} (resolved to {str(p)!r}) does not exist")
    return sorted(set(files))


def file_format(path: str, declared: str) -> tuple[str, str]:
    """(kind, compression) of a file: kind in txt|jsonl|parquet, compression in ""|".gz"|".zst".

    Raises ValueError for a suffix that names no known format when ``declared`` is "auto".
    """
    name = path.lower()
    compression = next((c for c in _COMPRESSIONS if name.endswith(c)), "")
    stem = name[: len(name) - len(compression)]
    if declared != "auto":
        return declared, compression
    for kind, suffixes in (("txt", (".txt",)), ("jsonl", (".jsonl", ".json")), ("parquet", (".parquet",))):
        if stem.endswith(suffixes):
            return kind, compression
    raise ValueError(f"cannot tell the format of {path!r} from its suffix; set the source's format explicitly")


#: Records of a source's first file whose keys `check_text_field` looks at.
TEXT_FIELD_PROBE_RECORDS = 16


def check_text_field(source: SourceConfig, where: str, files: Optional[list[str]] = None) -> None:
    """Check that ``source.text_field`` exists, before a single batch is read (a wrong field would otherwise
    surface only after a whole epoch, as "skipped_missing_field" counts).

    jsonl: among the first `TEXT_FIELD_PROBE_RECORDS` JSON objects of the source's first non-empty jsonl file;
    parquet: in the first parquet file's schema. txt and hub sources have nothing to check here.

    Raises:
        ValueError: "<where>.text_field='x' is not a key of the first N records of <file> (keys found: ...)".
    """
    files = discover_files(source, where) if files is None else files
    for path in files:
        kind, compression = file_format(path, source.format)
        if kind not in ("jsonl", "parquet") or os.path.getsize(path) == 0:
            continue
        if kind == "parquet":
            import pyarrow.parquet as pq

            keys = list(pq.ParquetFile(path).schema_arrow.names)
            if source.text_field not in keys:
                raise ValueError(f"{where}.text_field={source.text_field!r} is not a column of {path} "
                                 f"(columns: {keys})")
            return
        keys: list[str] = []
        seen = 0
        with _open_stream(path, compression, 0) as f:
            for raw in f:
                if not raw.strip():
                    continue
                seen += 1
                try:
                    obj = json.loads(raw)
                except ValueError:
                    obj = None
                if isinstance(obj, dict):
                    if source.text_field in obj:
                        return
                    keys += [k for k in obj if k not in keys]
                if seen >= TEXT_FIELD_PROBE_RECORDS:
                    break
        if seen:
            raise ValueError(f"{where}.text_field={source.text_field!r} is not a key of the first {seen} records "
                             f"of {path} (keys found: {keys or 'none: no JSON object'})")


def plan_pieces(source: SourceConfig, where: str, piece_bytes: int) -> tuple[list[dict[str, Any]], Counter]:
    """The pieces of a local source, largest first, and planning counters (files, bytes, empty_files).

    Each piece is a JSON-able dict ``{path, kind, compression, start, end, row_group, nbytes}``.
    """
    pieces: list[dict[str, Any]] = []
    stats: Counter = Counter()
    files = discover_files(source, where)
    check_text_field(source, where, files)
    for path in files:
        kind, compression = file_format(path, source.format)
        size = os.path.getsize(path)
        stats["files"] += 1
        stats["bytes"] += size
        if size == 0:
            stats["empty_files"] += 1
            logger.warning("%s: skipping 0-byte file %s", where, path)
            continue
        base = {"path": path, "kind": kind, "compression": compression, "row_group": -1}
        if kind == "parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            for rg in range(meta.num_row_groups):
                nbytes = meta.row_group(rg).total_byte_size
                pieces.append({**base, "start": 0, "end": size, "row_group": rg, "nbytes": int(nbytes)})
        elif compression or (kind == "txt" and source.txt_documents == "file"):
            pieces.append({**base, "start": 0, "end": size, "nbytes": size})
        else:
            for start in range(0, size, piece_bytes):
                end = min(size, start + piece_bytes)
                pieces.append({**base, "start": start, "end": end, "nbytes": end - start})
    # Largest first, ties in file order: round-robin over slots then balances the bytes per slot.
    pieces.sort(key=lambda pc: -pc["nbytes"])
    return pieces, stats


def split_records(
    read: Callable[[int], bytes], separator: str, start: int, end: float, max_bytes: int, offsets: bool = False
) -> Iterator[tuple]:
    """Records (between separators) that begin in the byte range [start, end) of a stream.

    ``read`` must return the stream from offset ``max(0, start - len_sep)`` on (the caller seeks there). Yields
    ``(record, nbytes)`` (with `offsets`: ``(record, nbytes, offset of the record's first byte)``); ``record`` is
    None when ``nbytes > max_bytes`` (then the record was never held in memory beyond ``max_bytes`` + one
    block). Memory: O(max_bytes + 1 MiB).
    """
    sep_re, min_sep = _SEPARATORS[separator]
    # Bytes before offset 0 count as newlines, so the file's first record starts a record like any other.
    buf = b"\n" * max(0, min_sep - start) + read(_BLOCK_BYTES)
    base = start - min_sep  # stream offset of buf[0]
    eof = False

    def next_match(pos: int, limit: int) -> tuple[Optional[re.Match[bytes]], bool, int]:
        """First complete separator match at or after buf[pos]; drops bytes past ``limit`` (overflowed)."""
        nonlocal buf, base, eof
        overflowed = False
        while True:
            m = sep_re.search(buf, pos)
            if m is not None and (m.end() < len(buf) or eof):
                return m, overflowed, pos
            if m is None and eof:
                return None, overflowed, pos
            if len(buf) - pos > limit:
                cut = m.start() if m is not None else len(buf) - min_sep
                buf, base, pos, overflowed = buf[cut:], base + cut, 0, True
            more = read(_BLOCK_BYTES)
            if more:
                buf += more
            else:
                eof = True

    m, _, _ = next_match(0, _BLOCK_BYTES)
    if m is None:
        return
    p = m.end()
    while base + p < end and not (eof and p >= len(buf)):
        if p > _BLOCK_BYTES:  # drop consumed bytes now and then, never per record (that would be quadratic)
            buf, base, p = buf[p:], base + p, 0
        rec_start = base + p
        m, overflowed, p = next_match(p, max_bytes)
        stop = len(buf) if m is None else m.start()
        nbytes = base + stop - rec_start
        record = None if overflowed or nbytes > max_bytes else buf[p:stop]
        yield (record, nbytes, rec_start) if offsets else (record, nbytes)
        if m is None:
            return
        p = m.end()


def _open_stream(path: str, compression: str, offset: int):
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    f = open(path, "rb")
    f.seek(offset)
    return f


def _text_record(raw: Optional[bytes], nbytes: int) -> dict[str, Any]:
    if raw is None:
        return {"text": "", "skip": "too_long", "nbytes": nbytes}
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return {"text": "", "skip": "invalid_utf8", "nbytes": nbytes}
    return {"text": text, "skip": "" if text else "empty", "nbytes": nbytes}


def _json_record(raw: Optional[bytes], nbytes: int, text_field: str) -> dict[str, Any]:
    if raw is None:
        return {"text": "", "skip": "too_long", "nbytes": nbytes}
    if not raw.strip():
        return {"text": "", "skip": "empty", "nbytes": nbytes}
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {"text": "", "skip": "invalid_utf8", "nbytes": nbytes}
    except ValueError:
        return {"text": "", "skip": "malformed_json", "nbytes": nbytes}
    text = obj.get(text_field) if isinstance(obj, dict) else None
    if not isinstance(text, str):
        return {"text": "", "skip": "missing_field", "nbytes": nbytes}
    text = text.strip()
    return {"text": text, "skip": "" if text else "empty", "nbytes": nbytes}


def read_piece(piece: dict[str, Any], text_field: str, txt_documents: str, max_bytes: int) -> Iterator[dict]:
    """Records ``{"text", "skip", "nbytes", "path", "pos"}`` of one piece in file order; ``skip`` names why a
    record is unusable, ``pos`` is where it starts (`record_location` turns it into file:line for a message)."""
    for record, pos in _read_piece(piece, text_field, txt_documents, max_bytes):
        yield {**record, "path": piece["path"], "pos": pos, "group": piece["row_group"]}


def record_location(piece_kind: str, compression: str, path: str, pos: int, row_group: int = -1) -> str:
    """Where a record is, for a message: "file:line" for uncompressed txt/jsonl (`pos` a byte offset; the line is
    counted now, so call it for the few records that are reported), "file, byte N of the decompressed stream",
    or "file, row group g row i" for parquet."""
    if piece_kind == "parquet":
        return f"{path}, row group {row_group} row {pos}"
    if compression:
        return f"{path}, byte {pos} of the decompressed stream"
    lines, left = 0, pos
    with open(path, "rb") as fh:
        while left > 0 and (block := fh.read(min(_BLOCK_BYTES, left))):
            lines += block.count(b"\n")
            left -= len(block)
    return f"{path}:{lines + 1}"


def _read_piece(piece: dict[str, Any], text_field: str, txt_documents: str, max_bytes: int):
    kind, path = piece["kind"], piece["path"]
    if kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).read_row_group(piece["row_group"], columns=[text_field])
        for row, value in enumerate(table.column(0).to_pylist()):
            if not isinstance(value, str):
                yield {"text": "", "skip": "missing_field", "nbytes": 0}, row
                continue
            nbytes = len(value.encode("utf-8"))
            text = value.strip() if nbytes <= max_bytes else ""
            skip = "too_long" if nbytes > max_bytes else ("" if text else "empty")
            yield {"text": text, "skip": skip, "nbytes": nbytes}, row
        return
    if kind == "txt" and txt_documents == "file":
        with _open_stream(path, piece["compression"], 0) as f:
            raw = f.read(max_bytes + 1)
            nbytes = len(raw)
            while len(chunk := f.read(_BLOCK_BYTES)) > 0:  # count the rest of an oversized file without holding it
                nbytes += len(chunk)
        yield _text_record(raw if nbytes <= max_bytes else None, nbytes), 0
        return
    separator = "line" if kind == "jsonl" else "blank_line"
    start = piece["start"]
    end = piece["end"] if not piece["compression"] else float("inf")
    lead = _SEPARATORS[separator][1]
    with _open_stream(path, piece["compression"], max(0, start - lead)) as f:
        for raw, nbytes, pos in split_records(f.read, separator, start, end, max_bytes, offsets=True):
            yield (_json_record(raw, nbytes, text_field) if kind == "jsonl" else _text_record(raw, nbytes)), pos


def _generate_records(pieces: list[dict], text_field: str, txt_documents: str, max_bytes: int, order_seed: int):
    """datasets generator: the records of each piece, documents shuffled inside a piece when order_seed >= 0."""
    for piece in pieces:
        records = read_piece(piece, text_field, txt_documents, max_bytes)
        if order_seed < 0:
            yield from records
            continue
        # A piece is bounded (shard_piece_bytes), so holding it to shuffle its documents is bounded too.
        records = list(records)
        # seeded by the file *name* and range, so moving the corpus keeps the order (and a saved resume state)
        name = zlib.crc32(os.path.basename(piece["path"]).encode())
        rng = np.random.default_rng([order_seed, piece["start"], piece["row_group"] + 1, name])
        for i in rng.permutation(len(records)):
            yield records[i]


class SourceStream:
    """The documents of one source that belong to one slot (rank x workers + worker), cycled forever.

    ``next_document()`` returns ``(text, key)`` where ``key = (epoch, index of the document in this slot's
    epoch)`` identifies the document for seeding; unusable records are counted in ``counters`` and skipped.
    ``state_dict()`` is JSON-able: epoch, position and the datasets ``IterableDataset.state_dict()``.
    Raises ValueError when a whole epoch of this slot holds no usable document (instead of spinning forever).
    """

    def __init__(
        self,
        source: SourceConfig,
        where: str,
        pieces: Optional[list[dict]],
        slot: int,
        num_slots: int,
        seed: int,
        shuffle: bool,
        max_document_bytes: int,
    ) -> None:
        self.source, self.where = source, where
        self.pieces, self.slot, self.num_slots = pieces, slot, num_slots
        self.seed, self.shuffle, self.max_document_bytes = seed, shuffle, max_document_bytes
        self.epoch = 0
        self.docs_in_epoch = 0
        self.single_document = False  # the last finished epoch of this slot held exactly one document
        self.records_in_epoch = 0
        self.counters: Counter = Counter()
        self._ds = None
        self._it: Optional[Iterator] = None
        self._resume_ds_state: Optional[dict] = None

    # -- datasets plumbing -------------------------------------------------------------------------------------
    def _epoch_pieces(self) -> list[dict]:
        """This epoch's piece list: only the positions this slot owns (i mod slots == slot) are permuted."""
        assert self.pieces is not None
        pieces = list(self.pieces)
        if self.shuffle and len(pieces) >= self.num_slots:
            own = np.arange(self.slot, len(pieces), self.num_slots)
            perm = np.random.default_rng([self.seed, self.epoch, self.slot, 7]).permutation(own)
            for dst, src in zip(own, perm):
                pieces[dst] = self.pieces[src]
        return pieces

    def _build(self):
        import datasets
        from datasets.distributed import split_dataset_by_node

        if self.pieces is not None:
            order_seed = int(np.random.default_rng([self.seed, self.epoch, 11]).integers(2**31)) if self.shuffle else -1
            ds = datasets.IterableDataset.from_generator(
                _generate_records,
                gen_kwargs={
                    "pieces": self._epoch_pieces(),
                    "text_field": self.source.text_field,
                    "txt_documents": self.source.txt_documents,
                    "max_bytes": self.max_document_bytes,
                    "order_seed": order_seed,
                },
            )
        else:
            ds = datasets.load_dataset(
                self.source.paths[0], name=self.source.hub_config, split=self.source.hub_split, streaming=True,
                data_files=[str(resolve_path(f)) for f in self.source.hub_data_files] or None,
            )
        strategy = "shards" if ds.num_shards >= self.num_slots else "examples"
        ds = split_dataset_by_node(ds, rank=self.slot, world_size=self.num_slots, strategy=strategy)
        if self._resume_ds_state is not None:
            ds.load_state_dict(self._resume_ds_state)
            self._resume_ds_state = None
        self._ds = ds
        # .iter() rather than iter(ds): datasets would otherwise split shards again inside a DataLoader worker,
        # but our slots already account for the workers.
        self._it = ds.iter(batch_size=1)

    def _record(self, raw: dict) -> dict:
        if self.pieces is not None:
            return {k: v[0] for k, v in raw.items()}
        value = raw.get(self.source.text_field, [None])[0]
        if not isinstance(value, str):
            return {"text": "", "skip": "missing_field", "nbytes": 0}
        nbytes = len(value.encode("utf-8"))
        if nbytes > self.max_document_bytes:
            return {"text": "", "skip": "too_long", "nbytes": nbytes}
        text = value.strip()
        return {"text": text, "skip": "" if text else "empty", "nbytes": nbytes}

    # -- public API --------------------------------------------------------------------------------------------
    def next_document(self) -> tuple[str, tuple[int, int]]:
        """Next usable document text of this slot and its key ``(epoch, index in epoch)``."""
        while True:
            if self._it is None:
                self._build()
            try:
                raw = next(self._it)
            except StopIteration:
                self._end_epoch()
                continue
            rec = self._record(raw)
            self.records_in_epoch += 1
            self.counters["bytes"] += rec["nbytes"]
            if rec["skip"]:
                name = f"skipped_{rec['skip']}"
                self.counters[name] += 1
                # the first few of each kind loudly (with file:line), the rest in the epoch and periodic summaries
                if self.counters[name] <= _LOUD_SKIPS:
                    logger.warning("%s slot %d: skipped the record at %s (%s, %d bytes; %d such so far)", self.where,
                                   self.slot, self._location(rec), rec["skip"], rec["nbytes"], self.counters[name])
                else:
                    logger.debug("%s slot %d: skipped a record (%s, %d bytes, record %d of epoch %d)", self.where,
                                 self.slot, rec["skip"], rec["nbytes"], self.records_in_epoch - 1, self.epoch)
                continue
            key = (self.epoch, self.docs_in_epoch)
            self.docs_in_epoch += 1
            self.counters["documents"] += 1
            if self.counters["documents"] % _LOG_EVERY_DOCUMENTS == 0:
                logger.info("%s slot %d/%d: %d documents, %d bytes read so far, skipped %s", self.where, self.slot,
                            self.num_slots, self.counters["documents"], self.counters["bytes"],
                            {k: v for k, v in self.counters.items() if k.startswith("skipped_")} or "none")
            return rec["text"], key

    def _location(self, rec: dict) -> str:
        """Where a record is: file:line (local sources), else its number in this slot's epoch (hub)."""
        path = rec.get("path")
        if not path:
            return f"record {self.records_in_epoch - 1} of epoch {self.epoch} of {self.source.paths[0]}"
        kind, compression = file_format(path, self.source.format)
        return record_location(kind, compression, path, int(rec["pos"]), int(rec.get("group", -1)))

    def _end_epoch(self) -> None:
        skipped = {k: v for k, v in self.counters.items() if k.startswith("skipped_")}
        logger.info(
            "%s slot %d/%d: epoch %d done: %d documents, %d records; totals %d documents, %d bytes, skipped %s",
            self.where, self.slot, self.num_slots, self.epoch, self.docs_in_epoch, self.records_in_epoch,
            self.counters["documents"], self.counters["bytes"], skipped or "none",
        )
        if self.docs_in_epoch == 0:
            raise ValueError(
                f"{self.where}: slot {self.slot} of {self.num_slots} (rank x num_workers + worker) got no usable "
                f"document in a whole epoch ({self.records_in_epoch} records, skipped {skipped or 'none'}); "
                "the source is empty or too small for this many ranks x workers"
            )
        # one document in this slot's share: the loader warns once how often it repeats (it knows the batches)
        self.single_document = self.docs_in_epoch == 1
        self.epoch += 1
        self.docs_in_epoch = 0
        self.records_in_epoch = 0
        self._it = None

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: epoch, documents/records read in it, the datasets state and the counters."""
        ds_state = self._ds.state_dict() if self._it is not None else self._resume_ds_state
        return {
            "epoch": self.epoch,
            "docs_in_epoch": self.docs_in_epoch,
            "records_in_epoch": self.records_in_epoch,
            "datasets": ds_state,
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the position ``state`` was taken at (same slots and pieces required)."""
        self.epoch = int(state["epoch"])
        self.docs_in_epoch = int(state["docs_in_epoch"])
        self.records_in_epoch = int(state["records_in_epoch"])
        self.counters = Counter(state["counters"])
        self._resume_ds_state = state["datasets"]
        self._ds, self._it = None, None


def iter_texts(sources: list[SourceConfig], where: str, max_document_bytes: int) -> Iterator[str]:
    """Every usable document text of local sources in file order (single process; for tokenizer training)."""
    for i, source in enumerate(sources):
        if source.format == "hub":
            raise ValueError(f"{where}[{i}]: hub sources are not supported here, got {source.paths!r}")
        pieces, _ = plan_pieces(source, f"{where}[{i}]", 1 << 62)
        for piece in sorted(pieces, key=lambda pc: (pc["path"], pc["start"], pc["row_group"])):
            for rec in read_piece(piece, source.text_field, source.txt_documents, max_document_bytes):
                if not rec["skip"]:
                    yield rec["text"]
