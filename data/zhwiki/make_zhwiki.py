"""The Chinese recipe's corpus (configs/pretrain/albert-tiny-zhwiki.yaml): zhwiki .jsonl -> train/validation
split, and the measurements behind its tokenizer (run from the repository root).

    python data/zhwiki/make_zhwiki.py --source /path/to/zhwiki.jsonl      # -> data/zhwiki/{train,validation}.jsonl
    python data/zhwiki/make_zhwiki.py --report                            # tokenizer settings on validation.jsonl
    python data/zhwiki/make_zhwiki.py --source /path/to/zhwiki.jsonl --compare-segmenters  # rjieba vs jieba on it

The source is any .jsonl with a "text" field (the recipe's: the zhwiki sample, 5,667 documents of Chinese
Wikipedia, CC BY-SA; its first 150 and 60 DRCD documents are tests/fixtures/text/zhwiki.jsonl, whose README
names the sources). Documents shorter than 20 characters (title-only stubs) are dropped,
``albert-dist data prepare`` having no length filter; every 20th document (5%) goes to validation, the rest to
train, in source order. ``--report`` trains the candidate tokenizers on train.jsonl (vocab 8000, unigram) and
prints, on validation.jsonl, the ``<unk>`` rate (share of characters inside ``<unk>`` pieces), pieces per
character, and how many full-width punctuation marks survive as themselves.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent
MIN_CHARS = 20
VALIDATION_EVERY = 20
#: full-width punctuation that NFKC folds to ASCII (Chinese BERT vocabularies keep these as themselves)
FULL_WIDTH = "，：？！；（）"
#: tokenizer candidates: sentencepiece's defaults (NFKC, coverage 0.9995) and the text as written (whitespace
#: mapped to spaces)
CANDIDATES = {"sentencepiece defaults (nmt_nfkc, coverage 0.9995)": dict(normalization="nmt_nfkc"),
              "whitespace_only, coverage 0.9995 (the recipe's)": dict(normalization="whitespace_only"),
              "nmt_nfkc, coverage 1.0": dict(normalization="nmt_nfkc", character_coverage=1.0)}


def split(source: Path) -> tuple[int, int]:
    """Write train.jsonl and validation.jsonl; returns (train, validation) document counts."""
    kept = []
    with source.open(encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            if len(text) >= MIN_CHARS:
                kept.append(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    validation = kept[::VALIDATION_EVERY]
    train = [d for i, d in enumerate(kept) if i % VALIDATION_EVERY]
    (OUT / "train.jsonl").write_text("".join(train), encoding="utf-8")
    (OUT / "validation.jsonl").write_text("".join(validation), encoding="utf-8")
    return len(train), len(validation)


def report(vocab_size: int = 8000) -> None:
    """Train each candidate on train.jsonl and score it on validation.jsonl (see the module docstring)."""
    from albert_dist.data.text import split_sentences
    from albert_dist.data.tokenizer import UNK_ID, load_tokenizer, train_tokenizer

    with (OUT / "validation.jsonl").open(encoding="utf-8") as f:
        sentences = [s for line in f for s in split_sentences(json.loads(line)["text"])]
    chars = sum(map(len, sentences))
    marks = sum(s.count(c) for s in sentences for c in FULL_WIDTH)
    print(f"validation.jsonl: {len(sentences)} sentences, {chars:,} characters, {marks:,} full-width {FULL_WIDTH}")
    print("| tokenizer | <unk> pieces | characters in <unk> | pieces / character | full-width marks kept |")
    print("|---|---|---|---|---|")
    for name, kw in CANDIDATES.items():
        with tempfile.TemporaryDirectory() as tmp:
            sp = load_tokenizer(str(train_tokenizer([str(OUT / "train.jsonl")], tmp, vocab_size, **kw)))
        pieces = unk = unk_chars = kept_marks = 0
        for enc in sp.encode(sentences, out_type="offset_mapping"):
            pieces += len(enc["ids"])
            for i, (b, e) in zip(enc["ids"], enc["offsets"]):
                if i == UNK_ID:
                    unk += 1
                    unk_chars += e - b
            kept_marks += sum(p.count(c) for p in enc["pieces"] for c in FULL_WIDTH)
        print(f"| {name} | {unk} | {unk_chars / chars:.4%} | {pieces / chars:.3f} | {kept_marks / max(marks, 1):.1%} |")


def compare_segmenters(source: Path) -> None:
    """rjieba vs jieba (the two engines of ``data.chinese_word_segmentation: jieba``) on every sentence of the
    source: sentences whose words holding a CJK character differ, and the CPU time of each engine."""
    import time

    import jieba
    import rjieba

    from albert_dist.data.text import has_cjk, split_sentences

    with source.open(encoding="utf-8") as f:
        sentences = [s for line in f for s in split_sentences(json.loads(line)["text"])]
    jieba.lcut("预热")  # the dictionary loads outside the timing
    timed = {}
    for name, cut in (("rjieba", rjieba.cut), ("jieba", jieba.lcut)):
        t0 = time.process_time()
        timed[name] = ([cut(s) for s in sentences], time.process_time() - t0)
    differ = sum([w for w in a if has_cjk(w)] != [w for w in b if has_cjk(w)]
                 for a, b in zip(timed["rjieba"][0], timed["jieba"][0]))
    print(f"{len(sentences)} sentences, {sum(map(len, sentences)):,} characters: {differ} differ in their words "
          f"holding a CJK character; CPU s: rjieba {timed['rjieba'][1]:.2f}, jieba {timed['jieba'][1]:.2f} "
          f"({timed['jieba'][1] / timed['rjieba'][1]:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, help="zhwiki .jsonl with a text field (not with --report)")
    parser.add_argument("--report", action="store_true", help="measure the tokenizer candidates instead")
    parser.add_argument("--compare-segmenters", action="store_true", help="rjieba vs jieba on --source instead")
    args = parser.parse_args()
    if args.source is None and not args.report:
        parser.error("--source is required: a .jsonl with a text field (the zhwiki sample)")
    if args.compare_segmenters:
        compare_segmenters(args.source)
        return
    if args.report:
        report()
        return
    n_train, n_val = split(args.source)
    print(f"wrote {OUT / 'train.jsonl'} ({n_train} documents) and {OUT / 'validation.jsonl'} ({n_val})")


if __name__ == "__main__":
    main()
