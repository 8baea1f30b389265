"""Tokenizer: ALBERT's special ids, transformers' AlbertTokenizer agreement, "[MASK]" in text, the CLI, byte fallback."""
from __future__ import annotations

import gzip
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from albert_dist import cli
from albert_dist.data import tokenizer as tok
from albert_dist.data.config import DataConfig
from albert_dist.data.pretraining import ExampleBuilder

SAMPLE_TEXT = (
    "The film was released in 1999 and received mixed reviews from critics.\n"
    "He later starred in several television series, including The Bill."
)


@pytest.fixture(scope="module")
def sample_sp():
    return tok.load_tokenizer(DataConfig().tokenizer_path)


def test_bundled_model_has_albert_ids_and_vocab_8000(sample_sp):
    assert sample_sp.get_piece_size() == 8000  # == the albert-tiny preset's vocab_size
    assert [sample_sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]


def test_transformers_albert_tokenizer_agrees(sample_sp):
    transformers = pytest.importorskip("transformers")
    from albert_dist.data.sources.discover import resolve_path

    # transformers >= 5 converts a directory's spiece.model (its __init__ ignores vocab_file)
    model_dir = str(resolve_path(DataConfig().tokenizer_path).parent)
    hf = transformers.AlbertTokenizer.from_pretrained(model_dir, do_lower_case=False, keep_accents=True)
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
    assert hf.convert_tokens_to_ids(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    for line in SAMPLE_TEXT.split("\n") + ["Ünïcödé ﬁ text ２０２６ inside"]:
        ours = sample_sp.encode(line)
        theirs = hf(line, add_special_tokens=False)["input_ids"]
        assert ours == theirs
    # HF's pair template is ALBERT's: [CLS] A [SEP] B [SEP]
    pair = hf("a b", "c", add_special_tokens=True)["input_ids"]
    assert pair[0] == tok.CLS_ID and pair.count(tok.SEP_ID) == 2 and pair[-1] == tok.SEP_ID


def test_literal_special_strings_never_map_to_special_ids(sample_sp):
    text = "A [MASK] and a [CLS] walk into [SEP] a bar <pad> <unk> [MASK]."
    ids = sample_sp.encode(text)
    assert not set(ids) & {tok.PAD_ID, tok.CLS_ID, tok.SEP_ID, tok.MASK_ID}
    # Through the whole example builder: id 4 appears only where the masker put it (a labelled position).
    builder = ExampleBuilder(sample_sp, DataConfig(max_seq_length=64))
    doc = ("Here is [MASK] in the text. " * 6 + "\n") * 3
    seen_unmasked = 0
    for seed in range(30):
        for ex in builder.build(doc, np.random.default_rng(seed)):
            is_mask = ex.input_ids == tok.MASK_ID
            assert np.all(ex.mlm_labels[is_mask] != -100)
            seen_unmasked += int(np.sum(ex.mlm_labels == -100))
    assert seen_unmasked > 0


def _corpus(tmp_path):
    lines = SAMPLE_TEXT.split("\n") * 5
    words = [f"word{i} alpha beta gamma delta." for i in range(300)]
    (tmp_path / "a.txt").write_text("\n\n".join(lines + words[:150]) + "\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("\n\n".join(words[150:]) + "\n")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_cli_trains_model_with_albert_ids(tmp_path, capsys, model_type):
    _corpus(tmp_path)
    out = tmp_path / "tok"
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "*.txt*"), "--vocab-size", "60", "--model-type", model_type,
                  "--output", str(out), "--lowercase", "--input-sentence-size", "1000"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "peak memory" in printed and "MiB" in printed
    sp = tok.load_tokenizer(str(out / "spiece.model"))
    assert sp.get_piece_size() == 60
    assert [sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    # lower-casing (nmt_nfkc_cf): upper and lower case text encode alike; the .gz shard was read
    assert sp.encode("ALPHA BETA") == sp.encode("alpha beta")
    assert sp.encode("gamma")
    assert not any(sp.is_byte(i) for i in range(sp.get_piece_size()))  # byte fallback is off by default


def test_cli_missing_input_is_a_clear_error(tmp_path, capsys):
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "nothing-*.txt"), "--vocab-size", "100", "--output", str(tmp_path)])
    assert rc == 2
    assert "matches no file" in capsys.readouterr().err


@pytest.mark.parametrize("text, vocab, fragment", [
    ("alpha beta gamma.\n\ndelta epsilon.\n", 5000, "Vocabulary size too high"),  # sentencepiece's own limit
    ("", 100, "hold no text"),
])
def test_cli_untrainable_input_is_a_clear_error(tmp_path, capsys, text, vocab, fragment):
    (tmp_path / "small.txt").write_text(text)
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "small.txt"), "--vocab-size", str(vocab),
                  "--output", str(tmp_path / "tok")])
    err = capsys.readouterr().err
    assert rc == 2 and fragment in err and f"vocab_size={vocab}" in err and "small.txt" in err


def test_load_tokenizer_rejects_wrong_ids(tmp_path):
    import sentencepiece as spm

    (tmp_path / "c.txt").write_text("\n".join(f"w{i} xylophone yak zebra quality" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "c.txt"), model_prefix=str(tmp_path / "plain"),
                                   vocab_size=40, minloglevel=2)
    with pytest.raises(ValueError, match=r"' has id \d+, ALBERT needs"):
        tok.load_tokenizer(str(tmp_path / "plain.model"))
    with pytest.raises(ValueError, match="is not a file"):
        tok.load_tokenizer(str(tmp_path / "missing.model"))


# -- byte fallback (issue 11): real text from tests/fixtures/text (public domain; see its README) -------------------
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "text"


def _lines(name: str) -> list[str]:
    from albert_dist.data.pretraining import split_sentences

    return split_sentences((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def byte_fallback_dir(tmp_path_factory):
    """A byte-fallback model trained on Shakespeare only (every character of it in the vocabulary): Chinese text is
    outside its vocabulary."""
    out = tmp_path_factory.mktemp("bf")
    rc = cli.main(["tokenizer", "train", "--input", str(FIXTURES / "shakespeare.txt"), "--vocab-size", "400", "--byte-fallback",
                  "--character-coverage", "1.0", "--output", str(out)])
    assert rc == 0
    return out


def test_byte_fallback_encodes_unseen_characters_as_bytes_and_round_trips(byte_fallback_dir):
    sp = tok.load_tokenizer(str(byte_fallback_dir / "spiece.model"))
    assert sp.get_piece_size() == 400
    assert [sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    byte_ids = [i for i in range(sp.get_piece_size()) if sp.is_byte(i)]
    assert len(byte_ids) == 256 and sp.id_to_piece(byte_ids[0]) == "<0x00>"
    chinese = _lines("chinese.txt")
    for line in chinese + _lines("shakespeare.txt"):
        ids = sp.encode(line)
        assert tok.UNK_ID not in ids, line
        # NFKC (the model's normalisation) maps full-width punctuation to ASCII; everything else comes back
        assert sp.decode(ids) == unicodedata.normalize("NFKC", line)
    # Chinese characters the Shakespeare vocabulary lacks are their UTF-8 bytes, 3 byte pieces each
    ids = sp.encode("学而")
    assert [sp.id_to_piece(i) for i in ids[-6:]] == [f"<0x{b:02X}>" for b in "学而".encode("utf-8")]
    # without byte fallback the same training gives <unk> there
    plain = tok.load_tokenizer(str(tok.train_tokenizer([str(FIXTURES / "shakespeare.txt")],
                                                       str(byte_fallback_dir / "plain"), 144)))
    assert tok.UNK_ID in plain.encode(chinese[0])


def test_transformers_albert_tokenizer_agrees_on_bundled_model_for_real_text(sample_sp):
    transformers = pytest.importorskip("transformers")
    from albert_dist.data.sources.discover import resolve_path

    hf = transformers.AlbertTokenizer.from_pretrained(str(resolve_path(DataConfig().tokenizer_path).parent),
                                                      do_lower_case=False, keep_accents=True)
    for line in _lines("shakespeare.txt") + _lines("chinese.txt"):
        ids = sample_sp.encode(line)
        assert hf(line, add_special_tokens=False)["input_ids"] == ids, line
        if tok.UNK_ID not in ids:
            assert hf.decode(ids) == sample_sp.decode(ids) == unicodedata.normalize("NFKC", line)


def test_transformers_albert_tokenizer_ignores_byte_fallback(byte_fallback_dir):
    """Why ``--byte-fallback`` is off by default: transformers' ALBERT tokenizer (``AlbertTokenizer``, which
    ``AlbertTokenizerFast`` is an alias of since transformers 5) builds its Unigram model with byte fallback off.
    It agrees with sentencepiece wherever the vocabulary covers the text, but encodes uncovered characters as
    ``<unk>`` and decodes byte pieces as their literal names. When this test fails, transformers has caught up:
    switch the default on (albert_dist.data.tokenizer.BYTE_FALLBACK_DEFAULT)."""
    transformers = pytest.importorskip("transformers")
    assert transformers.AlbertTokenizerFast is transformers.AlbertTokenizer
    sp = tok.load_tokenizer(str(byte_fallback_dir / "spiece.model"))
    hf = transformers.AlbertTokenizer.from_pretrained(str(byte_fallback_dir), do_lower_case=False,
                                                      keep_accents=True)
    for line in _lines("shakespeare.txt"):  # covered text: identical ids and decoding
        ids = sp.encode(line)
        assert hf(line, add_special_tokens=False)["input_ids"] == ids
        assert hf.decode(ids) == sp.decode(ids)
    line = _lines("chinese.txt")[0]
    ids = sp.encode(line)
    theirs = hf(line, add_special_tokens=False)["input_ids"]
    assert theirs != ids and tok.UNK_ID in theirs and tok.UNK_ID not in ids
    assert "<0x" in hf.decode(ids) and sp.decode(ids) == unicodedata.normalize("NFKC", line)


# -- transformers gives sentencepiece's ids (issue 14): tokenizer train and export write tokenizer_config.json ------
MIXED = ["Hello World, Café naïve ÉCOLE", "Zürich und São Paulo: Ångström’s façade", "hello world café"]


@pytest.mark.parametrize("lowercase", [False, True])
def test_transformers_gives_sentencepiece_ids_from_train_and_export(tmp_path, lowercase):
    transformers = pytest.importorskip("transformers")
    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    corpus = [f"{line} number {i}." for i in range(40) for line in MIXED] + SAMPLE_TEXT.split("\n") * 20
    (tmp_path / "c.txt").write_text("\n\n".join(corpus) + "\n")
    out = tmp_path / "tok"
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "c.txt"), "--vocab-size", "80", "--character-coverage", "1.0",
                  "--output", str(out)] + (["--lowercase"] if lowercase else []))
    assert rc == 0
    sp = tok.load_tokenizer(str(out / "spiece.model"))
    assert (sp.encode("Hello") == sp.encode("hello")) == lowercase  # the model itself case-folds, or not
    cfg = dict(vocab_size=96, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=16, max_position_embeddings=32)
    torch.save(AlbertForPreTraining(AlbertConfig(**cfg)).state_dict(), tmp_path / "model.pt")
    (tmp_path / "model.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    assert cli.main(["export", str(tmp_path / "model.pt"), "--config", str(tmp_path / "model.yaml"), "--output",
                     str(tmp_path / "hf"), "--tokenizer", str(out / "spiece.model")]) == 0
    for directory in (out, tmp_path / "hf"):
        for cls in (transformers.AlbertTokenizer, transformers.AlbertTokenizerFast):
            hf = cls.from_pretrained(str(directory))  # no keyword arguments: the directory's config decides
            for text in MIXED:
                assert hf(text, add_special_tokens=False)["input_ids"] == sp.encode(text), (directory, cls, text)
            assert hf(MIXED[0])["input_ids"] == [tok.CLS_ID, *sp.encode(MIXED[0]), tok.SEP_ID]
    assert transformers.AlbertTokenizer.from_pretrained(str(tmp_path / "hf")).model_max_length == 32


def test_cli_prints_the_byte_budget_and_samples_every_file(tmp_path, caplog):
    """--sample-bytes bounds what sentencepiece holds; the budget and the files it came from are logged."""
    import logging

    words = [f"w{i} alpha beta gamma delta epsilon." for i in range(4000)]
    for k in range(3):  # three files of ~50 KB: a 30 KB budget takes ~10 KB of each
        (tmp_path / f"part{k}.txt").write_text("\n\n".join(words[k::3]) + "\n")
    caplog.set_level(logging.INFO, logger="albert_dist.data.tokenizer")
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "*.txt"), "--vocab-size", "60", "--sample-bytes", "30K",
                  "--output", str(tmp_path / "tok")])
    assert rc == 0
    logs = [r.getMessage() for r in caplog.records]
    share = 100 * 30 * 1024 / sum(p.stat().st_size for p in tmp_path.glob("*.txt"))
    assert any(f"sample budget 30.0 KiB of text, {share:.1f}% of" in m and "in 3 files" in m for m in logs), logs
    trained = next(m for m in logs if "trained on" in m)
    assert "from 3 of 3 files" in trained
    assert tok.load_tokenizer(str(tmp_path / "tok" / "spiece.model")).get_piece_size() == 60


def test_cli_repeated_input_trains_on_every_input(tmp_path, caplog):
    """`--input A --input B` (the form `data prepare` takes) samples both; argparse's default kept only B."""
    import logging

    words = [f"w{i} alpha beta gamma delta epsilon." for i in range(600)]
    (tmp_path / "a.txt").write_text("\n\n".join(words[0::2]) + "\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("\n\n".join(words[1::2]) + "\n")
    caplog.set_level(logging.INFO, logger="albert_dist.data.tokenizer")
    rc = cli.main(["tokenizer", "train", "--input", str(tmp_path / "a.txt"), "--input", str(tmp_path / "b.txt.gz"),
                  "--vocab-size", "60", "--output", str(tmp_path / "tok")])
    assert rc == 0
    trained = next(r.getMessage() for r in caplog.records if "trained on" in r.getMessage())
    assert "(600 documents) from 2 of 2 files" in trained, trained
