"""Reading corpus files: byte streams (plain, gzip, zstd), records of a piece, damaged input, the text-field check.

Formats (see `albert_dist.data.sources.discover` for how files are cut into pieces): ``.txt`` documents separated by blank
lines (or one document per file), ``.jsonl``/``.json`` one JSON object per line with the text under
``text_field``, ``.parquet`` the ``text_field`` column (any codec pyarrow reads: none, snappy, gzip, zstd, ...);
txt and jsonl optionally compressed as ``.gz`` or ``.zst`` (several gzip members or zstd frames are one stream).

Bad records never stop reading: `read_piece` yields them as *skip markers* (``skip`` = one of `SKIP_REASONS`),
which the streams count and log. A *damaged* file (a ``.gz``/``.zst`` that is truncated or corrupt, a parquet row
group that does not decode, an I/O error) ends its piece with one ``damaged`` marker that says where (file,
decompressed byte or parquet row, compressed byte) and why: the rest of that piece is skipped, the run goes on,
and since the marker sits at the same place in the piece every time, a resume that re-reads the piece meets it
again at the same position instead of crashing (there is no crash loop to fall into).

A truncated zstd stream is detected here: zstandard's ``stream_reader`` returns a short read without an error
when the file ends inside a frame (checked with zstandard 0.25), so `open_stream` decodes frames itself.

An object store's bytes are read under the retry policy the caller hands in (``retry``,
`albert_dist.data.sources.store.RetryPolicy`: a training stream's own, from its ``data.store_retry_s``).
"""
from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import zlib
from typing import Any, Callable, Iterator, Optional

from albert_dist.data.sources import store
from albert_dist.data.sources.store import DEFAULT_RETRY, RetryPolicy
from albert_dist.exit_codes import InputVanished
from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.discover import CorpusFile, find_files, parquet_file, parquet_row_group, piece_footer

logger = logging.getLogger(__name__)

_BLOCK_BYTES = 1 << 20
#: how far past its end the first read of a byte range goes (the record that straddles the end is usually
#: finished by then, so a small piece costs one read), and the first read after that: each later one doubles,
#: so a piece reads about one record past its end, whatever the record's size
_OVERREAD_BYTES = 2 << 10
_MIN_READ_BYTES = 4 << 10
#: compressed bytes handed to the zstd decoder at a time (its output per call is bounded by this x the ratio)
_ZSTD_INPUT_BYTES = 64 << 10
#: rows decoded at a time from a parquet row group (memory bounded by this x max_document_bytes)
_PARQUET_BATCH_ROWS = 256
#: spaces/tabs/CRs a line may hold and still be blank: raw WikiText-2 separates its articles with " \n" lines, which
#: a strict "\n\n" rule read as one 10 MB document (skipped as too long: the whole corpus lost). Bounded, because a
#: reader must find the separator that ends at its range's start by reading back a fixed number of bytes.
BLANK_LINE_MAX_SPACES = 16
#: record separators and the bytes a range's reader reads back before its start to find the separator that ends
#: there: blank-line documents (a run of newlines with at most BLANK_LINE_MAX_SPACES blanks on each line
#: between; greedy, so a match ends at the run's end wherever the search enters it), JSON lines
_SEPARATORS: dict[str, tuple[re.Pattern[bytes], int]] = {
    "blank_line": (re.compile(rb"\n(?:[ \t\r]{0,%d}\n)+" % BLANK_LINE_MAX_SPACES), BLANK_LINE_MAX_SPACES + 2),
    "line": (re.compile(rb"\n"), 1),
}
SKIP_REASONS = ("empty", "invalid_utf8", "malformed_json", "missing_field", "too_long", "damaged")
#: Records of a source's first readable file whose keys `check_text_field` looks at.
TEXT_FIELD_PROBE_RECORDS = 16


class DamagedInput(Exception):
    """A compressed stream or parquet data that cannot be decoded past some point; ``compressed_offset`` is the
    byte of the file the decoder had reached (-1 when unknown)."""

    def __init__(self, reason: str, compressed_offset: int = -1) -> None:
        super().__init__(reason)
        self.reason, self.compressed_offset = reason, compressed_offset


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())  # one line: some library messages span several
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ---------------------------------------------------------------------------------------------------- streams
class _PlainStream:
    def __init__(self, path: str, offset: int, retry: RetryPolicy) -> None:
        # unbuffered: split_records sizes its reads to the piece, a buffer would read past them (for a URL each
        # read is one ranged GET of exactly that many bytes: albert_dist.data.sources.store.RangedFile)
        self._f = store.open_input(path, offset, retry=retry)

    def read(self, n: int) -> bytes:
        try:
            return self._f.read(n)
        except OSError as err:
            raise DamagedInput(_reason(err), self._f.tell()) from err

    def close(self) -> None:
        self._f.close()


class _DecodedStream:
    """A decoded stream that hands out what it decoded before an error, and raises the error on the next read
    (so a damaged stream loses only what cannot be decoded). Subclasses fill ``_out`` in ``_fill(n)``."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._error: Optional[DamagedInput] = None

    def _fill(self, n: int) -> None:
        raise NotImplementedError

    def _decode(self, n: int) -> None:
        """Decode toward ``n`` bytes held; raise the stored error once nothing decoded before it is left."""
        if self._error is None and len(self._out) < n:
            try:
                self._fill(n)
            except DamagedInput as err:
                self._error = err
        if not self._out and self._error is not None:
            raise self._error

    def read(self, n: int) -> bytes:
        self._decode(n)
        out = bytes(self._out[:n])
        del self._out[:n]
        return out

    def read_chunk(self, n: int) -> bytearray:
        """Like `read`, but all that the decoder gave while filling to ``n`` bytes (maybe more than ``n``),
        without copying it out (a bulk reader's 4 MiB reads: albert_dist.data.prepare.jsonl)."""
        self._decode(n)
        out, self._out = self._out, bytearray()
        return out


class _GzipStream(_DecodedStream):
    """gzip.GzipFile (every member of a concatenated file), read one input block at a time (``read1``), its
    errors turned into `DamagedInput`."""

    def __init__(self, path: str, retry: RetryPolicy) -> None:
        super().__init__()
        self._raw = store.open_input(path, 0, sequential=True, retry=retry)
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="rb")

    def _fill(self, n: int) -> None:
        while len(self._out) < n:
            try:
                data = self._gz.read1(n - len(self._out))
            except (EOFError, OSError, zlib.error) as err:  # truncated, bad CRC/magic (BadGzipFile), bad deflate
                raise DamagedInput(_reason(err), self._raw.tell()) from err
            if not data:
                return
            self._out += data

    def close(self) -> None:
        self._gz.close()
        self._raw.close()


class _ZstdStream(_DecodedStream):
    """All zstd frames of a file, decoded with ``decompressobj`` so that a file ending inside a frame is an error."""

    def __init__(self, path: str, retry: RetryPolicy) -> None:
        import zstandard

        super().__init__()
        self._zstd = zstandard
        self._raw = store.open_input(path, 0, sequential=True, retry=retry)
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._in_frame = False
        self._eof = False

    def _feed(self, data: bytes) -> None:
        while data:
            try:
                self._out += self._dobj.decompress(data)
            except self._zstd.ZstdError as err:
                raise DamagedInput(_reason(err), self._raw.tell()) from err
            self._in_frame = True
            if self._dobj.eof:  # a frame ended: the rest of `data` starts the next one
                data = self._dobj.unused_data
                self._dobj = self._dctx.decompressobj()
                self._in_frame = False
            else:
                data = b""

    def _fill(self, n: int) -> None:
        while len(self._out) < n and not self._eof:
            try:
                chunk = self._raw.read(_ZSTD_INPUT_BYTES)
            except OSError as err:
                raise DamagedInput(_reason(err), self._raw.tell()) from err
            if not chunk:
                self._eof = True
                if self._in_frame:
                    raise DamagedInput("truncated: the file ends inside a zstd frame", self._raw.tell())
                return
            self._feed(chunk)

    def close(self) -> None:
        self._raw.close()


class ReadBudget:
    """Bytes that `read_piece` may still read from the (decompressed) streams it is handed this budget for, across
    pieces: a probe's bound (`albert_dist.data.sources.pieces.check_slots_readable`), so that a reader inside a 10 GB
    one-line file stops after the budget instead of reading the line to its end. A spent budget reads as the end
    of the file: the record being read then is handed out cut short (``nbytes`` = its bytes read; ``too_long``
    if those already exceed max_bytes), and ``spent`` is set by the first read it refuses."""

    def __init__(self, nbytes: int) -> None:
        self.left = nbytes
        self.spent = False


class _BudgetedStream:
    """A stream (`open_stream`) whose reads draw on a `ReadBudget`: b"" once it is spent."""

    def __init__(self, stream, budget: ReadBudget) -> None:
        self._stream, self._budget = stream, budget

    def read(self, n: int) -> bytes:
        if self._budget.left <= 0:
            self._budget.spent = True
            return b""
        data = self._stream.read(min(n, self._budget.left))
        self._budget.left -= len(data)
        return data

    def close(self) -> None:
        self._stream.close()


def open_stream(path: str, compression: str, offset: int = 0, retry: RetryPolicy = DEFAULT_RETRY):
    """A byte stream of ``path`` with ``read(n) -> bytes`` (b"" at the end) and ``close()``: the file from
    ``offset`` when uncompressed, else the decompressed stream from its start (``offset`` must be 0); an object
    read under ``retry``. ``read`` raises `DamagedInput` for a truncated or corrupt stream and for I/O errors,
    `store.StoreUnavailable` when the store stayed down for the policy's budget."""
    if compression == ".gz":
        return _GzipStream(path, retry)
    if compression == ".zst":
        return _ZstdStream(path, retry)
    return _PlainStream(path, offset, retry)


# ---------------------------------------------------------------------------------------------------- records
def split_records(
    read: Callable[[int], bytes], separator: str, start: int, end: float, max_bytes: int, offsets: bool = False,
    block_bytes: int = _BLOCK_BYTES,
) -> Iterator[tuple]:
    """Records (between separators) that begin in the byte range [start, end) of a stream.

    ``read`` must return the stream from offset ``max(0, start - len_sep)`` on (the caller seeks there). Yields
    ``(record, nbytes)`` (with `offsets`: ``(record, nbytes, offset of the record's first byte)``); ``record`` is
    None when ``nbytes > max_bytes`` (then the record was never held in memory beyond ``max_bytes`` + one
    block). Reads are sized to the range (the first covers it and 2 KB past its end, the later ones double from
    4 KB), so a range reads little more than itself and the record that straddles its end; no read exceeds
    ``block_bytes`` (a reader that takes only the first records of a wide range, as the tokenizer's sample does,
    passes a small one so that it reads about what it takes). Memory: O(max_bytes + 1 MiB).
    """
    sep_re, min_sep = _SEPARATORS[separator]
    # Bytes before offset 0 count as newlines, so the file's first record starts a record like any other.
    stream_at = max(0, start - min_sep)  # stream offset of the next byte `read` returns

    def more() -> bytes:
        nonlocal stream_at
        past = stream_at - end  # bytes already read past the range
        want = end + _OVERREAD_BYTES - stream_at if past < 0 else max(_MIN_READ_BYTES, past)
        data = read(int(min(block_bytes, want)))
        stream_at += len(data)
        return data

    buf = b"\n" * max(0, min_sep - start) + more()
    base = start - min_sep  # stream offset of buf[0]
    eof = False

    def next_match(pos: int, limit: int, give_up_at: float = math.inf) -> tuple[Optional[re.Match[bytes]], bool, int]:
        """First complete separator match at or after buf[pos]; drops bytes past ``limit`` (overflowed). None
        once the bytes searched reach past stream offset ``give_up_at`` without any separator."""
        nonlocal buf, base, eof
        overflowed = False
        while True:
            m = sep_re.search(buf, pos)
            if m is not None and (m.end() < len(buf) or eof):
                return m, overflowed, pos
            if m is None and (eof or base + len(buf) > give_up_at):
                return None, overflowed, pos
            if len(buf) - pos > limit:
                cut = m.start() if m is not None else len(buf) - min_sep
                buf, base, pos, overflowed = buf[cut:], base + cut, 0, True
            data = more()
            if data:
                buf += data
            else:
                eof = True

    # The first record begins where the first separator ending at or after `start` ends (the bytes read back may
    # hold an earlier one: a short record before `start` belongs to the range before). A range that no separator
    # ends in begins no record: stop at its end rather than read on to the end of the record that covers it (each
    # 4 MiB range inside one 100 MB line read the rest of the line: 12.5x the file's bytes per epoch, where
    # `data plan` says 1.0).
    m, _, p = next_match(0, _BLOCK_BYTES, give_up_at=end)
    while m is not None and base + m.end() < start:
        m, _, p = next_match(m.end(), _BLOCK_BYTES, give_up_at=end)
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
    # JSON may escape a lone surrogate ("\ud800"), which json.loads decodes to a str with no UTF-8 form:
    # sentencepiece, Arrow and every writer refuse it later, so it is skipped here like undecodable bytes.
    # Only a record holding a "\ud"/"\uD" escape can have one, so the encode check runs on those alone.
    if (b"\\ud" in raw or b"\\uD" in raw) and not _encodable(text):
        return {"text": "", "skip": "invalid_utf8", "nbytes": nbytes}
    text = text.strip()
    return {"text": text, "skip": "" if text else "empty", "nbytes": nbytes}


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _damaged(piece: dict[str, Any], err: DamagedInput, retry: RetryPolicy) -> dict[str, Any]:
    size = piece.get("file_bytes")  # its file's size, handed on by the plan (`CorpusFile`)
    if size is None:
        try:
            size = store.file_size(piece["path"], retry)
        except (OSError, ValueError):
            size = -1
    at = f" near byte {err.compressed_offset} of {size}" if err.compressed_offset >= 0 else ""
    what = "parquet data" if piece["kind"] == "parquet" else (f"{piece['compression']} stream"
                                                              if piece["compression"] else "file")
    return {"text": "", "skip": "damaged", "nbytes": 0, "detail": f"damaged {what}{at}: {err.reason}"}


def read_piece(piece: dict[str, Any], text_field: str, txt_documents: str, max_bytes: int,
               share: tuple[int, int] = (1, 0), budget: Optional[ReadBudget] = None,
               retry: RetryPolicy = DEFAULT_RETRY) -> Iterator[dict]:
    """Records ``{"text", "skip", "nbytes", "detail", "path", "pos", "group"}`` of one piece in file order.

    ``skip`` names why a record is unusable ("" when usable; `SKIP_REASONS`); ``pos`` is where it starts (a
    byte offset, of the decompressed stream for .gz/.zst, or the row of parquet row group ``group``;
    `record_location` turns it into text for a message); ``detail`` says what was wrong with a damaged piece.
    ``share = (k, j)``: keep only the records j, j+k, j+2k, ... (file order, counting bad records too), before
    they are decoded (`albert_dist.data.sources.discover.slot_shares`); a ``damaged`` marker is always kept.
    A damaged piece ends with one ``damaged`` marker at the first position that could not be read; nothing is
    raised for damage. A file or object that is not there at all is not damage: `InputVanished`, one line naming
    it and what the piece expected. Memory: O(max_bytes + 1 MiB).
    ``budget``: bound the bytes read from txt/jsonl streams (`ReadBudget`; parquet row groups are not bounded).
    ``retry``: the policy an object's reads are retried under (`store.StoreUnavailable` once it gives up).
    """
    try:
        for record, pos in _read_piece(piece, text_field, txt_documents, max_bytes, share, budget, retry):
            yield {"detail": "", **record, "path": piece["path"], "pos": pos, "group": piece["row_group"]}
    except (FileNotFoundError, store.ObjectMissing) as err:
        raise InputVanished(_vanished(piece, err)) from None


def _raise_if_gone(err: BaseException) -> None:
    """A local file that is not there is not damaged: `read_piece` raises `InputVanished` for it."""
    if isinstance(err, FileNotFoundError):
        raise err


def _vanished(piece: dict[str, Any], err: BaseException) -> str:
    """One line for `InputVanished`: the file, what is wrong, and what the plan expected of it (the piece; an
    object's size and version as listed when the job planned, when this process holds them)."""
    path = piece["path"]
    what = ("does not exist (no such object)" if isinstance(err, store.ObjectMissing)
            else "no longer exists (FileNotFoundError)")
    where = (f"row group {piece['row_group']}" if piece["kind"] == "parquet"
             else f"bytes {piece['start']}-{piece['end']}" + (" (decompressed)" if piece["compression"] else ""))
    planned = store.planned_stat(path) if store.is_url(path) else None
    of = (f" of the {planned['size']}-byte object (version {planned['version']})" if planned
          else " of the file" if not store.is_url(path) else "")
    return f"{path}: {what}; the job planned to read {where}{of}"


def record_location(piece_kind: str, compression: str, path: str, pos: int, row_group: int = -1) -> str:
    """Where a record is, for a message: "file:line" for uncompressed txt/jsonl (`pos` a byte offset; the line is
    counted now, so call it for the few records that are reported), "file, byte N of the decompressed stream",
    or "file, row group g row i" for parquet."""
    if piece_kind == "parquet":
        return f"{path}, row group {row_group} row {pos}"
    if compression:
        return f"{path}, byte {pos} of the decompressed stream"
    if store.is_url(path):  # counting lines would download the object up to here
        return f"{path}, byte {pos}"
    lines, left = 0, pos
    with open(path, "rb") as fh:
        while left > 0 and (block := fh.read(min(_BLOCK_BYTES, left))):
            lines += block.count(b"\n")
            left -= len(block)
    return f"{path}:{lines + 1}"


def _open_budgeted(piece: dict[str, Any], offset: int, budget: Optional[ReadBudget], retry: RetryPolicy):
    f = open_stream(piece["path"], piece["compression"], offset, retry)
    return f if budget is None else _BudgetedStream(f, budget)


def _read_piece(piece: dict[str, Any], text_field: str, txt_documents: str, max_bytes: int,
                share: tuple[int, int], budget: Optional[ReadBudget], retry: RetryPolicy):
    kind, path = piece["kind"], piece["path"]
    k, j = share
    if kind == "parquet":
        yield from _read_row_group(piece, text_field, max_bytes, k, j, retry)
        return
    if kind == "txt" and txt_documents == "file":
        if j > 0:  # one record: the first sharer's
            return
        try:
            f = _open_budgeted(piece, 0, budget, retry)
        except OSError as err:
            _raise_if_gone(err)
            yield _damaged(piece, DamagedInput(_reason(err)), retry), 0
            return
        try:
            raw = f.read(max_bytes + 1)
            nbytes = len(raw)
            while len(chunk := f.read(_BLOCK_BYTES)) > 0:  # count the rest of an oversized file without holding it
                nbytes += len(chunk)
        except DamagedInput as err:
            yield _damaged(piece, err, retry), 0
            return
        finally:
            f.close()
        yield _text_record(raw if nbytes <= max_bytes else None, nbytes), 0
        return
    separator = "line" if kind == "jsonl" else "blank_line"
    start = piece["start"]
    end = piece["end"] if not piece["compression"] else float("inf")
    lead = _SEPARATORS[separator][1]
    read_to = start  # first byte not yet handed out: where a damaged stream's loss begins
    try:
        f = _open_budgeted(piece, max(0, start - lead), budget, retry)
    except OSError as err:
        _raise_if_gone(err)
        yield _damaged(piece, DamagedInput(_reason(err)), retry), start
        return
    try:
        for index, (raw, nbytes, pos) in enumerate(split_records(f.read, separator, start, end, max_bytes,
                                                                 offsets=True,
                                                                 block_bytes=piece.get("read_bytes", _BLOCK_BYTES))):
            read_to = pos + nbytes
            if index % k != j:
                continue
            yield (_json_record(raw, nbytes, text_field) if kind == "jsonl" else _text_record(raw, nbytes)), pos
    except DamagedInput as err:
        yield _damaged(piece, err, retry), read_to
    finally:
        f.close()


def _read_row_group(piece: dict[str, Any], text_field: str, max_bytes: int, k: int, j: int, retry: RetryPolicy):
    import pyarrow as pa

    row = 0
    try:
        # the footer parsed once per process, not once per row group; from a URL only this group's text chunk
        pf = parquet_row_group(piece["path"], piece["row_group"], [text_field], piece_footer(piece, retry), retry)
        batches = pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[piece["row_group"]],
                                  columns=[text_field], use_threads=False)
        for batch in batches:
            for value in batch.column(0).to_pylist():
                row += 1
                if (row - 1) % k != j:
                    continue
                if not isinstance(value, str):
                    yield {"text": "", "skip": "missing_field", "nbytes": 0}, row - 1
                    continue
                nbytes = len(value.encode("utf-8"))
                text = value.strip() if nbytes <= max_bytes else ""
                skip = "too_long" if nbytes > max_bytes else ("" if text else "empty")
                yield {"text": text, "skip": skip, "nbytes": nbytes}, row - 1
    except (OSError, pa.ArrowException) as err:  # a page or column chunk that does not decode, an I/O error
        _raise_if_gone(err)
        yield _damaged(piece, DamagedInput(_reason(err), _column_chunk_offset(piece, text_field, retry)), retry), row


def piece_read_ranges(piece: dict[str, Any], text_field: str, txt_documents: str,
                      retry: RetryPolicy = DEFAULT_RETRY) -> list[tuple[str, int, int]]:
    """The byte ranges ``[(path, start, end)]`` `read_piece` fetches first for ``piece`` (what
    `albert_dist.data.sources.store.ReadAhead` fetches ahead): a parquet row group's text column chunk (its
    footer read under ``retry`` when this process has not parsed it); an uncompressed byte range's first read
    (the range and `_OVERREAD_BYTES` past it). None ([]) for a compressed stream or a whole-file text document
    (read in blocks whose sizes depend on what was read)."""
    if piece["kind"] == "parquet":
        if not store.is_url(piece["path"]):
            return []
        meta = piece_footer(piece, retry)
        return [(piece["path"], a, b) for a, b in store.column_chunk_ranges(meta, piece["row_group"], [text_field])]
    if piece["compression"] or (piece["kind"] == "txt" and txt_documents == "file"):
        return []
    at = max(0, piece["start"] - _SEPARATORS["line" if piece["kind"] == "jsonl" else "blank_line"][1])
    return [(piece["path"], at, at + int(min(piece.get("read_bytes", _BLOCK_BYTES),
                                             piece["end"] + _OVERREAD_BYTES - at)))]


def _column_chunk_offset(piece: dict[str, Any], text_field: str, retry: RetryPolicy) -> int:
    """First byte of the text column's chunk in the piece's row group (-1 when the footer does not tell)."""
    try:
        meta = piece_footer(piece, retry)
        group = meta.row_group(piece["row_group"])
        for j in range(group.num_columns):
            col = group.column(j)
            if col.path_in_schema == text_field:
                return min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
    except Exception:  # noqa: BLE001 - only a detail of a message about a file already known to be damaged
        pass
    return -1


# ---------------------------------------------------------------------------------------------------- checks
def check_text_field(source: SourceConfig, where: str, files: Optional[list[CorpusFile]] = None,
                     retry: RetryPolicy = DEFAULT_RETRY) -> None:
    """Check that ``source.text_field`` exists, before a single batch is read (a wrong field would otherwise
    surface only after a whole epoch, as "skipped_missing_field" counts).

    jsonl: among the first `TEXT_FIELD_PROBE_RECORDS` JSON objects of the source's first jsonl file that holds
    a record (damaged or empty files are passed over with a warning); parquet: in the first readable parquet
    file's schema. txt and hub sources have nothing to check here. ``files``: the source's `CorpusFile` records
    (`find_files` under ``retry`` when not given: every file's format is checked first, so an unreadable kind
    fails here, not in the middle of a run); each file is read under the policy its record keeps.

    Raises:
        ValueError: "<where>.text_field='x' is not a key of the first N records of <file> (keys found: ...)",
            or "... is not a column of <file> (columns: ...)"; `find_files`' errors.
    """
    files = find_files(source, where, retry) if files is None else files
    for file in files:
        path, kind, compression = file.path, file.kind, file.compression
        if kind not in ("jsonl", "parquet") or file.size == 0:
            continue
        if kind == "parquet":
            try:
                keys = list(parquet_file(path, file.footer(), file.retry).schema_arrow.names)
            except store.StoreError:  # a missing/denied object is the user's to fix, not a damaged file
                raise
            except Exception as err:  # noqa: BLE001 - a damaged footer: cut_pieces skips the file, so do we
                logger.warning("%s: %s is not a readable parquet file (%s); checking the next one", where, path,
                               _reason(err))
                continue
            if source.text_field not in keys:
                raise ValueError(f"{where}.text_field={source.text_field!r} is not a column of {path} "
                                 f"(columns: {keys})")
            return
        keys: list[str] = []
        seen = 0
        f = open_stream(path, compression, 0, file.retry)
        try:
            # 64 KiB reads: the probe needs a few records, not the first MiB of every source (over S3 too)
            for raw, _ in split_records(f.read, "line", 0, float("inf"), 1 << 24, block_bytes=64 << 10):
                if raw is None or not raw.strip():
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
        except DamagedInput as err:
            logger.warning("%s: %s is damaged after %d records (%s)%s", where, path, seen, err.reason,
                           "" if seen else "; checking the next file")
        finally:
            f.close()
        if seen:
            raise ValueError(f"{where}.text_field={source.text_field!r} is not a key of the first {seen} records "
                             f"of {path} (keys found: {keys or 'none: no JSON object'})"
                             + ("" if keys else "; JSON lines are read: one object per line, not one JSON "
                                                "array or document per file"))
