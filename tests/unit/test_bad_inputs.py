"""Bad corpus and config input is found when the job is built and named: the text field of every jsonl/parquet
source (checked on its first records), a YAML syntax error (file:line), a tokenizer that is not a model, an
unwritable output directory (a crash in setup: tests/integration/test_train_crash.py)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from albert_dist import cli
from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.read import check_text_field
from albert_dist.data.sources.discover import cut_pieces
from albert_dist.data.stream import pieces_of

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")



def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_missing_text_field_is_found_on_the_first_records_naming_field_file_and_keys(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", [{"text": "a b c"}] * 3)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"content": "a b", "id": i} for i in range(40)])
    check_text_field(SourceConfig(paths=[str(good)]), "data.train[0]")
    with pytest.raises(ValueError) as err:
        pieces_of(SourceConfig(paths=[str(bad)]), "data.train[1]", 1 << 16)  # what building the loader does
    assert str(err.value) == (f"data.train[1].text_field='text' is not a key of the first 16 records of {bad} "
                              f"(keys found: ['content', 'id'])")
    check_text_field(SourceConfig(paths=[str(bad)], text_field="content"), "data.train[1]")
    # a .json file holding one pretty-printed array (a common corpus dump) says JSON lines are expected
    array = tmp_path / "lunyu.json"
    array.write_text(json.dumps([{"text": f"chapter {i}"} for i in range(5)], indent=2))
    with pytest.raises(ValueError, match=r"keys found: none: no JSON object\); JSON lines are read: one object per "
                                         r"line, not one JSON array"):
        check_text_field(SourceConfig(paths=[str(array)]), "data.train[0]")


def test_missing_parquet_column_is_named(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": ["x y"], "n": [1]}), path)
    with pytest.raises(ValueError, match=r"data.train\[0\].text_field='text' is not a column of .*c.parquet "
                                         r"\(columns: \['body', 'n'\]\)"):
        check_text_field(SourceConfig(paths=[str(path)]), "data.train[0]")


def test_train_refuses_a_missing_text_field_with_exit_2(tmp_path, capsys, no_process_group):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"content": "a b"}])
    code = cli.main(["train", "--config", RECIPE, "tracking.enabled=false", f"data.train=[{{paths: [{bad}]}}]"])
    err = capsys.readouterr().err
    assert code == 2 and "data.train[0].text_field='text' is not a key" in err and "['content']" in err


def test_a_source_of_one_too_long_document_is_exit_2_naming_slot_file_and_too_long(tmp_path, capsys,
                                                                                 no_process_group):
    """A .txt that is one document longer than data.max_document_bytes (a new user's 10 MB one-line file, here
    scaled down) passed the preflight and failed at the first batch with a traceback, exit 1."""
    one = tmp_path / "one-line.txt"
    one.write_text("word " * 40_000 + "\n")
    code = cli.main(["train", "--config", RECIPE, "tracking.enabled=false", f"data.train=[{{paths: [{one}]}}]",
                     "data.max_document_bytes=65536"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    # the span is the file's (the share of the one slot), not the bytes the probe read (it re-reads the record's
    # tail from each piece inside it: "the 16.7 MiB it read" of a 9.5 MiB file)
    assert err.startswith(f"albert-dist train: data.train[0]: slot 0 of 1 (ranks x loader workers) would read no "
                          f"usable record from {one}: every record that begins in its share (195.3 KiB) is longer "
                          "than data.max_document_bytes=65536 (skipped {'too_long': 1})"), err


def test_a_missing_tokenizer_is_exit_2_naming_data_tokenizer_path(tmp_path, capsys, no_process_group):
    missing = tmp_path / "nope.model"
    assert cli.main(["train", "--config", RECIPE, "tracking.enabled=false", f"data.tokenizer_path={missing}"]) == 2
    err = capsys.readouterr().err
    assert err == f"albert-dist train: data.tokenizer_path: tokenizer {str(missing)!r} is not a file\n"


def test_a_tokenizer_vocab_file_is_exit_2_naming_the_model_beside_it(capsys, no_process_group):
    """`data.tokenizer_path` naming `spiece.vocab` (the text listing beside `spiece.model`) was sentencepiece's
    RuntimeError, a traceback and exit 1."""
    vocab = REPO / "data/sample/spiece.vocab"
    assert cli.main(["train", "--config", RECIPE, "tracking.enabled=false", f"data.tokenizer_path={vocab}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"albert-dist train: data.tokenizer_path: tokenizer {str(vocab)!r} is not a sentencepiece "
                          "model (the .vocab file is its text listing: name the .model beside it)")
    assert err.count("\n") == 1 and "Traceback" not in err


def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create anything in: a 0555 one (not root), else a read-only mount root
    writes to neither (a container's /proc/sys)."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")
    pytest.skip("running as root with no unwritable directory to try")


@pytest.mark.parametrize("field", ["run_dir", "checkpoint.dir"])
def test_an_unwritable_output_directory_is_exit_2_before_anything_starts(tmp_path, capsys, no_process_group, field):
    """A `run_dir` or `checkpoint.dir` that cannot be written (a read-only file system) was an OSError traceback
    and exit 1 (the launch script then offered `--resume auto`); now the preflight refuses it, exit 2."""
    target = _unwritable_dir(tmp_path) / "albert-run"
    extra = [f"run_dir={tmp_path / 'run'}"] if field == "checkpoint.dir" else []
    assert cli.main(["train", "--config", RECIPE, "tracking.enabled=false", *extra, f"{field}={target}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"albert-dist train: {field}={str(target)!r}: cannot write there (its parent "
                          f"{str(target.parent)!r}): "), err
    assert err.count("\n") == 1 and not target.exists()


def test_yaml_syntax_error_is_exit_2_with_file_and_line(tmp_path, capsys, no_process_group):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("model:\n  hidden_size: 32\ndata:\n  train: [{paths: [a.txt]}\n  max_seq_length: 64\n")
    assert cli.main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"albert-dist train: {recipe}:5:") and "not valid YAML" in err
    assert "line 4" in err and "Traceback" not in err



def test_skipped_records_are_named_by_file_and_line(tmp_path, caplog):
    from albert_dist.data.stream import SourceStream

    path = tmp_path / "c.jsonl"
    rows = [json.dumps({"text": f"document number {i} with words"}) for i in range(6)]
    rows[3] = "{not json"
    rows[5] = json.dumps({"text": "   "})
    path.write_text("\n".join(rows) + "\n")
    src = SourceConfig(paths=[str(path)])
    pieces, _ = cut_pieces(src, "data.train[0]", 1 << 20)
    stream = SourceStream(src, "data.train[0]", pieces, 0, 1, seed=0, shuffle=False, max_document_bytes=1 << 20)
    with caplog.at_level(logging.WARNING):
        while stream.epoch == 0:
            stream.next_document()
    assert f"skipped the record at {path}:4 (malformed_json, 9 bytes" in caplog.text
    assert f"skipped the record at {path}:6 (empty" in caplog.text


def test_a_single_document_corpus_warns_how_often_it_repeats(tmp_path, caplog):
    from albert_dist.data.config import DataConfig
    from albert_dist.data.loader import build_train_loader

    path = tmp_path / "one.txt"
    path.write_text(" ".join(f"Sentence number {i} is here." for i in range(60)) + "\n")  # no blank line: one document
    cfg = DataConfig(train=[SourceConfig(paths=[str(path)])], validation=[], max_seq_length=32, num_workers=0,
                     tokenizer_path=str(REPO / "data/sample/spiece.model"))
    it = iter(build_train_loader(cfg, 4, 0, 1))
    with caplog.at_level(logging.WARNING):
        for _ in range(60):
            next(it)
    warnings = [r.getMessage() for r in caplog.records if "holds a single document" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("data.train[0]: slot 0 of 1 (rank x workers) holds a single document; its ")
    assert "examples repeat about every" in warnings[0]


def test_a_segmenter_that_cannot_be_imported_is_exit_2_before_any_process_group(capsys, monkeypatch,
                                                                               no_process_group):
    """rjieba and jieba not importable: the preflight says so in one line (every loader worker died of a chained
    ImportError after the process group and the MLflow run had started)."""
    import sys

    for name in ("rjieba", "jieba"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    code = cli.main(["train", "--config", RECIPE, "tracking.enabled=false", "data.chinese_word_segmentation=jieba",
                     "data.whole_word_masking=true"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("albert-dist train: data.chinese_word_segmentation=jieba: the segmenter cannot be "
                          "imported (rjieba, or jieba: "), err
    assert err.endswith("install it or set data.chinese_word_segmentation=none\n"), err


def test_a_segmenter_without_whole_word_masking_is_warned_and_the_recipes_are_not(caplog):
    """jieba words with data.whole_word_masking=false (the README recipe's value) change no mask: warned on rank 0
    only; the zhwiki recipe (jieba, whole words) and the README recipe as written pass quietly."""
    from albert_dist.config import load_config
    from albert_dist.apps.pretrain.preflight import check_data_settings

    zhwiki = load_config(str(REPO / "configs/pretrain/albert-tiny-zhwiki.yaml"))
    readme = load_config(RECIPE)
    assert (zhwiki.data.chinese_word_segmentation, zhwiki.data.whole_word_masking) == ("jieba", True)
    with caplog.at_level(logging.WARNING, logger="albert_dist.apps.pretrain.preflight"):
        check_data_settings(zhwiki)
        check_data_settings(readme)
        assert not caplog.records
        mixed = load_config(RECIPE, ["data.chinese_word_segmentation=jieba"])
        check_data_settings(mixed, log=False)  # another rank
        assert not caplog.records
        check_data_settings(mixed)
    (record,) = caplog.records
    assert record.getMessage().startswith("data.chinese_word_segmentation=jieba does not change the masking with "
                                          "data.whole_word_masking=false"), record.getMessage()
