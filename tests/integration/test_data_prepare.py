"""`albert-dist data prepare`: every input format survives exactly, duplicates are dropped (first kept, across
files and workers), damaged inputs are counted skips naming file and offset, the output is byte-identical at any
--workers, reruns and resumes are safe, and the training reader takes its row groups as pieces.

Inputs are real files written by gzip, zstandard and pyarrow; the reference for "survives exactly" is the list of
documents written, read back with the training reader (albert_dist.data.stream.iter_texts)."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from albert_dist import cli
from albert_dist.data.prepare import dedup, jsonl, lock, options, publish, run, scan
from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.discover import cut_pieces
from albert_dist.data.stream import iter_texts

# Unicode, inner newlines (blank-line txt keeps single newlines inside a document), quotes for JSON escaping.
BASE = [f"Document {i}: \u00e9t\u00e9 \u2014 \u201cquoted\u201d {i * 7919 % 1000}.\nSecond line of {i}." for i in range(400)]
# 40 exact duplicates of earlier documents, spread through the file
DOCS = BASE[:200] + BASE[10:30] + BASE[200:] + BASE[300:320]
EXPECTED = BASE  # first occurrences, in input order


def _write(path: Path, docs: list[str], kind: str, compression: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    if kind == "parquet":  # parquet compresses inside: the codec plays the role of .gz/.zst
        codec = {"": "none", ".gz": "gzip", ".zst": "zstd"}[compression]
        path = path.with_name(path.name + ".parquet")
        pq.write_table(pa.table({"content": docs}), path, row_group_size=97, compression=codec)
        return path
    data = ("".join(json.dumps({"content": d}) + "\n" for d in docs) if kind == "jsonl"
            else "\n\n".join(docs) + "\n").encode()
    path = path.with_name(path.name + f".{kind}{compression}")
    if compression == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif compression == ".zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        path.write_bytes(data)
    return path


def _opts(inputs, out, **kw) -> options.PrepareOptions:
    sources = [SourceConfig(paths=[str(p)], text_field="content") for p in inputs]
    return options.PrepareOptions(sources=sources, output=str(out), progress=False, **kw)


def _read_output(out: Path) -> list[str]:
    return list(iter_texts([SourceConfig(paths=[str(out / "*.parquet")])], "t", 1 << 20))


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
@pytest.mark.parametrize("compression", ["", ".gz", ".zst"])
def test_every_format_survives_exactly_and_duplicates_are_dropped(tmp_path, kind, compression):
    src = _write(tmp_path / "corpus", DOCS, kind, compression)
    manifest = run.prepare(_opts([src], tmp_path / "out", row_group_bytes=4096, num_shards=3), "cmd")
    assert _read_output(tmp_path / "out") == EXPECTED
    assert manifest["documents"] == len(EXPECTED) and manifest["records_read"] == len(DOCS)
    assert manifest["dedup"]["duplicates_dropped"] == len(DOCS) - len(EXPECTED) == 40
    assert manifest["bytes"] == sum(len(d.encode()) for d in EXPECTED)
    assert manifest["num_shards"] == 3 == len(manifest["files"]) and manifest["skipped"] == {}
    assert manifest["inputs"] == [{"path": str(src), "bytes": src.stat().st_size, "kind": kind,
                                   "compression": "" if kind == "parquet" else compression, "source": 0}]
    assert sorted(os.listdir(tmp_path / "out")) == sorted([publish.MANIFEST_NAME] + [f["path"] for f in manifest["files"]])
    assert not (tmp_path / ("out" + run.TMP_SUFFIX)).exists()


def test_output_layout_row_groups_and_manifest_figures(tmp_path):
    import pyarrow.parquet as pq

    docs = [f"doc {i} " + "word " * (i % 50) for i in range(3000)]
    src = _write(tmp_path / "c", docs, "jsonl", ".zst")
    manifest = run.prepare(_opts([src], tmp_path / "out", row_group_bytes=8192, num_shards=4), "the command")
    assert manifest["command"] == "the command" and manifest["format_version"] == options.FORMAT_VERSION
    assert manifest["peak_rss_bytes"]["main"] > 10 << 20 and manifest["peak_rss_bytes"]["worker"] > 10 << 20
    total = 0
    for entry in manifest["files"]:
        pf = pq.ParquetFile(tmp_path / "out" / entry["path"])
        assert pf.schema_arrow.names == ["text"]
        assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
        sizes = [sum(len(t.encode()) for t in pf.read_row_group(g).column(0).to_pylist())
                 for g in range(pf.metadata.num_row_groups)]
        # row group k holds the documents starting in its [k, k+1) x 8192 bytes of the shard: none far above
        assert max(sizes) < 8192 + 400 and pf.metadata.num_row_groups == entry["row_groups"]
        assert entry["documents"] == pf.metadata.num_rows and entry["bytes"] == sum(sizes)
        total += entry["bytes"]
    assert total == manifest["bytes"]
    shard_bytes = [e["bytes"] for e in manifest["files"]]
    assert max(shard_bytes) - min(shard_bytes) < 1000  # equal bytes per shard, up to one document
    # token estimate: tokens per byte of the sample, encoded with the bundled tokenizer as the pipeline does
    from albert_dist.data.text import split_sentences
    from albert_dist.data.tokenizer import load_tokenizer

    sp = load_tokenizer("data/sample/spiece.model")
    exact = sum(len(ids) for d in docs for ids in sp.encode(split_sentences(d)))
    assert manifest["tokens_estimate"] == pytest.approx(exact, rel=0.02)
    # the training reader plans one piece per row group
    pieces, _ = cut_pieces(SourceConfig(paths=[str(tmp_path / "out" / "*.parquet")]), "t", 1 << 22)
    assert len(pieces) == manifest["row_groups"]


def test_workers_do_not_change_the_output_and_duplicates_are_found_across_files(tmp_path, monkeypatch):
    # several input files (the later ones repeat earlier documents) and several scan pieces per file
    monkeypatch.setattr(scan, "SCAN_PIECE_BYTES", 8192)
    inputs = [_write(tmp_path / f"part{i}", DOCS[i * 100:(i + 1) * 100] + DOCS[:30], "txt", "")
              for i in range(4)]
    inputs.append(_write(tmp_path / "more", DOCS, "jsonl", ".gz"))
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        runs[workers] = run.prepare(_opts(inputs, out, workers=workers, row_group_bytes=2048, num_shards=5), "c")
        expected = list(dict.fromkeys(t for p in inputs for t in iter_texts(
            [SourceConfig(paths=[str(p)], text_field="content")], "t", 1 << 20)))
        assert _read_output(out) == expected
    assert [f["sha256"] for f in runs[1]["files"]] == [f["sha256"] for f in runs[2]["files"]]
    assert runs[1]["dedup"] == runs[2]["dedup"] and runs[1]["documents"] == len(set(DOCS))


def test_keep_duplicates(tmp_path):
    src = _write(tmp_path / "c", DOCS, "txt", ".gz")
    manifest = run.prepare(_opts([src], tmp_path / "out", dedup=False), "c")
    assert _read_output(tmp_path / "out") == DOCS and manifest["dedup"]["duplicates_dropped"] == 0


def test_bucketed_dedup_equals_the_in_memory_one(tmp_path):
    rng = np.random.default_rng(0)
    counts = [5000, 0, 3000, 7000]
    files, pool = [], rng.integers(0, 2**63, size=(9000, 2), dtype=np.uint64)
    for t, n in enumerate(counts):
        rows = np.zeros(n, dtype=scan.HASH_DTYPE)
        pick = rng.integers(0, len(pool), size=n)  # ~40% of the documents repeat an earlier hash
        rows["hi"], rows["lo"], rows["len"] = pool[pick, 0], pool[pick, 1], 10
        f = tmp_path / f"{t}.hash"
        rows.tofile(f)
        files.append(f)
    in_memory = dedup.find_duplicates(files, counts, 1 << 30, tmp_path / "d1")
    bucketed = dedup.find_duplicates(files, counts, 50_000, tmp_path / "d2")  # 15000 x 56 B / 50 kB = 17 buckets
    all_rows = np.concatenate([np.fromfile(f, dtype=scan.HASH_DTYPE) for f in files])
    seen, reference = set(), []
    for g, (hi, lo) in enumerate(zip(all_rows["hi"].tolist(), all_rows["lo"].tolist())):
        if (hi, lo) in seen:
            reference.append(g)
        seen.add((hi, lo))
    assert in_memory.tolist() == bucketed.tolist() == reference and len(reference) > 4000
    assert not any((tmp_path / "d2").iterdir())  # bucket files removed


def test_damaged_inputs_are_counted_skips_naming_file_and_offset(tmp_path, caplog):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = _write(tmp_path / "good", BASE[:100], "txt", "")
    gz = _write(tmp_path / "broken", [f"gz doc {i} " + "x" * 200 for i in range(20000)], "jsonl", ".gz")
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])  # a broken download
    zst = _write(tmp_path / "broken2", [f"zst doc {i} " + "z" * 200 for i in range(20000)], "txt", ".zst")
    data = zst.read_bytes()
    zst.write_bytes(data[: len(data) // 2])
    pq_path = tmp_path / "rg.parquet"
    pq.write_table(pa.table({"content": [f"pq doc {i} " + "y" * 300 for i in range(3000)]}), pq_path,
                   row_group_size=1000, compression="zstd")
    meta = pq.ParquetFile(pq_path).metadata
    col = meta.row_group(1).column(0)
    raw = bytearray(pq_path.read_bytes())
    mid = col.data_page_offset + col.total_compressed_size // 2
    raw[mid:mid + 64] = b"\xff" * 64  # corrupt the compressed data of row group 1
    pq_path.write_bytes(bytes(raw))
    footer = tmp_path / "footer.parquet"  # a parquet file whose footer does not parse: skipped whole, at planning
    pq.write_table(pa.table({"content": ["lost"] * 10}), footer)
    footer.write_bytes(footer.read_bytes()[:-12] + b"\x00" * 8 + b"PAR1")
    manifest = run.prepare(_opts([good, gz, zst, pq_path, footer], tmp_path / "out"), "c")
    texts = _read_output(tmp_path / "out")
    assert texts[:100] == BASE[:100]  # good files intact
    n_gz = sum(t.startswith("gz doc") for t in texts)
    assert 0 < n_gz < 20000 and [t for t in texts if t.startswith("gz doc")] == [
        f"gz doc {i} " + "x" * 200 for i in range(n_gz)]
    pq_docs = [int(t.split()[2]) for t in texts if t.startswith("pq doc")]
    # row groups 0 and 2 whole; of row group 1 what decoded before the damage (a prefix), not the rest
    in_group_1 = sorted(i for i in pq_docs if 1000 <= i < 2000)
    assert set(range(1000)) | set(range(2000, 3000)) <= set(pq_docs)
    assert in_group_1 == list(range(1000, 1000 + len(in_group_1))) and len(in_group_1) < 1000
    zst_docs = [int(t.split()[2]) for t in texts if t.startswith("zst doc")]
    assert 0 < len(zst_docs) < 20000 and zst_docs == list(range(len(zst_docs)))
    assert manifest["skipped"]["damaged"] == 4 and "lost" not in texts
    where = " ".join(ex["where"] + " " + ex.get("detail", "") for ex in manifest["skip_examples"])
    for fragment in ("broken.jsonl.gz, byte ", "broken2.txt.zst, byte ", "rg.parquet, row group 1 row ",
                     "footer.parquet parquet footer: "):
        assert fragment in where


def test_reruns_are_safe_and_an_interrupted_run_resumes(tmp_path, monkeypatch, capsys):
    src = _write(tmp_path / "c", DOCS, "jsonl", "")
    out = tmp_path / "out"
    argv = ["--input", str(src), "--text-field", "content", "--output", str(out), "--workers", "1",
            "--num-shards", "2", "--no-progress"]
    # interrupted while writing the second shard: nothing at --output, the scan is kept for the rerun
    real_write = run.write_shard

    def crash_on_second(index, *a):
        if index == 1:
            raise KeyboardInterrupt
        return real_write(index, *a)

    monkeypatch.setattr(run, "write_shard", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["data", "prepare", *argv])
    assert not out.exists() and (tmp_path / ("out" + run.TMP_SUFFIX) / "spool" / "000000.json").exists()
    monkeypatch.setattr(run, "write_shard", real_write)

    import albert_dist.data.sources.read as files

    def no_reading(*a, **k):
        raise AssertionError("the resumed run read an input again")

    monkeypatch.setattr(files, "read_piece", no_reading)  # the scan must come from the kept spool
    monkeypatch.setattr(jsonl, "line_blocks", no_reading)  # (JSON lines are read a block at a time)
    assert cli.main(["data", "prepare", *argv]) == 0
    monkeypatch.undo()
    assert "wrote 2 shards" in capsys.readouterr().out
    assert _read_output(out) == EXPECTED and not (tmp_path / ("out" + run.TMP_SUFFIX)).exists()
    # complete: a rerun says so and exits 0; other options: refused without --overwrite
    assert cli.main(["data", "prepare", *argv]) == 0 and "already complete" in capsys.readouterr().out
    assert cli.main(["data", "prepare", *argv[:-3], "--num-shards", "3", "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["data", "prepare", *argv[:-3], "--num-shards", "3", "--no-progress", "--overwrite"]) == 0
    assert json.loads((out / publish.MANIFEST_NAME).read_text())["num_shards"] == 3
    # a directory that is not a prepare output is never touched
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert cli.main(["data", "prepare", *argv[:argv.index("--output")], "--output", str(other), "--overwrite"]) == 2
    assert (other / "notes.txt").read_text() == "keep me" and "not an albert-dist data prepare output" in \
        capsys.readouterr().err


def test_a_work_directory_of_another_spool_format_is_scanned_again(tmp_path, monkeypatch):
    """An interrupted run's spool, left by a version whose spool files differ (state.json's spool_format), is
    not resumed: the rerun scans the inputs again and writes the right output."""
    src = _write(tmp_path / "c", DOCS, "jsonl", ".zst")
    opts = _opts([src], tmp_path / "out", num_shards=2, tokenizer_path=None)
    real_write = run.write_shard

    def crash(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "write_shard", crash)
    with pytest.raises(KeyboardInterrupt):
        run.prepare(opts, "c")
    monkeypatch.setattr(run, "write_shard", real_write)
    state = tmp_path / ("out" + run.TMP_SUFFIX) / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "spool_format": scan.SPOOL_FORMAT - 1}))
    scanned = []  # blocks read from the input
    real_blocks = jsonl.line_blocks
    monkeypatch.setattr(jsonl, "line_blocks", lambda *a: scanned.append(1) or real_blocks(*a))
    run.prepare(opts, "c")
    assert scanned and _read_output(tmp_path / "out") == EXPECTED


def test_config_sources_and_cli_errors(tmp_path, capsys):
    src = _write(tmp_path / "c", BASE[:50], "txt", ".zst")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data:\n  train:\n    - paths: ['{src}']\n")
    assert cli.main(["data", "prepare", "--config", str(recipe), "--output", str(tmp_path / "o"), "--workers", "1",
                     "--tokenizer", "none"]) == 0
    manifest = publish.load_manifest(tmp_path / "o")
    assert manifest["documents"] == 50 and manifest["tokens_estimate"] is None
    assert manifest["inputs"][0]["path"] == str(src)
    for argv, fragment in ([["--output", str(tmp_path / "x")], "no input"],
                           [["--input", str(tmp_path / "nope*.txt"), "--output", str(tmp_path / "x")], "matches no file"],
                           [["--input", str(src), "--output", str(tmp_path / "x"), "a.b=1"], "need --config"],
                           # a tokenizer that is not a model: refused before the scan, not after the whole run
                           [["--input", str(src), "--output", str(tmp_path / "t"), "--tokenizer",
                             str(tmp_path / "r.yaml")], "is not a sentencepiece model"],
                           # an output inside an input directory: the next run would read it as input
                           [["--input", str(src.parent), "--output", str(src.parent / "prepared")],
                            "lies inside the input directory"]):
        assert cli.main(["data", "prepare", *argv]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.strip().endswith(err.strip().split(": ")[-1]) and len(err.strip()) > 30
    assert not (tmp_path / "t.prepare-tmp").exists() and not (src.parent / "prepared.prepare-tmp").exists()


@pytest.mark.parametrize("text_gib, slots, rg, shards", [
    (1024, 8192, options.MAX_ROW_GROUP_BYTES, 2048),       # 1 TiB: 4 MiB row groups, 512 MiB files
    (4, 8192, 128 << 10, 256),                           # 4 GiB: 4 row groups per slot at 1,024 x 8
    (0.5, 8192, options.MIN_ROW_GROUP_BYTES, 64),          # small: the floor
])
def test_plan_sizes(tmp_path, text_gib, slots, rg, shards):
    opts = _opts([tmp_path], tmp_path / "o")
    sizes = options.shard_sizes(int(text_gib * 2**30), 10**9, opts)
    assert (sizes.row_group_bytes, sizes.num_shards, sizes.target_slots) == (rg, shards, slots)
    row_groups = text_gib * 2**30 / sizes.row_group_bytes
    if text_gib >= 2:
        assert row_groups >= options.ROW_GROUPS_PER_SLOT * slots
    assert options.shard_sizes(10**6, 3, _opts([tmp_path], tmp_path / "o", num_shards=10)).num_shards == 3
    assert options.shard_sizes(10**6, 10**4, _opts([tmp_path], tmp_path / "o", shard_bytes=10**5)).num_shards == 10


def test_dispatch_and_byte_sizes(tmp_path, capsys):
    import argparse

    from albert_dist.sizes import parse_byte_size

    src = _write(tmp_path / "c", BASE[:20], "txt", "")
    assert cli.main(["data", "prepare", "--input", str(src), "--output", str(tmp_path / "o"), "--workers", "1",
                     "--tokenizer", "none", "--shard-bytes", "1K", "--row-group-bytes", "0.5K"]) == 0
    manifest = publish.load_manifest(tmp_path / "o")
    assert manifest["row_group_bytes"] == 512 and manifest["num_shards"] == -(-manifest["bytes"] // 1024)
    assert cli.main(["data"]) == 2 and "usage: albert-dist data [-h] {prepare,plan}" in capsys.readouterr().err
    assert (parse_byte_size("64M"), parse_byte_size("1.5GiB"), parse_byte_size("4096")) == (64 << 20, 3 << 29, 4096)
    for bad in ("abc", "0", "-1M"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            parse_byte_size(bad)


def test_a_damaged_file_is_named_after_many_bad_records(tmp_path, caplog):
    """Skip examples are capped per reason: 30 malformed lines before a truncated .gz (the rest of a file lost)
    must not push the damaged file out of the manifest's examples and the console warnings."""
    import logging

    bad = tmp_path / "a-bad.jsonl"
    bad.write_text("".join('{"content": "ok %d"}\n{"content": broken\n' % i for i in range(30)))
    gz = _write(tmp_path / "b-broken", [f"gz doc {i} " + "x" * 200 for i in range(5000)], "jsonl", ".gz")
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    caplog.set_level(logging.WARNING, logger="albert_dist.data.prepare")
    manifest = run.prepare(_opts([bad, gz], tmp_path / "out"), "c")
    assert manifest["skipped"] == {"malformed_json": 30, "damaged": 1}
    reasons = [ex["reason"] for ex in manifest["skip_examples"]]
    assert reasons == ["malformed_json"] * scan.SKIP_EXAMPLES + ["damaged"]
    assert "b-broken.jsonl.gz, byte " in manifest["skip_examples"][-1]["where"]
    warned = [r.getMessage() for r in caplog.records if "skipped a record" in r.getMessage()]
    assert len(warned) == run.SKIP_WARNINGS + 1 and "(damaged) at " in warned[-1] and "b-broken" in warned[-1]


def test_a_zero_byte_input_is_a_counted_skip(tmp_path, caplog):
    """A 0-byte shard (often a failed download) is counted and warned, as the training loader does; the
    summary said "skipped nothing"."""
    import logging

    good = _write(tmp_path / "good", BASE[:20], "jsonl", "")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="albert_dist.data.prepare")
    manifest = run.prepare(_opts([good, empty], tmp_path / "out"), "c")
    assert manifest["documents"] == 20 and manifest["skipped"] == {"empty_file": 1}
    assert manifest["skip_examples"] == [{"reason": "empty_file", "where": str(empty)}]
    assert [r.getMessage() for r in caplog.records if str(empty) in r.getMessage()] == [
        f"skipped a record (empty_file) at {empty}"]  # once


def test_a_second_prepare_on_one_output_is_refused_naming_the_holder(tmp_path, capsys):
    """While one prepare holds an output (its lock taken, as a live run holds it), another is exit 2 naming the
    holder's pid, and the output and its work directory are untouched; once released, the prepare runs and its
    manifest's sha256 match the shards on disk."""
    import hashlib

    src = _write(tmp_path / "in", DOCS, "jsonl", "")
    out = tmp_path / "out"
    holder = lock.OutputLock(tmp_path / f".out{lock.LOCK_SUFFIX}", str(out)).acquire()
    try:
        code = cli.main(["data", "prepare", "--input", str(src), "--output", str(out), "--tokenizer", "none", "--text-field",
                            "content"])
        err = capsys.readouterr().err
        assert code == 2 and f"pid {os.getpid()} on host" in err and str(out) in err, err
        assert not out.exists() and not (tmp_path / f"out{run.TMP_SUFFIX}").exists()
    finally:
        holder.release()
    manifest = run.prepare(_opts([src], out, tokenizer_path=None), "t")
    for entry in manifest["files"]:
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    assert _read_output(out) == EXPECTED


def test_an_unquoted_glob_is_every_file_it_matched(tmp_path, capsys):
    """`data prepare --input /x/*.txt.zst` unquoted: the shell hands over every match after one --input. All of
    them are read (they used to become "key=value overrides [...] need --config"), in the order given."""
    files = [_write(tmp_path / f"part{k}", BASE[k * 100:(k + 1) * 100], "txt", ".zst") for k in range(3)]
    out = tmp_path / "o"
    assert cli.main(["data", "prepare", "--input", *map(str, files), "--output", str(out), "--workers", "1",
                     "--tokenizer", "none", "--no-progress"]) == 0, capsys.readouterr().err
    manifest = publish.load_manifest(out)
    assert [i["path"] for i in manifest["inputs"]] == list(map(str, files))
    assert _read_output(out) == BASE[:300]


def test_the_one_byte_formatter_reads_back_as_parse_byte_size_reads_it():
    """`fmt_bytes` (memory line, data plan/prepare, tokenizer): powers of 1024, the unit `parse_byte_size` reads,
    so a printed size pasted back as an option is the same size to its printed precision."""
    from albert_dist.sizes import fmt_bytes, parse_byte_size

    assert [fmt_bytes(n) for n in (512, 1536, 2**30 - 1, 8 * 2**30, 3 * 2**40)] == [
        "512 B", "1.5 KiB", "1.00 GiB", "8.00 GiB", "3.00 TiB"]
    for n in (3_000, 7 * 2**20 + 12345, 5 * 2**30 + 2**28, 2**41):
        text = fmt_bytes(n)
        assert abs(parse_byte_size(text.replace(" ", "")) - n) <= 0.05 * 2**(10 * ("KMGT".index(text.split()[1][0]) + 1))
