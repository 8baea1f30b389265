"""Chinese whole-word masking (data.chinese_word_segmentation=jieba) on the zhwiki sample, against jieba itself.

The reference side of each check is independent of albert_dist's mapping: jieba (the Python package) segments the
*original* sentence, and sentencepiece's own ``offset_mapping`` places each piece in it; the implementation
segments the text the pieces spell with rjieba and maps words by piece lengths.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jieba
import numpy as np
import pytest
import rjieba
import torch

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader
from albert_dist.data.pretraining import ExampleBuilder
from albert_dist.data.text import has_cjk, load_chinese_segmenter, segmented_word_starts, split_sentences
from albert_dist.data.tokenizer import UNK_ID, load_tokenizer, train_tokenizer

#: 210 documents of the zhwiki sample: 0-149 Simplified (the tokenizer's training text), 150-209 Traditional
#: (DRCD; held out); tests/fixtures/text/README.md
ZHWIKI = Path(__file__).resolve().parents[1] / "fixtures" / "text" / "zhwiki.jsonl"
TRAIN, HELD_OUT = (0, 150), (150, 210)


def _docs(start: int, stop: int) -> list[str]:
    with ZHWIKI.open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return [t for t in texts[start:stop] if len(t) >= 20]


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    """(tokenizer path, sentencepiece processor) trained on the fixture's first 150 documents (NFKC, as shipped)."""
    tmp = tmp_path_factory.mktemp("zh")
    corpus = tmp / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in _docs(*TRAIN)),
                      encoding="utf-8")
    model = train_tokenizer([str(corpus)], str(tmp / "tok"), vocab_size=5000, character_coverage=0.9995)
    return str(model), load_tokenizer(str(model)), corpus


def _jieba_starts(sentence: str) -> set[int]:
    """Character offsets where a jieba word begins in the original sentence (jieba.tokenize: default mode, HMM)."""
    return {start for _, start, _ in jieba.tokenize(sentence)}


def _cjk_at(sentence: str, i: int) -> bool:
    """A word boundary at character i touches a CJK character (the boundaries the segmenter decides)."""
    return any(0 <= j < len(sentence) and has_cjk(sentence[j]) for j in (i - 1, i))


def _violations(sp, cfg: DataConfig, docs: list[str]) -> tuple[int, int, int]:
    """(masked-span edges inside a jieba word, span edges checked, masked spans of >= 2 CJK characters) over the
    examples of ``docs``: each segment's original tokens are located in the document's pieces, which
    sentencepiece's offset_mapping places in the original sentences."""
    builder = ExampleBuilder(sp, cfg)
    rng = np.random.default_rng(0)
    bad = checked = long_spans = 0
    for doc in docs:
        sentences = split_sentences(doc)
        ids, sent_of, begin, end = [], [], [], []
        for k, enc in enumerate(sp.encode(sentences, out_type="offset_mapping")):
            ids += enc["ids"]
            sent_of += [k] * len(enc["ids"])
            begin += [b for b, _ in enc["offsets"]]
            end += [e for _, e in enc["offsets"]]
        doc_ids = np.asarray(ids, dtype=np.int32)
        starts_by_sent = [_jieba_starts(s) for s in sentences]
        for ex in builder.build(doc, rng):
            labels = ex.mlm_labels
            orig = np.where(labels != -100, labels, ex.input_ids)
            first_b = int(np.argmax(ex.token_type_ids == 1))
            for lo, hi in ((1, first_b - 1), (first_b, len(orig) - 1)):  # A, B without [CLS]/[SEP]
                seg, masked = orig[lo:hi], labels[lo:hi] != -100
                at = doc_ids.tobytes().find(seg.tobytes())
                while at % 4:  # an int32-aligned match only
                    at = doc_ids.tobytes().find(seg.tobytes(), at + 1)
                assert at >= 0, "a segment is not a run of its document's pieces"
                pos0 = at // 4
                edges = np.flatnonzero(np.diff(np.concatenate(([0], masked.astype(np.int8), [0]))))
                for run_start, run_stop in zip(edges[::2], edges[1::2]):
                    first, last = pos0 + run_start, pos0 + run_stop - 1
                    if sent_of[first] == sent_of[last]:
                        long_spans += sum(map(has_cjk, sentences[sent_of[first]][begin[first] : end[last]])) >= 2
                    # the span's two edges, where they fall inside the segment (truncation may cut a word)
                    for i, inside in ((first, run_start > 0), (last + 1, run_stop < len(seg))):
                        if not inside or i == 0 or i >= len(doc_ids) or sent_of[i] != sent_of[i - 1]:
                            continue
                        sentence, c = sentences[sent_of[i]], begin[i]
                        if _cjk_at(sentence, c):
                            checked += 1
                            bad += c not in starts_by_sent[sent_of[i]]
    return bad, checked, long_spans


def test_masked_spans_are_whole_jieba_words(zh):
    """With segmentation every masked span starts and ends on a jieba word boundary of the original text; at the
    character level (the default) many spans cut a word, so the check can fail."""
    _, sp, _ = zh
    docs = _docs(*HELD_OUT)  # held out from the tokenizer's training text
    cfg = dict(max_seq_length=128, max_predictions_per_seq=20)
    bad, checked, long_spans = _violations(sp, DataConfig(chinese_word_segmentation="jieba", **cfg), docs)
    assert checked > 1000 and bad == 0
    bad_chars, checked_chars, long_chars = _violations(sp, DataConfig(**cfg), docs)
    assert checked_chars > 1000 and bad_chars > 0.2 * checked_chars
    assert long_spans > long_chars  # whole words of two or more characters are masked together


def test_mixed_chinese_latin_digits_and_full_width(zh):
    """Units over one mixed sentence: jieba's words where they touch Chinese, ALBERT's "▁" rule in Latin runs."""
    _, sp, _ = zh
    sentence = "ALBERT模型在2019年由Google提出，全角：“中国人民银行”的 X-SAMPA 音标"
    pieces = sp.encode(sentence, out_type=str)
    starts = segmented_word_starts(pieces, load_chinese_segmenter("jieba"))
    units = "".join(("|" if s else "") + p for p, s in zip(pieces, starts)).split("|")[1:]
    # jieba on the original: ALBERT 模型 在 2019 年 由 Google 提出 ， 全角 ： “ 中国人民银行 ” 的 ␣ X - SAMPA ␣ 音标
    # (NFKC makes ，： ASCII; the piece ":“" holds two words, which become one unit; Latin runs keep "▁" words,
    # so X-SAMPA is one unit; a bare "▁" before Chinese is a unit of its own, as in ALBERT's vocabulary rule)
    assert units == ["▁ALBERT", "模型", "在", "2019", "年", "由", "Google", "提出", ",", "全角", ":“",
                     "中国人民银行", "”", "的", "▁X-SAMPA", "▁", "音标"]


def test_rjieba_and_jieba_give_the_same_words(zh, monkeypatch):
    """Both engines on zhwiki sentences: identical words wherever a word holds a CJK character, and identical
    piece word starts (Latin runs joined by - or . differ, and are not the segmenter's to decide)."""
    _, sp, _ = zh
    sentences = [s for d in _docs(0, HELD_OUT[1]) for s in split_sentences(d)]  # both scripts
    fast = load_chinese_segmenter("jieba")
    monkeypatch.setitem(sys.modules, "rjieba", None)  # import rjieba now raises ImportError: the fallback
    slow = load_chinese_segmenter("jieba")
    assert fast is rjieba.cut and slow is jieba.lcut
    cjk_words = [[w for w in seg(s) if has_cjk(w)] for seg in (fast, slow) for s in sentences]
    half = len(cjk_words) // 2
    assert sum(map(len, cjk_words[:half])) > 20000 and cjk_words[:half] == cjk_words[half:]
    for doc in _docs(100, 150):
        pieces = [p for s in sp.encode(split_sentences(doc), out_type=str) for p in s]
        assert (segmented_word_starts(pieces, fast) == segmented_word_starts(pieces, slow)).all()


def test_exact_resume_with_segmentation_in_workers(zh):
    """Segmentation runs in the loader workers; resuming mid-stream gives the batches an unbroken run gives."""
    model, _, corpus = zh
    cfg = DataConfig(train=[SourceConfig(paths=[str(corpus)])], tokenizer_path=model, max_seq_length=64,
                     num_workers=1, shard_piece_bytes=65536, chinese_word_segmentation="jieba")
    take = lambda it, n: [next(it) for _ in range(n)]  # noqa: E731
    first = build_train_loader(cfg, 4, rank=0, world_size=1)
    it = iter(first)
    take(it, 2)
    state = first.state_dict()
    reference = take(it, 2)
    second = build_train_loader(cfg, 4, rank=0, world_size=1)
    second.load_state_dict(state)
    for a, b in zip(take(iter(second), 2), reference):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert (reference[0]["mlm_labels"] != -100).any()


def test_an_unknown_segmenter_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"data.chinese_word_segmentation must be one of \('none', 'jieba'\), got 'ltp'"):
        DataConfig(chinese_word_segmentation="ltp")


def test_segmentation_changes_word_starts_not_ids(zh):
    """The segmented path reads ids from piece strings (one encode): the same ids and sentence offsets as the
    plain path on every document, unknown characters included; only the word starts differ."""
    _, sp, _ = zh
    words, chars = (ExampleBuilder(sp, DataConfig(chinese_word_segmentation=s)) for s in ("jieba", "none"))
    differ = 0
    for doc in _docs(*HELD_OUT) + ["英文 mixed 㚟𠀀 text", "no Chinese at all."]:
        (t1, o1, s1), (t2, o2, s2) = words.encode_document(doc), chars.encode_document(doc)
        assert np.array_equal(t1, t2) and np.array_equal(o1, o2)
        differ += int((s1 != s2).sum())
    assert differ > 1000 and UNK_ID in sp.encode("㚟𠀀")  # unknown characters were in the text
