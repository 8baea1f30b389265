"""`data prepare` reads JSON lines a block at a time (albert_dist.data.prepare.jsonl) and must find exactly the
records, documents and skips of the training reader (albert_dist.data.sources.read: split_records, read_piece), the
reference here, on every kind of line pyarrow and json.loads could read differently."""
from __future__ import annotations

import io
import json
import random

import pytest

from albert_dist.data.sources import read as files
from albert_dist.data.prepare import jsonl, scan

# every kind of line where pyarrow's JSON reader and json.loads could part ways, between ordinary ones
ODD_LINES = [
    b"", b"   ", b"\t", b"\r", b"\x0c",  # blank to bytes.strip(): "empty" records, rows pyarrow skips
    b'{"text": 5}', b'{"text": null}', b'{"other": "x"}', b'{"text": {"a": 1}}', b'[1, 2]', b'"top"',
    b'{"text": "a"} {"text": "b"}',  # two objects on one line: one malformed record, two pyarrow rows
    b'{"text": "a", "text": "b"}', b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "ok", "x": "\xff"}',
    b'{"text": "bad \xff"}', b'{"text": "lone \\ud800"}', b'{"text": "  padded \\u3000\\u2003 "}',
    b'{"text": "\\u001fctl\\u001c"}', b'{"text": "   "}', b'{"text": ""}', b'{"text": "tab\there"}',
    b'{"text": "crlf"}\r', b'{"text": "x", "n": NaN}', b'  {"text": "leading space"}',
    b'{"text": "' + b"L" * 3000 + b'"}',  # longer than the tests' max_bytes: "too_long"
]


def _corpus(seed: int, lines: int = 400, odd: float = 0.15) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        if rng.random() < odd:
            out.append(rng.choice(ODD_LINES))
        else:
            text = f"doc {i} " + " ".join(rng.choice(["été", "word", "“q”", "x\\ny", "\\\"", "✓"]) for _ in range(
                rng.randint(1, 60)))
            out.append(json.dumps({"text": text, "id": i}, ensure_ascii=rng.random() < 0.5).encode())
    for line in ODD_LINES:  # each kind at least once
        out.insert(rng.randrange(len(out) + 1), line)
    return b"\n".join(out) + (b"\n" if seed % 2 else b"")


@pytest.mark.parametrize("seed", range(6))
def test_line_blocks_find_the_training_readers_records_in_any_byte_range(seed):
    data = _corpus(seed)
    rng = random.Random(seed)
    cuts = sorted({0, len(data), *(rng.randrange(len(data)) for _ in range(5))})
    for start, end in zip(cuts, cuts[1:]):
        def reader():
            f = io.BytesIO(data)
            f.seek(max(0, start - 1))
            return f.read

        expected = [(rec, n, pos) for rec, n, pos in files.split_records(reader(), "line", start, end, 2048,
                                                                          offsets=True)]
        got = []
        for block in jsonl.line_blocks(reader(), start, end, 2048, read_bytes=rng.choice([7, 100, 4096])):
            if block.data is None:
                got.append((None, block.nbytes, block.offset))
                continue
            pos = block.offset
            lines = block.data.split(b"\n")
            for raw in lines[:-1] if block.data.endswith(b"\n") else lines:
                got.append((raw if len(raw) <= 2048 else None, len(raw), pos))
                pos += len(raw) + 1
        assert got == expected, (start, end)


@pytest.mark.parametrize("seed", range(4))
def test_the_block_scan_equals_the_record_scan(tmp_path, seed, monkeypatch):
    """Documents, their order, record and skip counts and the skips' locations: the block scan (pyarrow, line by
    line where it could differ) against the training reader's record-by-record scan of the same piece."""
    import pyarrow as pa

    path = tmp_path / "c.jsonl"
    # odd lines rare enough that most blocks hold none or one: pyarrow reads those (its skips, Python's strip)
    path.write_bytes(_corpus(seed, 6000, odd=0.015))
    monkeypatch.setattr(jsonl, "READ_BYTES", 8192)  # many blocks, records across block edges
    taken = []
    parse = jsonl.parse_block
    monkeypatch.setattr(jsonl, "parse_block", lambda *a: taken.append(parse(*a)) or taken[-1])
    size = path.stat().st_size
    for start, end in ((size // 3, 2 * size // 3), (0, size)):
        task = scan.ScanTask(0, str(path), "jsonl", "", start, end, disk_bytes=end - start)
        results = {}
        for name, fn in (("blocks", scan._scan_blocks), ("records", scan._scan_records)):
            spool = tmp_path / name
            spool.mkdir(exist_ok=True)
            summary = fn(task, spool, 2048)
            texts = pa.ipc.open_file(str(spool / "000000.arrow")).read_all().column(0).to_pylist()
            results[name] = (summary, texts, scan.read_hashes(spool / "000000.hash").tolist())
        blocks, records = results["blocks"], results["records"]
        assert blocks == records
        summary, texts, _ = records
    # the whole file holds every odd line: every skip reason; Python's strip (Unicode spaces), in both scans
    assert summary["documents"] == len(texts) > 100 and set(summary["skipped"]) >= {
        "empty", "malformed_json", "missing_field", "invalid_utf8", "too_long"}
    assert "  padded" not in " ".join(texts) and "padded" in " ".join(texts)
    whole = [p for p in taken if p is not None]
    assert len(whole) > len(taken) / 2 and sum(len(p.skipped) for p in whole) > 5


@pytest.mark.parametrize("data", [
    b'\xef\xbb\xbf{"text": "bom"}\n{"text": "b"}\n',  # json.loads refuses the BOM, pyarrow reads past it
    b'{"text": "a"}\n   \n{"text": "b"} {"text": "c"}\n',  # a blank line and two objects: rows == lines
    b'{"text": "a"}\n{"text": "b", "x": "\xff"}\n',  # invalid UTF-8 outside the text field
])
def test_blocks_pyarrow_could_misread_go_line_by_line(data):
    assert jsonl.parse_block(jsonl.Block(0, data, len(data)), "text", 1 << 20) is None
    ok = b'{"text": " a "}\n{"other": 1}\n{"text": "\\u3000"}\n{"text": "b"}'
    parsed = jsonl.parse_block(jsonl.Block(100, ok, len(ok)), "text", 1 << 20)
    assert parsed.texts.to_pylist() == ["a", "b"] and parsed.records == 4
    assert parsed.skipped == [("missing_field", 116), ("empty", 129)]


@pytest.mark.parametrize("values", [[], ["a"], ["", "héllo", "\u3000x", "日本語", "a" * 70000]])
def test_arrays_built_from_buffers_equal_pyarrow_array(values):
    """The scan builds its Arrow arrays from buffers (pyarrow.array imports pandas on its first call)."""
    import numpy as np
    import pyarrow as pa

    got = jsonl.arrow_strings(values)
    got.validate(full=True)
    assert got.equals(pa.array(values, pa.string()))
    mask = np.array([i % 3 == 0 for i in range(len(values) * 7)], dtype=bool)
    bools = jsonl.arrow_bools(mask)
    bools.validate(full=True)
    assert bools.equals(pa.array(mask))
