"""Every advertised format through every command (issue 19): txt / jsonl / parquet x none / .gz / .zst (parquet:
its own codecs), written by the standard libraries (gzip, zstandard, pyarrow), through `albert-dist tokenizer
train`, the preflight checks, the training stream, the fixed validation set, exact resume (0 and 2 workers),
`albert-dist data plan` and one real `albert-dist train` run with a resume. Damaged files of every format are a
counted skip of the rest of the piece (file and byte in the warning), never a crash or a crash loop on resume.
User-facing errors name the file and never print an empty reason.

The reference for every format is the same documents written as plain .txt: the same texts in the same order,
the same tokenizer bytes, the same validation set.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import read_metrics, run_cli

from albert_dist import cli
from albert_dist.data import tokenizer as tok
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader
from albert_dist.data.sources.discover import slot_shares
from albert_dist.data.sources.pieces import job_sources
from albert_dist.data.stream import SourceStream, iter_texts, pieces_of
from albert_dist.data.validation import build_validation_set

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
SPIECE = str(REPO / "data/sample/spiece.model")

#: name -> (file name, writer kind, compression or parquet codec)
FORMATS = {
    "txt": ("c.txt", "txt", ""),
    "txt.gz": ("c.txt.gz", "txt", "gz"),
    "txt.zst": ("c.txt.zst", "txt", "zst"),
    "jsonl": ("c.jsonl", "jsonl", ""),
    "jsonl.gz": ("c.jsonl.gz", "jsonl", "gz"),
    "jsonl.zst": ("c.jsonl.zst", "jsonl", "zst"),
    "json.gz": ("c4-style.json.gz", "jsonl", "gz"),  # C4's naming
    "parquet": ("c-none.parquet", "parquet", "none"),
    "parquet-gzip": ("c-gzip.parquet", "parquet", "gzip"),
    "parquet-zstd": ("c-zstd.parquet", "parquet", "zstd"),
    "snappy.parquet": ("part-0.snappy.parquet", "parquet", "snappy"),  # Spark's naming, pyarrow's default codec
}
ROWS_PER_GROUP = 6
PIECE = 4096  # data.shard_piece_bytes of these tests: several byte-range pieces per uncompressed file


def _documents() -> list[str]:
    """30 real documents (paragraphs of the bundled WikiText-2 sample, each cut to ~1.2 KB at a sentence end)."""
    text = (REPO / "data/sample/wikitext-2-train-00.txt").read_text()
    docs = []
    for para in (p.strip() for p in text.splitlines()):
        if para.count(" . ") >= 3:
            cut = para[:1200]
            docs.append(cut[: cut.rfind(" . ") + 2])
        if len(docs) == 30:
            return docs
    raise AssertionError("the bundled sample changed")


DOCS = _documents()


def write_format(path: Path, kind: str, codec: str, docs: list[str] = DOCS) -> Path:
    """``docs`` written as ``kind`` with the standard library of the format (gzip, zstandard, pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    if kind == "parquet":
        pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), path, row_group_size=ROWS_PER_GROUP,
                       compression=codec)
        return path
    data = ("\n\n".join(docs) + "\n" if kind == "txt"
            else "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))).encode()
    if codec == "gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif codec == "zst":
        with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for name, (filename, kind, codec) in FORMATS.items():
        (root / name).mkdir()
        out[name] = write_format(root / name / filename, kind, codec)
    return out


def _vocab(model_dir: Path) -> list[tuple[str, float]]:
    """The pieces and scores of a trained model (the proto's bytes also hold the output path)."""
    sp = tok.load_tokenizer(str(model_dir / "spiece.model"))
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


@pytest.fixture(scope="module")
def reference_tokenizer(corpus, tmp_path_factory) -> list[tuple[str, float]]:
    out = tmp_path_factory.mktemp("tok-ref")
    assert cli.main(["tokenizer", "train", "--input", str(corpus["txt"]), "--vocab-size", "120", "--output", str(out)]) == 0
    return _vocab(out)


def _cfg(*sources: SourceConfig, **kw) -> DataConfig:
    base = dict(validation=[], tokenizer_path=SPIECE, max_seq_length=64, num_workers=0, shard_piece_bytes=PIECE)
    return DataConfig(train=list(sources), **{**base, **kw})


def _epoch(stream: SourceStream) -> list[str]:
    docs = []
    while True:
        text, (epoch, _) = stream.next_document()
        if epoch > 0:
            return docs
        docs.append(text)


def _same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("name", list(FORMATS))
def test_format_through_every_command(name, corpus, reference_tokenizer, tmp_path):
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    path = corpus[name]
    src = SourceConfig(paths=[str(path)])
    # documents, in file order (tokenizer input, token counts) and through an unshuffled slot stream
    assert list(iter_texts([src], "t", 1 << 20)) == DOCS
    pieces = pieces_of(src, "data.train[0]", PIECE)
    assert _epoch(SourceStream(src, "t", pieces, 0, 1, seed=0, shuffle=False, max_document_bytes=1 << 20)) == DOCS
    # the tokenizer: the same pieces and scores as from the plain .txt
    out = tmp_path / "tok"
    assert cli.main(["tokenizer", "train", "--input", str(path.parent / "*"), "--vocab-size", "120", "--output", str(out)]) == 0
    assert _vocab(out) == reference_tokenizer
    # the preflight of `albert-dist train` accepts it, and names the file when the text field is wrong
    cfg = load_config(RECIPE, ["tracking.enabled=false", f"data.train=[{{paths: [{path}]}}]",
                               f"data.validation=[{{paths: [{path}]}}]"])
    preflight.check_inputs(cfg)
    kind = FORMATS[name][1]
    if kind != "txt":
        bad = load_config(RECIPE, ["tracking.enabled=false", f"data.train=[{{paths: [{path}], text_field: body}}]"])
        with pytest.raises(ValueError, match=f"data.train\\[0\\].text_field='body' is not a .* of {path}"):
            preflight.check_inputs(bad)
    # the fixed validation set is the .txt one's
    vcfg = _cfg(SourceConfig(paths=[str(corpus["txt"])]), validation=[src], eval_examples=10_000)
    ref = build_validation_set(_cfg(SourceConfig(paths=[str(corpus["txt"])]), validation=[
        SourceConfig(paths=[str(corpus["txt"])])], eval_examples=10_000))
    got = build_validation_set(vcfg)
    assert got.documents == len(DOCS) and len(got) == len(ref) > 30
    _same_batches([got.batch], [ref.batch])
    # exact resume in the training process (2 workers: test_every_format_resumes_exactly_with_two_workers)
    tcfg = _cfg(src)
    reference = [b for _, b in zip(range(10), build_train_loader(tcfg, 4, rank=1, world_size=2))]
    first = build_train_loader(tcfg, 4, rank=1, world_size=2)
    it = iter(first)
    _same_batches([next(it) for _ in range(4)], reference[:4])
    resumed = build_train_loader(tcfg, 4, rank=1, world_size=2)
    resumed.load_state_dict(first.state_dict())
    _same_batches([b for _, b in zip(range(6), resumed)], reference[4:])
    # `albert-dist data plan`: the pieces the format allows (2 ranks x 2 workers = 4 slots)
    (plan,) = job_sources(_cfg(src), ranks=2, workers=2)
    expected = {"txt": -(-path.stat().st_size // PIECE), "jsonl": -(-path.stat().st_size // PIECE)}.get(name, 1)
    if kind == "parquet":
        expected = -(-len(DOCS) // ROWS_PER_GROUP)
    assert plan.pieces == expected
    assert plan.amplification == pytest.approx(1.0 if expected >= 4 else 4 / expected)


def test_every_format_resumes_exactly_with_two_workers(corpus):
    """All formats mixed in one stream, 2 ranks x 2 workers: compressed files are single pieces shared by the 4
    slots, the others several pieces; resumed twice, it gives the uninterrupted run's batches."""
    cfg = _cfg(*[SourceConfig(paths=[str(p)]) for p in corpus.values()], num_workers=2, shuffle_documents=4)
    reference = [b for _, b in zip(range(12), build_train_loader(cfg, 4, rank=0, world_size=2))]
    first = build_train_loader(cfg, 4, rank=0, world_size=2)
    it = iter(first)
    _same_batches([next(it) for _ in range(5)], reference[:5])
    second = build_train_loader(cfg, 4, rank=0, world_size=2)
    second.load_state_dict(first.state_dict())
    it = iter(second)
    _same_batches([next(it) for _ in range(3)], reference[5:8])
    third = build_train_loader(cfg, 4, rank=0, world_size=2)
    third.load_state_dict(second.state_dict())
    _same_batches([b for _, b in zip(range(4), third)], reference[8:])


def test_train_through_the_cli_on_every_format(corpus, tmp_path):
    """One real `albert-dist train` (1 rank, 2 steps) over a directory holding every format, with a .jsonl.zst
    validation set: the preflight passes, the run trains, validates and checkpoints (the loader-level resume
    tests above cover exact resume per format)."""
    data = tmp_path / "all"
    data.mkdir()
    for name, path in corpus.items():
        os.symlink(path, data / f"{name}-{path.name}")
    run_dir = tmp_path / "run"
    proc = run_cli("train", "--config", RECIPE, f"run_dir={run_dir}", "max_steps=2", "engine.zero_stage=0",
                   "engine.train_micro_batch_size_per_gpu=2", "data.max_seq_length=32", "data.max_predictions_per_seq=4",
                   "data.num_workers=0", "data.eval_examples=8", "tracking.enabled=false", "progress_bar=false",
                   "log_interval_steps=1", f"data.train=[{{paths: [{data}]}}]",
                   f"data.validation=[{{paths: [{corpus['jsonl.zst']}]}}]", "data.shard_piece_bytes=4096", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
    assert any("val/loss" in r for r in records)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"


# ------------------------------------------------------------------------------------------------ damaged files
def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _corrupt(path: Path, at: float) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i : i + 64] = bytes(64)  # a zeroed run: a corrupt deflate/zstd block
    path.write_bytes(bytes(data))


def _corrupt_row_group(path: Path, group: int) -> None:
    import pyarrow.parquet as pq

    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
    data = bytearray(path.read_bytes())
    data[start : start + 24] = b"\xff" * 24  # the page header no longer parses
    path.write_bytes(bytes(data))


def _big() -> list[str]:
    """720 distinct documents (~420 KB): DOCS with their words shuffled per copy, so they do not compress to
    nothing; several deflate and zstd blocks (128 KB), so a damaged stream still decodes up to the damage (a
    block is the smallest unit either format decodes)."""
    rng = np.random.default_rng(0)
    return [" ".join(rng.permutation(d.split()).tolist()) + f" Copy {i} ." for i in range(24) for d in DOCS]


BIG = _big()
#: name -> (format written, how it is damaged, documents a reader still gets (None: a prefix))
DAMAGE = {
    "txt.gz truncated": ("txt.gz", lambda p: _truncate(p, 0.7), None),
    "jsonl.gz truncated": ("jsonl.gz", lambda p: _truncate(p, 0.7), None),
    "jsonl.gz corrupt": ("jsonl.gz", lambda p: _corrupt(p, 0.5), None),
    "txt.zst truncated": ("txt.zst", lambda p: _truncate(p, 0.7), None),
    "jsonl.zst truncated": ("jsonl.zst", lambda p: _truncate(p, 0.7), None),
    "jsonl.zst corrupt": ("jsonl.zst", lambda p: _corrupt(p, 0.5), None),
    "parquet row group": ("parquet-zstd", lambda p: _corrupt_row_group(p, 2),
                          BIG[: 2 * ROWS_PER_GROUP] + BIG[3 * ROWS_PER_GROUP :]),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_file_is_a_counted_skip_and_resumes(case, tmp_path, caplog):
    name, damage, survivors = DAMAGE[case]
    filename, kind, codec = FORMATS[name]
    path = write_format(tmp_path / filename, kind, codec, BIG)
    damage(path)
    src = SourceConfig(paths=[str(path)])
    pieces = pieces_of(src, "data.train[0]", PIECE)
    stream = SourceStream(src, "data.train[0]", pieces, 0, 1, seed=0, shuffle=False, max_document_bytes=1 << 20)
    with caplog.at_level(logging.WARNING):
        docs = _epoch(stream)
    assert stream.counters["skipped_damaged"] == 1
    if survivors is not None:
        assert docs == survivors
    else:  # a prefix of the documents, the last perhaps cut short (a record ends where the damage starts)
        assert 10 < len(docs) < len(BIG) and docs[:-1] == BIG[: len(docs) - 1], len(docs)
    warning = next(r.getMessage() for r in caplog.records if "skipped the rest of a piece" in r.getMessage())
    assert str(path) in warning and "byte" in warning and "damaged" in warning, warning
    # the tokenizer reads around it, with the same warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert list(iter_texts([src], "--input", 1 << 20)) == docs
    assert str(path) in caplog.text and "damaged" in caplog.text
    # the training stream (shuffled) resumes exactly from before the damage, from the last document before
    # it (the resume re-reads the piece and meets the damage at the same place: no crash loop) and after it
    def fresh() -> SourceStream:
        return SourceStream(src, "data.train[0]", pieces, 0, 1, seed=3, shuffle=True, max_document_bytes=1 << 20)

    reference = fresh()
    sequence = [reference.next_document() for _ in range(len(docs) + 5)]
    assert reference.counters["skipped_damaged"] == 1
    for cut in (5, len(docs) - 1, len(docs) + 2):
        first = fresh()
        assert [first.next_document() for _ in range(cut)] == sequence[:cut]
        resumed = fresh()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert [resumed.next_document() for _ in range(len(sequence) - cut)] == sequence[cut:]


def test_a_parquet_file_with_a_damaged_footer_is_skipped_at_planning(tmp_path, caplog):
    good = write_format(tmp_path / "a.parquet", "parquet", "zstd")
    bad = write_format(tmp_path / "b.parquet", "parquet", "zstd")
    bad.write_bytes(bad.read_bytes()[:-40])  # footer cut: not a parquet file any more
    src = SourceConfig(paths=[str(tmp_path / "*.parquet")])
    with caplog.at_level(logging.WARNING):
        pieces = pieces_of(src, "data.train[0]", PIECE)
    assert {p["path"] for p in pieces} == {str(good)}
    assert f"skipping {bad}: not a readable parquet file" in caplog.text
    (plan,) = job_sources(_cfg(src), ranks=1, workers=0)
    assert plan.damaged_files == 1 and plan.files == 2
    with pytest.raises(ValueError, match=r"holds only empty or damaged files \(1 files: 0 empty, 1 damaged\)"):
        pieces_of(SourceConfig(paths=[str(bad)]), "data.train[0]", PIECE)


# ------------------------------------------------------------------------------------------------ user-facing errors
def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (input path, a fragment the error must hold besides the file name)."""
    zst = write_format(tmp_path / "fields.jsonl.zst", "jsonl", "zst")
    pq_gz = tmp_path / "whole.parquet.gz"
    pq_gz.write_bytes(gzip.compress(write_format(tmp_path / "w.parquet", "parquet", "none").read_bytes()))
    unknown = tmp_path / "notes.csv"
    unknown.write_text("a,b\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    return {
        "missing file": (tmp_path / "nope.jsonl", "does not exist"),
        "empty glob": (tmp_path / "none-*.jsonl.zst", "matches no file"),
        "unknown suffix": (unknown, "cannot tell the format"),
        "compressed parquet": (pq_gz, "cannot be read in place"),
        "wrong text field in .jsonl.zst": (zst, "text_field='body' is not a key of the first 16 records"),
        "only empty files": (empty, "holds only empty"),
    }


def _error_of(capsys, command: list[str], runner) -> str:
    handlers = logging.root.handlers[:]  # commands configure logging onto the captured stderr of this call
    try:
        rc = runner(command)
    finally:
        logging.root.handlers[:] = handlers
    err = capsys.readouterr().err.strip()
    assert rc == 2, (command, err)
    *logged, line = err.splitlines()  # log lines (an earlier in-process command may have set INFO) + the error
    assert all(x.startswith("[rank") for x in logged), err
    return line


@pytest.mark.parametrize("case", ["missing file", "empty glob", "unknown suffix", "compressed parquet",
                                  "wrong text field in .jsonl.zst", "only empty files"])
def test_user_facing_errors_name_the_file_and_a_reason(case, tmp_path, capsys, monkeypatch):
    """`albert-dist tokenizer train`, `albert-dist train` (preflight) and `albert-dist data plan` on bad input:
    exit 2, one line, the input named, the reason non-empty and the expected one."""
    from albert_dist.distributed import group as distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed, "init_distributed", lambda *a, **k: pytest.fail("process group started"))
    path, fragment = _bad_inputs(tmp_path)[case]
    field = ["text_field: body"] if "text field" in case else []
    source = "{" + ", ".join([f"paths: ['{path}']"] + field) + "}"
    commands = {
        "albert-dist tokenizer train: ": ["tokenizer", "train", "--input", str(path), "--vocab-size", "50",
                                           "--output", str(tmp_path / "tok")] + (["--text-field", "body"] if field else []),
        "albert-dist train: ": ["train", "--config", RECIPE, "tracking.enabled=false", f"data.train=[{source}]"],
        "albert-dist data plan: ": ["data", "plan", "--config", RECIPE, "--ranks", "2",
                                           f"data.train=[{source}]"],
    }
    for prefix, command in commands.items():
        err = _error_of(capsys, command, cli.main)
        assert err.startswith(prefix) and "\n" not in err, err
        reason = err[len(prefix):]
        # the tokenizer trains from all inputs together: an empty one is "no text" (sentencepiece's C++ check)
        expected = "hold no text" if case == "only empty files" and "tokenizer" in prefix else fragment
        assert reason.strip() and str(path.name) in reason and expected in reason, err


def test_an_error_without_a_message_is_named_by_its_type():
    from albert_dist.exit_codes import error_line

    assert error_line("albert-dist tokenizer: error", ValueError()) == (
        "albert-dist tokenizer: error: ValueError (raised without a message)")
    import io

    assert error_line("x", io.UnsupportedOperation()).endswith("UnsupportedOperation (raised without a message)")


# ------------------------------------------------------------------------------------------------ plan = loader
def _doc_slot_examples(monkeypatch):
    """One example per document carrying the document's index in DOCS-like corpora and the worker id."""
    from albert_dist.data import loader as loader_mod
    from albert_dist.data.pretraining import Example

    def build(self, text, rng):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        ids = np.array([2, 1000 + int(text.split()[1]), 3, 2000 + worker, 3], dtype=np.int32)
        return [Example(ids, 1, np.zeros(0, np.int64), np.zeros(0, np.int32), 0)]

    monkeypatch.setattr(loader_mod.ExampleBuilder, "build_documents",  # the loader builds a window at once
                        lambda self, texts, rngs: [build(self, t, r) for t, r in zip(texts, rngs)])


@pytest.mark.parametrize("layout", ["pieces >= slots", "pieces < slots"])
def test_plan_gives_the_slot_assignment_the_loader_reads(layout, tmp_path, monkeypatch):
    """2 ranks x 2 workers through the real loader (worker processes): the documents each (rank, worker) reads
    are exactly those of the pieces (and shares) the plan assigns to its slot."""
    _doc_slot_examples(monkeypatch)
    docs = [f"doc {i} " + "word " * (20 + (i * 37) % 400) for i in range(60)]
    if layout == "pieces >= slots":  # 3 uneven jsonl files cut into byte ranges
        files = [write_format(tmp_path / f"s{k}.jsonl", "jsonl", "", docs[a:b])
                 for k, (a, b) in enumerate([(0, 5), (5, 25), (25, 60)])]
    else:  # 3 compressed files: one piece each, shared by the 4 slots
        files = [write_format(tmp_path / f"s{k}.jsonl.zst", "jsonl", "zst", docs[a:b])
                 for k, (a, b) in enumerate([(0, 5), (5, 25), (25, 60)])]
    src = SourceConfig(paths=[str(tmp_path / "s*")])
    cfg = _cfg(src, num_workers=2, shard_piece_bytes=2048)
    (plan,) = job_sources(cfg, ranks=2, workers=2)
    assert (plan.pieces >= 4) == (layout == "pieces >= slots")
    # what the plan says each slot reads: the documents of its pieces (byte ranges: a record belongs to the
    # piece its first byte is in), j-th of every k records for a shared piece
    starts = {}
    for path in files:
        offset = 0
        for line in path.read_bytes().splitlines(keepends=True) if path.suffix == ".jsonl" else []:
            starts[(str(path), offset)] = int(json.loads(line)["text"].split()[1])
            offset += len(line)
    expected = []
    for slot in range(4):
        own = set()
        for index, k, j in slot_shares(plan.pieces, 4, slot):
            piece = plan.piece_list[index]
            if piece["compression"]:
                import zstandard

                lines = zstandard.ZstdDecompressor().decompress(Path(piece["path"]).read_bytes(),
                                                                max_output_size=1 << 24).splitlines()
                own |= {int(json.loads(x)["text"].split()[1]) for x in lines[j::k]}
            else:
                own |= {d for (p, off), d in starts.items() if p == piece["path"] and piece["start"] <= off < piece["end"]}
        expected.append(own)
    assert set().union(*expected) == set(range(60)) and sum(map(len, expected)) == 60
    for rank in range(2):
        it = iter(build_train_loader(cfg, 2, rank=rank, world_size=2))
        ids = np.concatenate([next(it)["input_ids"].numpy() for _ in range(60)])
        got = {w: set((ids[ids[:, 3] - 2000 == w, 1] - 1000).tolist()) for w in range(2)}
        for w in range(2):
            assert got[w] == expected[rank * 2 + w], (rank, w)
    counts = Counter(len(s) for s in expected)
    assert counts  # every slot owns documents
