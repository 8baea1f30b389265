"""Corpus reading and splitting: record boundaries, formats, bad input, disjoint/covering slots, epochs, mixing."""
from __future__ import annotations

import gzip
import io
import json
import re
from collections import Counter

import numpy as np
import pytest

from albert_dist.data import loader as loader_mod
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import PretrainingStream, build_train_loader
from albert_dist.data.pretraining import Example
from albert_dist.data.sources.read import BLANK_LINE_MAX_SPACES, read_piece, split_records
from albert_dist.data.sources.discover import cut_pieces
from albert_dist.data.stream import SourceStream, iter_texts
from fixtures.hub_folder import write_hub_folder
from fixtures.loader_checks import check_ranks_and_workers_split_uneven_shards
from fixtures.loader_checks import doc_id_examples as _doc_id_examples
from fixtures.loader_checks import uneven_shards as _uneven_shards


def _reference_records(data: bytes, separator: str) -> list[bytes]:
    """Independent parse: split the whole stream at once (bytes before the start count as newlines). A blank line
    may hold up to BLANK_LINE_MAX_SPACES spaces, tabs or CRs (raw WikiText-2's " " lines)."""
    if separator == "blank_line":
        lead = b"\n" * (BLANK_LINE_MAX_SPACES + 2)
        parts = re.split(rb"\n(?:[ \t\r]{0,%d}\n)+" % BLANK_LINE_MAX_SPACES, lead + data)[1:]
    else:
        parts = (b"\n" + data).split(b"\n")[1:]
    if parts and parts[-1] == b"":
        parts = parts[:-1]
    return parts


@pytest.mark.parametrize("separator", ["blank_line", "line"])
def test_byte_ranges_are_disjoint_and_cover_the_records(separator):
    rng = np.random.default_rng(0)
    lead = BLANK_LINE_MAX_SPACES + 2 if separator == "blank_line" else 1
    # spaces, tabs and runs longer than a blank line may hold, so separators of every shape meet every cut
    tokens = [b"a", b"b", b"\n", b" ", b"\t", b" " * (BLANK_LINE_MAX_SPACES + 1), b" " * BLANK_LINE_MAX_SPACES]
    for trial in range(600):
        n = int(rng.integers(0, 60))
        data = b"".join(rng.choice(tokens, size=n, p=[0.27, 0.27, 0.3, 0.06, 0.04, 0.03, 0.03]).tolist())
        cuts = sorted(set(rng.integers(0, len(data) + 1, size=int(rng.integers(0, 6))).tolist()) | {0, len(data)})
        got = []
        for start, end in zip(cuts[:-1], cuts[1:]):
            f = io.BytesIO(data)
            f.seek(max(0, start - lead))
            got += [rec for rec, _ in split_records(f.read, separator, start, end, max_bytes=1000)]
        assert got == _reference_records(data, separator), (data, cuts)


def test_raw_wikitext_articles_separated_by_space_lines_are_documents(tmp_path):
    """WikiText-2 as published separates its lines with " \\n" lines: each article is a document, not one 10 MB
    record skipped as too long (a new user's trial lost the whole corpus that way)."""
    docs = [f" = Article {i} = \n \n Its first sentence . And a second one .\n" for i in range(12_000)]
    path = tmp_path / "train.txt"
    path.write_text(" \n".join(docs))
    src = SourceConfig(paths=[str(path)])
    pieces, _ = cut_pieces(src, "data.train[0]", 64 << 10)  # byte ranges of 64 KiB (its floor)
    assert len(pieces) > 10
    got = [rec["text"] for piece in sorted(pieces, key=lambda p: p["start"]) for rec in read_piece(piece, "text", "blank_line", 1 << 20)
           if not rec["skip"]]
    assert got == [part for d in docs for part in (d.split(" \n \n")[0].strip(), d.split(" \n \n")[1].strip())]


def test_oversized_record_is_skipped_with_its_size():
    data = b"short\n" + b"x" * 5000 + b"\nafter\n"
    f = io.BytesIO(data)
    assert list(split_records(f.read, "line", 0, len(data), max_bytes=100)) == [(b"short", 5), (None, 5000), (b"after", 5)]


DOCS = [f"Document {i} first sentence. Second sentence of {i}.\nA new line of {i}." for i in range(23)]


def _write_all_formats(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    txt = "\n\n".join(DOCS) + "\n"
    (tmp_path / "c.txt").write_text(txt)
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write(txt)
    (tmp_path / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(txt.encode()))
    jsonl = "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(DOCS))
    (tmp_path / "c.jsonl").write_text(jsonl)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write(jsonl)
    pq.write_table(pa.table({"body": DOCS}), tmp_path / "c.parquet", row_group_size=5)
    (tmp_path / "files").mkdir()
    for i, d in enumerate(DOCS):
        (tmp_path / "files" / f"{i:03d}.txt").write_text(d + "\n\n")


@pytest.mark.parametrize("name", ["c.txt", "c.txt.gz", "c.txt.zst", "c.jsonl", "c.jsonl.gz", "c.parquet", "files"])
def test_every_format_yields_the_same_documents(tmp_path, name):
    _write_all_formats(tmp_path)
    src = SourceConfig(paths=[str(tmp_path / name)], text_field="body",
                       txt_documents="file" if name == "files" else "blank_line")
    assert list(iter_texts([src], "t", 1 << 20)) == DOCS
    pieces, stats = cut_pieces(src, "t", 1024)
    assert stats["files"] == (23 if name == "files" else 1)
    if name == "c.parquet":
        assert len(pieces) == 5  # one per row group
    if name in ("c.txt", "c.jsonl"):
        assert len(pieces) == -(-stats["bytes"] // 1024)  # byte ranges


@pytest.mark.parametrize("name", ["c.txt", "c.txt.gz", "c.jsonl", "c.parquet", "files"])
def test_a_file_gone_after_planning_is_input_vanished_not_damage(tmp_path, name):
    """Issue 46 item 5: a planned file deleted before its piece is read raises `InputVanished` naming it and the
    piece (it used to be a "damaged" skip marker: the job trained on without the file, saying so per piece)."""
    from albert_dist.exit_codes import InputVanished

    _write_all_formats(tmp_path)
    src = SourceConfig(paths=[str(tmp_path / name)], text_field="body",
                       txt_documents="file" if name == "files" else "blank_line")
    pieces, _ = cut_pieces(src, "t", 1024)
    piece = pieces[-1]
    (tmp_path / piece["path"]).unlink()
    with pytest.raises(InputVanished) as err:
        list(read_piece(piece, "body", src.txt_documents, 1 << 20))
    where = f"row group {piece['row_group']}" if name == "c.parquet" else f"bytes {piece['start']}-{piece['end']}"
    assert str(err.value) == (f"{piece['path']}: no longer exists (FileNotFoundError); the job planned to read "
                              f"{where}{' (decompressed)' if name.endswith('.gz') else ''} of the file")


def test_missing_path_and_empty_glob_fail_at_start(tmp_path):
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "nope.txt")])], num_workers=0)
    with pytest.raises(ValueError, match=r"data\.train\[0\]\.paths: .*nope\.txt.* does not exist"):
        build_train_loader(cfg, 2, 0, 1)
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "*.jsonl")])], num_workers=0)
    with pytest.raises(ValueError, match=r"glob .*\*\.jsonl.* matches no file"):
        build_train_loader(cfg, 2, 0, 1)
    (tmp_path / "empty.txt").write_bytes(b"")
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "empty.txt")])], num_workers=0)
    with pytest.raises(ValueError, match="only empty or damaged files"):
        build_train_loader(cfg, 2, 0, 1)


def _bad_corpus(tmp_path):
    good = [f"Good document number {i} has a sentence. And another one here." for i in range(6)]
    lines = [
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "unterminated',  # malformed JSON
        json.dumps({"text": good[1]}).encode(),
        b'{"text": "bad \xff\xfe utf8"}',  # invalid UTF-8
        b'{"text": "a lone \\ud800 surrogate"}',  # valid JSON whose text has no UTF-8 form: sentencepiece refuses it
        json.dumps({"text": "   "}).encode(),  # empty document
        json.dumps({"title": "no text field"}).encode(),  # missing field
        json.dumps({"text": "x" * (10 << 20)}).encode(),  # a 10 MB single line
        json.dumps({"text": good[2]}).encode(),
    ]
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "b.jsonl").write_bytes(b"")  # 0-byte shard
    (tmp_path / "c.txt").write_bytes(
        "\n\n".join(good[3:5]).encode() + b"\n\n\xc3\x28 invalid utf8 doc\n\n\n\n" + good[5].encode() + b"\n")
    return good


def test_bad_records_are_counted_and_skipped(tmp_path, caplog):
    good = _bad_corpus(tmp_path)
    src = SourceConfig(paths=[str(tmp_path / "*.jsonl"), str(tmp_path / "c.txt")], format="auto")
    with pytest.raises(ValueError, match="format"):  # a .jsonl and a .txt in one source are fine; auto per file
        SourceConfig(paths=[str(tmp_path / "a.jsonl")], format="csv")
    pieces, stats = cut_pieces(src, "data.train[0]", 1 << 20)
    assert stats["empty_files"] == 1 and stats["files"] == 3
    stream = SourceStream(src, "data.train[0]", pieces, 0, 1, seed=0, shuffle=False, max_document_bytes=4 << 20)
    texts = []
    with caplog.at_level("INFO"):
        while stream.epoch == 0:
            text, (epoch, _) = stream.next_document()
            if epoch == 0:
                texts.append(text)
    assert sorted(texts) == sorted(good)
    c = stream.counters
    assert (c["skipped_malformed_json"], c["skipped_invalid_utf8"], c["skipped_empty"], c["skipped_missing_field"],
            c["skipped_too_long"]) == (1, 3, 1, 1, 1)
    assert c["documents"] == 6 + 1  # one document of epoch 1 was read to detect the epoch end
    assert "skipped" in caplog.text and "malformed_json" in caplog.text
    # and the whole pipeline runs through it
    cfg = DataConfig(train=[src], max_seq_length=32, num_workers=0)
    it = iter(build_train_loader(cfg, 4, 0, 1))
    for _ in range(5):
        assert next(it)["input_ids"].shape == (4, 32)


def _epoch_docs(stream: SourceStream) -> list[int]:
    out = []
    while True:
        text, (epoch, _) = stream.next_document()
        if epoch > 0:
            return out
        out.append(int(text.split()[1]))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("piece_bytes", [1024, 1 << 20])  # many pieces / 5 pieces (shared by the slots at 8)
def test_slots_are_disjoint_and_cover_the_corpus(tmp_path, world_size, workers, piece_bytes):
    total = _uneven_shards(tmp_path)
    src = SourceConfig(paths=[str(tmp_path / "shard-*.txt")])
    pieces, _ = cut_pieces(src, "t", piece_bytes)
    num_slots = world_size * max(1, workers)
    seen: list[set] = []
    for slot in range(num_slots):
        stream = SourceStream(src, "t", pieces, slot, num_slots, seed=5, shuffle=True, max_document_bytes=1 << 20)
        docs = _epoch_docs(stream)
        assert len(docs) == len(set(docs))
        seen.append(set(docs))
    assert set().union(*seen) == set(range(total))
    assert sum(len(s) for s in seen) == total  # disjoint


def test_ranks_and_workers_split_uneven_shards_with_equal_batches(tmp_path, monkeypatch):
    """In this process (0 workers); with 2 worker processes: tests/integration/test_loader_workers.py."""
    check_ranks_and_workers_split_uneven_shards(tmp_path, monkeypatch, 0)


def test_epochs_reshuffle_the_same_documents(tmp_path):
    total = _uneven_shards(tmp_path)
    src = SourceConfig(paths=[str(tmp_path / "shard-*.txt")])
    pieces, _ = cut_pieces(src, "t", 1024)
    stream = SourceStream(src, "t", pieces, 0, 1, seed=1, shuffle=True, max_document_bytes=1 << 20)
    e0 = _epoch_docs(stream)
    e1 = [int(stream.next_document()[0].split()[1]) for _ in range(total - 1)]  # the first of epoch 1 was read
    assert sorted(e0) == list(range(total))
    assert e1 != e0[1:] and len(set(e1)) == total - 1
    fixed = SourceStream(src, "t", pieces, 0, 1, seed=1, shuffle=False, max_document_bytes=1 << 20)
    f0 = _epoch_docs(fixed)
    assert [int(fixed.next_document()[0].split()[1]) for _ in range(total - 1)] == f0[1:]


def test_sources_are_mixed_by_weight_deterministically(tmp_path, monkeypatch):
    _doc_id_examples(monkeypatch)
    (tmp_path / "a.txt").write_text("\n\n".join(f"doc {i} a" for i in range(10)) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(f"doc {100 + i} b" for i in range(10)) + "\n")
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "a.txt")], weight=3.0),
                            SourceConfig(paths=[str(tmp_path / "b.txt")], weight=1.0)], num_workers=0)

    def draw():
        it = iter(PretrainingStream(cfg, "train", 8, 0, 1))
        return np.concatenate([next(it)["input_ids"][:, 1].numpy() - 1000 for _ in range(100)])

    first = draw()
    assert np.array_equal(first, draw())
    assert abs(np.mean(first < 100) - 0.75) < 0.04


@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_hub_code_path_is_split_and_resumes(tmp_path, num_slots):
    """A datasets builder source (load_dataset("json", data_files=..., streaming=True), as for a hub dataset):
    slots disjoint and covering (2 files: shard split for 1 and 2 slots, record split for 3), exact resume."""
    for f in range(2):
        rows = [json.dumps({"text": f"doc {f * 10 + i} text"}) for i in range(10)]
        (tmp_path / f"h{f}.jsonl").write_text("\n".join(rows) + "\n")
    src = SourceConfig(paths=["json"], format="hub", hub_data_files=[str(tmp_path / "h0.jsonl"), str(tmp_path / "h1.jsonl")])
    seen = []
    for slot in range(num_slots):
        stream = SourceStream(src, "t", None, slot, num_slots, seed=0, shuffle=False, max_document_bytes=1 << 20)
        seen.append(_epoch_docs(stream))
    assert sorted(d for docs in seen for d in docs) == list(range(20))
    stream = SourceStream(src, "t", None, 0, num_slots, seed=0, shuffle=False, max_document_bytes=1 << 20)
    [stream.next_document() for _ in range(3)]
    state = json.loads(json.dumps(stream.state_dict()))
    expected = [stream.next_document() for _ in range(4)]
    resumed = SourceStream(src, "t", None, 0, num_slots, seed=0, shuffle=False, max_document_bytes=1 << 20)
    resumed.load_state_dict(state)
    assert [resumed.next_document() for _ in range(4)] == expected


@pytest.mark.parametrize("separator", ["blank_line", "line"])
def test_a_range_inside_a_long_record_reads_about_itself(separator):
    """A range that no separator ends in begins no record: it stops at its end instead of reading the rest of
    the record that covers it (4 MiB ranges of a 100 MB line read the file 12.5 times per epoch)."""
    sep = b"\n\n" if separator == "blank_line" else b"\n"
    data = b"first" + sep + b"x" * (8 << 20) + sep + b"last" + sep
    start, end = 1 << 20, 2 << 20  # inside the long record
    f = io.BytesIO(data)
    f.seek(start - len(sep))
    read_bytes = 0

    def read(n: int) -> bytes:
        nonlocal read_bytes
        out = f.read(n)
        read_bytes += len(out)
        return out

    assert list(split_records(read, separator, start, end, max_bytes=1 << 30)) == []
    assert read_bytes <= (end - start) + (64 << 10), read_bytes  # the range and a read's overshoot, not 7 MiB


def test_side_files_beside_the_shards_are_ignored_with_one_counted_line(tmp_path, caplog):
    """A Spark export / HF snapshot: parquet shards with _SUCCESS, _committed_*, .crc, README.md, LICENSE and a
    dotfile beside them read as the shards alone (an unknown suffix is still refused: it is not a side file)."""
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    from albert_dist.data.config import SourceConfig
    from albert_dist.data.stream import iter_texts

    docs = [f"document number {i}" for i in range(30)]
    pq.write_table(pa.table({"text": docs[:15]}), tmp_path / "part-00000.parquet")
    pq.write_table(pa.table({"text": docs[15:]}), tmp_path / "part-00001.parquet")
    for name in ("_SUCCESS", "_committed_123", ".part-00000.parquet.crc", "README.md", "LICENSE", ".gitattributes"):
        (tmp_path / name).write_text("not a corpus\n")
    with caplog.at_level(logging.INFO, logger="albert_dist.data.sources.discover"):
        assert list(iter_texts([SourceConfig(paths=[str(tmp_path)])], "data.train", 1 << 20)) == docs
    lines = [r.getMessage() for r in caplog.records if "side file" in r.getMessage()]
    assert len(lines) == 1 and "ignored 6 side file(s)" in lines[0] and "README.md" in lines[0]
    # one non-data file in the directory: a glob naming the data files leaves it out; a format set for the whole
    # source (the old hint) would read it as data. Named on its own, a file of unknown suffix may be data.
    (tmp_path / "notes.docx").write_text("x")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*notes.docx.*notes.docx is no data file but "
                                         r"lies in the source's directory or glob: name only the data files with a "
                                         rf"glob \('{tmp_path}/\*.<suffix>'\)") as refused:
        list(iter_texts([SourceConfig(paths=[str(tmp_path)])], "data.train", 1 << 20))
    assert "set the source's format" not in str(refused.value)
    with pytest.raises(ValueError, match="cannot tell the format of .*notes.docx.*set the source's format"):
        list(iter_texts([SourceConfig(paths=[str(tmp_path / "notes.docx")])], "data.train", 1 << 20))
    # the shell's expansion of an unquoted dir/* names the side files one by one: say to quote the glob
    (tmp_path / "notes.docx").unlink()
    named = sorted(str(p) for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"(README.md|.gitattributes) is a side file that a quoted glob or a directory skips: quote"):
        list(iter_texts([SourceConfig(paths=named)], "data.train", 1 << 20))


def test_a_slot_of_only_unreadable_data_is_refused_before_the_job_naming_the_file(tmp_path):
    """The issue's case: a random-bytes .jsonl beside one good file on 2 ranks (no workers): one rank's slot
    would hold only the random file's records. `albert-dist train`'s preflight refuses it naming the file; one
    rank (its one slot reads the good file too) passes."""
    import numpy as np

    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    good = tmp_path / "a-good.jsonl"
    good.write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(100)))  # 1 piece
    bad = tmp_path / "b-random.jsonl"  # 3 pieces of 64 KiB: largest first, round robin -> slot 0 holds 2 of them
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 3 * 65536, dtype=np.uint8).tobytes())
    cfg = load_config(None, [f"data.train=[{tmp_path}]", "data.validation=[]", "data.num_workers=0",
                             "data.shard_piece_bytes=1048576"])
    preflight.check_inputs(cfg, world_size=1)
    with pytest.raises(ValueError, match=r"data\.train\[0\]: slot 0 of 2 .* only unusable records from "
                                         + re.escape(str(bad))):
        preflight.check_inputs(cfg, world_size=2)


def test_a_slot_of_only_too_long_records_is_refused_and_a_long_first_record_is_not(tmp_path):
    """A .jsonl whose every line is longer than data.max_document_bytes passed the probe (its 1 MiB of skipped
    bytes read as "undecided") and failed at the first batch: now refused naming the slot, file and too_long
    count. A few overlong documents before good ones still pass, on one slot and on several."""
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    def cfg(path, slots_bytes="65536"):
        return load_config(None, [f"data.train=[{path}]", "data.validation=[]", "data.num_workers=0",
                                  "data.max_document_bytes=65536", f"data.shard_piece_bytes={slots_bytes}"])

    books = tmp_path / "books.jsonl"
    books.write_text("".join(json.dumps({"text": f"book {i} " + "w " * 40_000}) + "\n" for i in range(40)))
    for world in (1, 3):
        with pytest.raises(ValueError, match=r"data\.train\[0\]: slot \d of %d .* no usable record from "
                           % world + re.escape(str(books))
                           + r": every record (that begins in its share|in the first .* of its share) \(.*\) "
                           r"is longer than data\.max_document_bytes=65536 \(skipped \{'too_long': \d+\}\)"):
            preflight.check_inputs(cfg(books), world_size=world)
    mixed = tmp_path / "mixed.jsonl"  # two overlong documents, then good ones
    mixed.write_text("".join(json.dumps({"text": "w " * 40_000}) + "\n" for _ in range(2))
                     + "".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(400)))
    for world in (1, 2):
        preflight.check_inputs(cfg(mixed, "1048576"), world_size=world)


def test_the_probe_of_a_huge_one_line_file_is_bounded(tmp_path, monkeypatch):
    """A 256 MiB .txt with no blank line (one document, far over data.max_document_bytes) is refused after
    reading about `probe_read_bytes`, not read to its end (the stream it would fail in reads it whole)."""
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config
    from albert_dist.data.sources import read as files
    from albert_dist.data.sources.pieces import probe_read_bytes

    huge = tmp_path / "one-document.txt"
    with open(huge, "wb") as f:  # sparse: no disk, reads as NUL bytes
        f.truncate(256 << 20)
    read = Counter()
    real_open = files.open_stream

    def counting_open(*args, **kwargs):
        stream = real_open(*args, **kwargs)
        real_read = stream.read

        def counted(n):
            data = real_read(n)
            read["bytes"] += len(data)
            return data

        stream.read = counted
        return stream

    monkeypatch.setattr(files, "open_stream", counting_open)
    cfg = load_config(None, [f"data.train=[{huge}]", "data.validation=[]", "data.num_workers=0",
                             "data.max_document_bytes=65536"])
    with pytest.raises(ValueError, match=r"slot 0 of 2 .* every record in the first .* of its share \(128\.0 MiB\) "
                                         r"is longer than "
                                         r"data\.max_document_bytes=65536 \(skipped \{'too_long': 1\}\)"):
        preflight.check_inputs(cfg, world_size=2)
    assert 0 < read["bytes"] <= 2 * probe_read_bytes(65536)  # two slots at most, each within its bound


def test_the_preflight_hands_the_loader_the_plan_it_would_make(tmp_path):
    """`JobPlan.train_pieces` (the preflight's plan, one metadata pass per rank before the process group) is the
    plan the loader makes itself for the same world size x workers: same pieces, same stream fingerprint (so a
    checkpoint saved either way resumes either way); the validation source is checked too."""
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    for name, n in (("a.jsonl", 300), ("b.txt", 200)):
        rows = (json.dumps({"text": f"doc {name} {i} " * 30}) if name.endswith("jsonl") else f"doc {name} {i} " * 30
                for i in range(n))
        (tmp_path / name).write_text(("\n" if name.endswith("jsonl") else "\n\n").join(rows) + "\n")
    cfg = load_config(None, [f"data.train=[{{paths: ['{tmp_path}/a.jsonl']}}, {{paths: ['{tmp_path}/b.txt']}}]",
                             f"data.validation=[{tmp_path}/b.txt]", "data.num_workers=2",
                             "data.shard_piece_bytes=8192"])
    handed = preflight.check_inputs(cfg, world_size=3, probe=False)
    own = PretrainingStream(cfg.data, "train", 4, 1, 3)
    assert handed == own.plans and all(len(p) >= 6 for p in handed)  # several pieces per source at 6 slots
    assert PretrainingStream(cfg.data, "train", 4, 1, 3, handed).fingerprint == own.fingerprint
    assert preflight.check_inputs(cfg) is None  # no world size: checked only
    bad = load_config(None, [f"data.train=[{tmp_path}/a.jsonl]", f"data.validation=[{tmp_path}/none-*.txt]"])
    with pytest.raises(ValueError, match=r"data\.validation\[0\].*matches no file"):
        preflight.check_inputs(bad, world_size=3)


def test_hub_config_and_hub_split_pick_one_configuration_and_split(tmp_path):
    """`hub_config` and `hub_split` reach ``datasets.load_dataset(path, name=, split=, streaming=True)``: a dataset
    folder laid out as a hub repository (a README whose ``configs:`` metadata names two configurations, each with
    a train and a validation split; read offline) streams exactly the records of the file the pair names."""
    write_hub_folder(tmp_path)
    for config, split in (("large", "validation"), ("small", "train")):
        src = SourceConfig(paths=[str(tmp_path)], format="hub", hub_config=config, hub_split=split)
        stream = SourceStream(src, "t", None, 0, 1, seed=0, shuffle=False, max_document_bytes=1 << 20)
        assert [stream.next_document()[0] for _ in range(4)] == [f"{config} {split} {i} text" for i in range(4)]


def test_each_file_is_described_once_and_its_pieces_carry_the_record(tmp_path, monkeypatch):
    """Planning a source (`source_pieces`: the text-field check, then the pieces) stats each file once and reads
    each parquet footer once: one `CorpusFile` per file, handed from discovery to both steps (before, each step
    found the format, size and footer again: a jsonl or parquet file was stat'ed twice); the pieces carry the file's
    size and version to the readers, as os.stat gives them."""
    import os

    import pyarrow.parquet as pq

    from albert_dist.data.sources import discover, store
    from albert_dist.data.sources.pieces import source_pieces

    _write_all_formats(tmp_path)
    stats, footers = Counter(), Counter()
    real_stat, real_read = store.stat, pq.read_metadata
    monkeypatch.setattr(store, "stat", lambda path, *a: stats.update([path]) or real_stat(path, *a))
    monkeypatch.setattr(pq, "read_metadata", lambda path, *a, **k: footers.update([str(path)]) or real_read(path))
    discover.read_footer.cache_clear()
    src = SourceConfig(paths=[str(tmp_path / "c.*")], text_field="body")
    pieces, counts = source_pieces(src, "data.train[0]", 1 << 20, slots=4)
    names = ["c.jsonl", "c.jsonl.gz", "c.parquet", "c.txt", "c.txt.gz", "c.txt.zst"]
    assert counts["files"] == 6 and sorted(os.path.basename(p) for p in stats) == names
    assert set(stats.values()) == {1} and list(footers.values()) == [1]
    for piece in pieces:
        st = os.stat(piece["path"])
        assert (piece["file_bytes"], piece["version"]) == (st.st_size, str(st.st_mtime_ns))
