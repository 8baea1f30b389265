"""Rebuild the bundled sample corpus from WikiText-2 (run from the repository root; the source is not bundled).

    python data/sample/make_sample.py --source /path/to/wikitext-2 && albert-dist tokenizer train \
        --input 'data/sample/wikitext-2-train-*.txt' --vocab-size 8000 --output data/sample
    python data/sample/make_sample.py --source /path/to/wikitext-2 --check   # the bundled shards are what it builds
    python data/sample/make_sample.py --report      # <unk> share of the bundled shards' tokens

The source: WikiText-2's tokenized release, ``test.txt`` and ``valid.txt`` (``train.txt`` for ``--full-train``;
md5 of test.txt 781c9418ab9414bd09e4aad825aae752, valid.txt d756d22ab2310e7e60c094bea5c5a8eb).

One article is one document: its paragraphs on consecutive lines, section headings dropped, documents separated
by a blank line. The tokenized release's artifacts are undone (see :func:`clean_line`): number splitting
(" @-@ " -> "-", " @,@ " -> ",", " @.@ " -> ".") and its ``<unk>`` placeholders for rare words, which are dropped
(with the brackets and quotes they leave empty). Dropping whole sentences instead would keep only ~25% of the
words: 69% of the sentences of test.txt hold a placeholder. Train shards: the articles of test.txt dealt
round-robin into 8 files; validation: every article of valid.txt (the fixed validation set needs its size).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent
_TITLE = re.compile(r"^ = [^=].* = $")
_HEADING = re.compile(r"^ (= )+.*( =)+ $")
PLACEHOLDER = "<unk>"
_NUMBER_SPLITS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
# What a dropped placeholder leaves behind: brackets or quotes around nothing but spaces and list punctuation
# ("( <unk> )", '" <unk> "', "( <unk> ; <unk> )"), and runs of separators (", <unk> ," -> ", ,").
_EMPTY_PAIR = re.compile(r' (\(|\[|")[ ,;:]*(\)|\]|") ')
_REPEATED_SEPARATOR = re.compile(r" ([,;:])(?: [,;:])+ ")
_SPACES = re.compile(r" {2,}")
_WORD_CHAR = re.compile(r"\w")


def clean_line(line: str) -> str:
    """One paragraph of the tokenized release as natural(er) text: number splitting undone, ``<unk>``
    placeholders dropped with the empty brackets/quotes and doubled separators they leave, spaces collapsed.
    Returns "" for a paragraph left without a letter or digit. Spacing around punctuation (" , ", " 's") is
    the release's and stays: the sentence splitter and the tokenizer handle it."""
    text = f" {line.strip()} "
    for old, new in _NUMBER_SPLITS:
        text = text.replace(old, new)
    text = text.replace(f" {PLACEHOLDER} ", " ").replace(f" {PLACEHOLDER} ", " ")  # twice: adjacent ones overlap
    text = text.replace(PLACEHOLDER, "")  # one glued to other text (none in WikiText-2, kept for safety)
    for _ in range(2):  # "( ( <unk> ) )" needs two passes
        text = _SPACES.sub(" ", text)
        text = _EMPTY_PAIR.sub(" ", text)
        text = _REPEATED_SEPARATOR.sub(r" \1 ", text)
    text = _SPACES.sub(" ", text).strip()
    return text if _WORD_CHAR.search(text) else ""


def articles(path: Path) -> list[str]:
    """The articles of one WikiText file, each its cleaned paragraphs joined by newlines (headings dropped)."""
    docs, cur = [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if _TITLE.match(line):
            if cur:
                docs.append("\n".join(cur))
            cur = []
            continue
        if not line.strip() or _HEADING.match(line):
            continue
        text = clean_line(line)
        if text:
            cur.append(text)
    if cur:
        docs.append("\n".join(cur))
    return docs


def build_full_train(source: Path, out: Path, shards: int = 8) -> None:
    """Write WikiText-2's whole train split (600 articles, ~2M words), cleaned as the sample, into ``out`` as
    ``shards`` gzip files ``train-NN.txt.gz`` (articles dealt round-robin): the README's main job's corpus, 20x the
    sample's train shards; its validation set stays the sample's (valid.txt, disjoint from train.txt)."""
    import gzip

    out.mkdir(parents=True, exist_ok=True)
    train = articles(source / "train.txt")
    for i in range(shards):
        # mtime=0: the same bytes on every rebuild (gzip stores a timestamp in its header)
        with open(out / f"train-{i:02d}.txt.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(("\n\n".join(train[i::shards]) + "\n").encode("utf-8"))
    print(f"{len(train)} train articles in {shards} gzip shards -> {out}")


def build(source: Path, out: Path) -> None:
    """Write the 8 train shards and the validation shard into ``out``."""
    train = articles(source / "test.txt")
    for i in range(8):
        (out / f"wikitext-2-train-{i:02d}.txt").write_text("\n\n".join(train[i::8]) + "\n", encoding="utf-8")
    valid = articles(source / "valid.txt")
    text = "\n\n".join(valid) + "\n"
    (out / "wikitext-2-validation.txt").write_text(text, encoding="utf-8")
    print(f"{len(train)} train articles in 8 shards, {len(valid)} validation articles "
          f"({len(text.encode('utf-8'))} bytes)")


def check(source: Path, out: Path) -> list[str]:
    """Rebuild from `source` into a temporary folder; returns the names of the shards in `out` that differ from
    the rebuild (or are missing from either side); prints one line per difference."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        build(source, Path(tmp))
        built = {p.name: p.read_bytes() for p in Path(tmp).glob("wikitext-2-*.txt")}
    have = {p.name: p.read_bytes() for p in out.glob("wikitext-2-*.txt")}
    differ = sorted(n for n in built.keys() | have.keys() if built.get(n) != have.get(n))
    for name in differ:
        print(f"{out / name}: differs from what {source} builds")
    return differ


def report(folder: Path, tokenizer: str) -> dict[str, dict[str, int]]:
    """Per split of the shards in ``folder``: literal placeholders, tokens (encoded as the pretraining pipeline
    encodes: sentences of each document) and ``<unk>`` ids among them. Prints one line per split."""
    from albert_dist.data.pretraining import split_sentences
    from albert_dist.data.tokenizer import UNK_ID, load_tokenizer

    sp = load_tokenizer(tokenizer)
    splits = {"train": sorted(folder.glob("wikitext-2-train-*.txt")),
              "validation": sorted(folder.glob("wikitext-2-validation.txt"))}
    result = {}
    for split, files in splits.items():
        placeholders = tokens = unk = 0
        for f in files:
            text = f.read_text(encoding="utf-8")
            placeholders += text.count(PLACEHOLDER)
            for ids in sp.encode(split_sentences(text)):
                tokens += len(ids)
                unk += ids.count(UNK_ID)
        result[split] = {"placeholders": placeholders, "tokens": tokens, "unk_tokens": unk}
        print(f"{split}: {len(files)} files, {placeholders} '{PLACEHOLDER}' placeholders, {tokens} tokens, "
              f"{unk} <unk> ids ({100.0 * unk / max(tokens, 1):.3f}%)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, help="folder with WikiText-2 test.txt, valid.txt (train.txt)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the shards go (default: this folder)")
    parser.add_argument("--full-train", type=Path, metavar="DIR",
                        help="instead: write WikiText-2's whole train split into DIR (data/wikitext-2)")
    parser.add_argument("--report", action="store_true", help="only report the <unk> share of the shards in --out")
    parser.add_argument("--check", action="store_true", help="rebuild into a temporary folder and compare with --out")
    parser.add_argument("--tokenizer", default=str(OUT / "spiece.model"), help="model for --report")
    args = parser.parse_args()
    if args.source is None and not args.report:
        parser.error("--source is required (WikiText-2's tokenized release: test.txt, valid.txt, train.txt)")
    if args.check:
        sys.exit(1 if check(args.source, args.out) else 0)
    if args.full_train:
        build_full_train(args.source, args.full_train)
    elif args.report:
        report(args.out, args.tokenizer)
    else:
        build(args.source, args.out)


if __name__ == "__main__":
    main()
