"""The bundled sample corpus: ``data/sample/make_sample.py`` leaves no WikiText ``<unk>`` placeholder, its
``--check`` finds a shard that is not what it builds, and the bundled tokenizer turns almost no token of the shards
into ``<unk>``. (Whether the committed shards are what WikiText-2 builds needs the source, which is not bundled:
``python data/sample/make_sample.py --source DIR --check``.)"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"


@pytest.fixture(scope="module")
def make_sample():
    spec = importlib.util.spec_from_file_location("make_sample", SAMPLE / "make_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("line, expected", [
    (" The <unk> of 1 @,@ 000 men . ", "The of 1,000 men ."),
    (" a 0 @.@ 7 kg ( <unk> ) , long @-@ lived . ", "a 0.7 kg , long-lived ."),
    (' the " <unk> " , and rounded <unk> used ', "the , and rounded used"),
    (" <unk> <unk> 's Od , <unk> , <unk> , and ( <unk> ; <unk> ) x ", "'s Od , and x"),
    (" ( ( <unk> ) ) done ", "done"),
    (" <unk> . ", ""),  # nothing but punctuation left: the paragraph goes
    (" ( 24 in ) and \" red \" stay ", '( 24 in ) and " red " stay'),  # brackets around words are kept
])
def test_clean_line(make_sample, line, expected):
    assert make_sample.clean_line(line) == expected


def test_builder_leaves_no_placeholder(make_sample, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    article = (" = Title {i} = \n \n The <unk> was 1 @,@ 000 km long . <unk> \n \n = = Section = = \n \n"
               " It ( <unk> ) had a <unk> @-@ like shape . \n \n <unk> \n")
    (src / "test.txt").write_text("".join(article.format(i=i) for i in range(10)), encoding="utf-8")
    (src / "valid.txt").write_text(article.format(i=99), encoding="utf-8")
    make_sample.build(src, out)
    files = sorted(out.glob("*.txt"))
    assert [f.name for f in files] == [f"wikitext-2-train-{i:02d}.txt" for i in range(8)] + ["wikitext-2-validation.txt"]
    expected_doc = "The was 1,000 km long .\nIt had a -like shape ."
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert "<unk>" not in text and "@" not in text and "=" not in text
        docs = text.strip("\n").split("\n\n")
        assert all(d == expected_doc for d in docs)
    # 10 articles dealt round-robin: shards 0 and 1 get two, the others one
    assert [len(f.read_text().strip("\n").split("\n\n")) for f in files[:8]] == [2, 2, 1, 1, 1, 1, 1, 1]


def test_bundled_shards_hold_no_placeholder():
    files = sorted(SAMPLE.glob("wikitext-2-*.txt"))
    assert len(files) == 9
    for f in files:
        assert "<unk>" not in f.read_text(encoding="utf-8"), f.name


def test_check_names_the_shards_that_differ_from_a_rebuild(make_sample, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "test.txt").write_text("".join(f" = T{i} = \n \n Words of article {i} . \n" for i in range(9)))
    (src / "valid.txt").write_text(" = V = \n \n Validation words . \n")
    make_sample.build(src, out)
    assert make_sample.check(src, out) == []
    (out / "wikitext-2-train-03.txt").write_text("edited by hand\n")
    (out / "wikitext-2-validation.txt").unlink()
    assert make_sample.check(src, out) == ["wikitext-2-train-03.txt", "wikitext-2-validation.txt"]


def test_bundled_tokenizer_unk_share(make_sample):
    import sentencepiece as spm

    figures = make_sample.report(SAMPLE, str(SAMPLE / "spiece.model"))
    train, valid = figures["train"], figures["validation"]
    assert train["placeholders"] == valid["placeholders"] == 0
    # trained with character_coverage 1.0 on the train shards: every character of them is in the vocabulary
    assert train["unk_tokens"] == 0 and train["tokens"] > 250_000
    assert valid["unk_tokens"] / valid["tokens"] < 0.001 and valid["tokens"] > 250_000  # the target of issue 11
    # independently: piece by piece, <unk> is exactly the characters that no piece of the vocabulary holds
    sp = spm.SentencePieceProcessor(model_file=str(SAMPLE / "spiece.model"))
    vocab_chars = {c for i in range(sp.get_piece_size()) if sp.is_unknown(i) is False for c in sp.id_to_piece(i)}
    text = (SAMPLE / "wikitext-2-validation.txt").read_text(encoding="utf-8")
    unknown_chars = {c for c in set(text) - vocab_chars if not c.isspace()}
    assert unknown_chars  # the validation shard has a few characters the train shards lack (e.g. "ā", "♭")
    unk_surfaces = {p.surface for line in text.splitlines() if line
                    for p in sp.encode(line, out_type="proto").pieces if p.id == 1}
    assert set("".join(unk_surfaces)) <= unknown_chars
