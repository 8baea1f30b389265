"""The byte-budgeted sample (tokenizer training): every file contributes, the budget holds, windows spread over
a file, compressed files give a prefix, a damaged file is a logged skip. Files are written by gzip, zstandard
and pyarrow; the reference is albert_dist.data.stream.iter_texts (a full single-process read)."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from albert_dist.data.config import SourceConfig
from albert_dist.data.sample import ByteBudgetSample, describe
from albert_dist.data.stream import iter_texts


def _doc(name: str, i: int) -> str:
    return f"{name} document {i:06d} says hello. It has a second sentence about item {i} of {name}."


def _corpus(tmp_path) -> dict[str, list[str]]:
    """Six files of every kind; returns file name -> its documents in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    docs = {name: [_doc(name, i) for i in range(n)] for name, n in
            (("big.txt", 20000), ("small.txt", 30), ("g.jsonl.gz", 3000), ("z.jsonl.zst", 3000),
             ("t.txt.zst", 2000), ("p.parquet", 4000))}
    (tmp_path / "big.txt").write_text("\n\n".join(docs["big.txt"]) + "\n")
    (tmp_path / "small.txt").write_text("\n\n".join(docs["small.txt"]) + "\n")
    with gzip.open(tmp_path / "g.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs["g.jsonl.gz"])
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs["z.jsonl.zst"]).encode()
    (tmp_path / "z.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (tmp_path / "t.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n\n".join(docs["t.txt.zst"])).encode()))
    pq.write_table(pa.table({"text": docs["p.parquet"]}), tmp_path / "p.parquet", row_group_size=250)
    return docs


def _index(text: str) -> tuple[str, int]:
    m = re.match(r"(\S+) document (\d+) ", text)
    assert m, text
    return m.group(1), int(m.group(2))


def test_sample_covers_every_file_within_the_byte_budget(tmp_path):
    docs = _corpus(tmp_path)
    budget = 200_000
    sample = ByteBudgetSample([SourceConfig(paths=[str(tmp_path / "*")])], "tokenizer.input", budget)
    texts = list(sample)
    sizes = [len(t.encode()) for t in texts]
    assert sum(sizes) == sum(sample.taken.values()) <= budget
    assert sum(sizes) >= 0.95 * budget  # quotas are used, not left empty
    assert set(sample.taken) == set(str(tmp_path / n) for n in docs) and min(sample.taken.values()) > 0
    # every text is a document of the corpus (or the quota-cut head of one), with its file's name
    by_file: dict[str, list[int]] = {}
    cut = 0
    for t in texts:
        if not re.match(r"\S+ document \d+ ", t):  # the head of a document cut at the end of a quota window
            cut += 1
            assert any(d.startswith(t) for ds in docs.values() for d in ds), t
            continue
        name, i = _index(t)
        assert docs[name][i].startswith(t)
        by_file.setdefault(name, []).append(i)
    assert cut <= 64 * len(docs)
    # quotas follow the estimated text bytes: the big uncompressed file gets the largest share
    est = {p.path.rsplit("/", 1)[1]: p.est_text_bytes for p in sample.plan}
    total = sum(est.values())
    for name, got in sample.taken.items():
        share = est[name.rsplit("/", 1)[1]] / total
        assert got == pytest.approx(budget * share, rel=0.05, abs=300), name
    # the uncompressed file is read in windows spread over the whole file, not only its head
    big = sorted(by_file["big.txt"])
    assert big[0] < 500 and big[-1] > 15000 and len(big) < 0.2 * len(docs["big.txt"])
    # parquet: evenly spaced row groups (of 250 rows), not only the first
    assert len({i // 250 for i in by_file["p.parquet"]}) >= 3 and max(by_file["p.parquet"]) >= 2000
    # compressed files: a prefix (documents 0, 1, 2, ... in order)
    for name in ("g.jsonl.gz", "z.jsonl.zst", "t.txt.zst"):
        assert by_file[name] == list(range(len(by_file[name]))), name
    assert list(ByteBudgetSample([SourceConfig(paths=[str(tmp_path / "*")])], "t", budget)) == texts  # deterministic
    assert "sample budget 195.3 KiB" in describe(sample) and "6 files" in describe(sample)


def test_budget_above_the_corpus_takes_every_document(tmp_path):
    _corpus(tmp_path)
    src = [SourceConfig(paths=[str(tmp_path / "*")])]
    assert list(ByteBudgetSample(src, "t", 1 << 40)) == list(iter_texts(src, "t", 1 << 30))


def test_damaged_compressed_file_is_a_logged_skip(tmp_path, caplog):
    good = [_doc("good", i) for i in range(200)]
    (tmp_path / "good.txt").write_text("\n\n".join(good))
    with gzip.open(tmp_path / "bad.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": _doc("bad", i)}) + "\n" for i in range(30000))
    data = (tmp_path / "bad.jsonl.gz").read_bytes()
    (tmp_path / "bad.jsonl.gz").write_bytes(data[: len(data) // 2])  # a broken download
    import pyarrow as pa
    import pyarrow.parquet as pq

    footer = tmp_path / "footer.parquet"  # a footer that does not parse: the file is skipped at planning
    pq.write_table(pa.table({"text": ["lost document"] * 10}), footer)
    footer.write_bytes(footer.read_bytes()[:-12] + b"\x00" * 8 + b"PAR1")
    sample = ByteBudgetSample([SourceConfig(paths=[str(tmp_path / "*")])], "tokenizer.input", 1 << 30)
    texts = list(sample)
    assert [t for t in texts if t.startswith("good")] == good
    assert 0 < sum(t.startswith("bad") for t in texts) < 30000 and "lost document" not in texts
    assert sample.skipped["damaged"] == 2
    assert any("bad.jsonl.gz" in r.getMessage() and "skipped the rest of" in r.getMessage() for r in caplog.records)
    assert any("footer.parquet" in r.getMessage() and "not a readable parquet" in r.getMessage()
               for r in caplog.records)


def test_bad_budget_and_hub_source_are_clear_errors(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(ValueError, match="budget must be >= 1"):
        ByteBudgetSample([SourceConfig(paths=[str(tmp_path / "a.txt")])], "tokenizer.input", 0)
    with pytest.raises(ValueError, match=r"tokenizer.input\[0\]: hub sources"):
        ByteBudgetSample([SourceConfig(paths=["org/ds"], format="hub")], "tokenizer.input", 10)


def test_a_corrupt_parquet_row_group_loses_only_that_row_group(tmp_path, caplog):
    """One damaged row group of four: the sample holds the other three groups' documents (exactly those: a
    budget larger than the file takes all that is readable), as prepare and training skip just that group."""
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"document {i} " + "word " * (i % 7) for i in range(400)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=100, compression="none")
    col = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
    data = bytearray(path.read_bytes())
    data[start:start + 24] = b"\xff" * 24  # the page header of row group 1 no longer parses
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        got = list(ByteBudgetSample([SourceConfig(paths=[str(path)])], "--input", 1 << 20))
    assert got == [d.strip() for d in docs[:100] + docs[200:]]
    assert any("row group 1 of" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_uncompressed_files_are_read_about_as_much_as_sampled(tmp_path, monkeypatch):
    """A 5% sample of uncompressed files reads a small multiple of the text it takes, not the files: its windows
    span the file but read in blocks sized to their share (reads the size of the window read every file whole:
    20x the sample here). Bytes are counted at the file stream, independently of the sampler."""
    from albert_dist.data.sources import read as files

    for f in range(4):
        (tmp_path / f"{f}.jsonl").write_text("".join(json.dumps({"text": _doc(f"f{f}", i) * 3}) + "\n"
                                                     for i in range(4000)))
        (tmp_path / f"{f}.txt").write_text("\n\n".join(_doc(f"t{f}", i) * 3 for i in range(4000)) + "\n")
    read = [0]
    plain_read = files._PlainStream.read

    def counted(self, n):
        data = plain_read(self, n)
        read[0] += len(data)
        return data

    monkeypatch.setattr(files._PlainStream, "read", counted)
    sample = ByteBudgetSample([SourceConfig(paths=[str(tmp_path / "*.jsonl")]),
                               SourceConfig(paths=[str(tmp_path / "*.txt")])], "data.train", 400_000)
    taken = sum(len(t.encode()) for t in sample)
    assert 0.99 * 400_000 <= taken <= 400_000
    assert sample.input_bytes > 19 * taken
    assert read[0] < 2.5 * taken, (read[0], taken)
