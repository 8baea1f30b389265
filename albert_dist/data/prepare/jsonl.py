"""JSON lines read a block at a time into Arrow (pyarrow's JSON reader), for `albert-dist data prepare`'s scan.

Why: the training reader (`albert_dist.data.sources.read.read_piece`) hands out one record at a time as a Python dict,
right for a loader that needs one document now; the scan needs every document of a piece, and one Python
``json.loads`` + dict + hash per document made it 0.39x HF datasets' speed (issue 26). Here a run of complete
lines (`line_blocks`, the same records `albert_dist.data.sources.read.split_records` finds: those beginning in the
piece's byte range) is parsed by ``pyarrow.json.read_json`` into one string column (`parse_block`).

Exactly the training reader's records: a block is taken whole only when pyarrow's reading cannot differ from
``json.loads`` of each line (`parse_block`'s checks); otherwise its lines go through the training reader's own
per-record function (`albert_dist.data.sources.read` ``_json_record``). A stream that turns out damaged raises
`albert_dist.data.sources.read.DamagedInput` out of `line_blocks`, and the caller scans the piece again with the
training reader (`albert_dist.data.prepare.scan`), so where the damage cuts the piece is decided in one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np

#: decoded bytes asked of the stream at a time; blocks are at most about twice this (plus an overlong record)
READ_BYTES = 4 << 20


@dataclass
class Block:
    """Complete records (each ended by ``\\n`` but maybe the stream's last) beginning at stream offset
    ``offset``; or one record longer than the limit (``data`` None, ``nbytes`` its length, never held)."""

    offset: int
    data: Optional[bytes]
    nbytes: int


def line_blocks(read: Callable[[int], bytes], start: int, end: float, max_bytes: int,
                read_bytes: Optional[int] = None) -> Iterator[Block]:
    """The records of ``split_records(read, "line", start, end, max_bytes)`` as runs of whole lines.

    ``read`` returns the stream from offset ``max(0, start - 1)`` on (the caller opens it there), as for
    `albert_dist.data.sources.read.split_records`: the first record begins after the first newline at or after
    ``start - 1`` (at 0 when ``start`` is 0), and records beginning before ``end`` are ours (the last one read
    to its end). A record of more than ``max_bytes`` without a newline in the buffer is skipped while it is
    read and handed out as a ``data=None`` block. Raises what ``read`` raises (`DamagedInput`).
    Memory: O(``read_bytes`` (default `READ_BYTES`) + ``max_bytes``).
    """
    read_bytes = read_bytes or READ_BYTES
    at = max(0, start - 1)  # stream offset of the next byte `read` returns
    head = b""  # the beginning of a record whose newline has not been read yet
    data = b""  # bytes read and not looked at yet; they follow `head`

    def more() -> bytes:
        nonlocal at
        chunk = read(read_bytes)
        at += len(chunk)
        return chunk

    if start > 0:  # the first record begins after the first newline at or after start - 1
        while True:
            data = more()
            i = data.find(b"\n")
            if i >= 0:
                data = data[i + 1:]
                break
            if not data or at >= end:  # any later newline ends no record that begins in the range
                return
    while True:
        if not data:
            if at - len(head) >= end:
                return
            data = more()
            if not data:  # the stream's last record, with no newline after it
                if head:
                    yield Block(at - len(head), head if len(head) <= max_bytes else None, len(head))
                return
        rec_start = at - len(data) - len(head)
        if rec_start >= end:
            return
        k = data.rfind(b"\n")
        if k < 0:
            head, data = head + data, b""
            if len(head) > max_bytes:  # an overlong record: count its bytes, hold none of them
                n, head = len(head), b""
                while True:
                    data = more()
                    i = data.find(b"\n")
                    if i >= 0 or not data:
                        break
                    n += len(data)
                yield Block(rec_start, None, n + (i if i >= 0 else 0))
                if i < 0:
                    return
                data = data[i + 1:]
            continue
        lines = b"".join((head, memoryview(data)[:k + 1]))  # whole lines from rec_start: one copy
        head, data = data[k + 1:], b""
        if rec_start + len(lines) > end:  # lines from here may begin at or past `end`: stop after the one
            cut = lines.find(b"\n", max(0, int(end) - 1 - rec_start)) + 1  # that covers end - 1
            yield Block(rec_start, lines[:cut], cut)
            return
        yield Block(rec_start, lines, len(lines))


@dataclass
class Parsed:
    """A block's records: the usable texts (stripped, in order; an Arrow string array), the record count, and
    the skipped records in order as ``(reason, stream offset)``."""

    texts: object  # pyarrow.StringArray
    records: int
    skipped: list[tuple[str, int]] = field(default_factory=list)


def parse_block(block: Block, text_field: str, max_bytes: int) -> Optional[Parsed]:
    """The block's records read by pyarrow, or None when pyarrow's reading might differ from the training
    reader's for some line (the caller then reads the block line by line).

    Taken whole when: every line starts with ``{`` (so none is blank to ``bytes.strip()``, a counted "empty"
    record pyarrow gives no row, nor starts with a byte-order mark, which json.loads refuses and pyarrow
    skips), the block is valid UTF-8 (json.loads of an invalid line fails whole, pyarrow ignores the bad bytes
    of a field it skips), no line is longer than ``max_bytes``, pyarrow parses it (a string or null
    ``text_field``; other fields ignored) and gives exactly one row per line (two objects on one line are one
    malformed record). A null or missing field is "missing_field"; a text that strips to nothing is "empty"
    (Python's ``str.strip``, as the training reader; run only on the texts whose first or last byte is not
    printable ASCII, the rest it cannot change).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as paj

    data = block.data
    assert data is not None
    byte = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(byte == 10)
    ends = nl if data.endswith(b"\n") else np.append(nl, len(data))  # each line's end, less its newline
    starts = np.concatenate([[0], nl + 1])[:len(ends)]
    if (byte[np.minimum(starts, len(data) - 1)] != 0x7B).any() or (ends - starts).max() > max_bytes:
        return None
    buf = pa.py_buffer(data)
    try:
        pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, len(data)], np.int32)), buf).validate(full=True)
        table = paj.read_json(pa.BufferReader(buf), read_options=paj.ReadOptions(use_threads=False, block_size=max(
            1 << 20, len(data) + 1)), parse_options=paj.ParseOptions(
                explicit_schema=pa.schema([(text_field, pa.string())]), unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    if table.num_rows != len(starts):
        return None
    chunks = table.column(0).chunks
    col = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
    missing = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else np.zeros(len(col), dtype=bool)
    texts = _strip(pc.fill_null(col, "") if col.null_count else col)
    bad = missing | (np.diff(_offsets(texts)) == 0)  # missing, or empty once stripped
    skipped: list[tuple[str, int]] = []
    if bad.any():
        for row in np.flatnonzero(bad):
            skipped.append(("missing_field" if missing[row] else "empty", block.offset + int(starts[row])))
        texts = texts.filter(arrow_bools(~bad))
    return Parsed(texts, len(starts), skipped)


def _offsets(texts) -> np.ndarray:
    """The ``len + 1`` int32 offsets of a string array into its data buffer (no copy)."""
    return np.frombuffer(texts.buffers()[1], dtype=np.int32, count=len(texts) + 1, offset=texts.offset * 4)


def _strip(texts):
    """``str.strip()`` of every text of a string array; Python runs only on those whose first or last byte is not
    printable ASCII (those it could change: Python's whitespace includes Unicode spaces and \\x1c-\\x1f)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(texts) == 0:
        return texts
    offsets = _offsets(texts)
    raw = texts.buffers()[2]
    byte = np.frombuffer(raw, dtype=np.uint8) if raw is not None and raw.size else np.zeros(1, np.uint8)
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    first = np.where(nonempty, byte[np.minimum(offsets[:-1], len(byte) - 1)], 0x41)
    last = np.where(nonempty, byte[np.maximum(offsets[1:] - 1, 0)], 0x41)
    check = np.flatnonzero(((first < 0x21) | (first > 0x7E) | (last < 0x21) | (last > 0x7E)) & nonempty)
    if len(check) == 0:
        return texts
    changed, values = [], []
    for row in check.tolist():
        text = texts[row].as_py()
        stripped = text.strip()
        if stripped != text:
            changed.append(row)
            values.append(stripped)
    if not changed:
        return texts
    mask = np.zeros(len(texts), dtype=bool)
    mask[changed] = True
    return pc.replace_with_mask(texts, arrow_bools(mask), arrow_strings(values))


# ``pyarrow.array`` imports pandas on its first call when pandas is installed (0.16 CPU-s here: 15% of a 64 MB
# prepare), to ask whether its argument is a pandas object; these build the same arrays from their buffers.
def arrow_strings(values: list[str]):
    """``pa.array(values, pa.string())`` for a list of str that all encode to UTF-8 (no lone surrogates; the
    callers check), without ``pyarrow.array``. Raises ValueError past 2 GiB of text (the callers batch ~8 MiB)."""
    import pyarrow as pa

    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} bytes of text in one string array (at most 2 GiB)")
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(b"".join(encoded)))


def arrow_bools(mask: np.ndarray):
    """``pa.array(mask)`` of a numpy bool array, without ``pyarrow.array``."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(np.packbits(mask, bitorder="little"))])
