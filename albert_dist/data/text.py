"""Text rules shared by the tokenizer trainer and the example builder: sentence splitting and word starts.

Torch-free and tokenizer-agnostic (a sentencepiece processor is passed in), so `data/tokenizer.py` and
`data/pretraining.py` both use it without importing each other.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

# Plain str.replace (C speed, no per-match Python callback as re.sub templates have) then one split.
_SENTENCE_BREAKS = ((". ", ".\n"), ("! ", "!\n"), ("? ", "?\n"), ("。", "。\n"), ("！", "！\n"), ("？", "？\n"))


def split_sentences(text: str) -> list[str]:
    """Non-empty, stripped sentences of a document: its lines, cut after ``.!?`` followed by a space and after
    ``。！？``."""
    for old, new in _SENTENCE_BREAKS:
        text = text.replace(old, new)
    return [s for s in (part.strip() for part in text.split("\n")) if s]


# CJK ideographs (unified, extensions, compatibility), kana, CJK symbols: scripts written without spaces.
# (first, last) code points, inclusive; the regex (per piece) and the numpy test (per character) share them.
_CJK_RANGES = ((0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F),
               (0x20000, 0x3134F))
_CJK = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES) + "]")


def has_cjk(text: str) -> bool:
    """The text holds a CJK ideograph, kana or CJK symbol (one regex search)."""
    return _CJK.search(text) is not None


def word_start_table(sp) -> np.ndarray:
    """(V,) bool: piece id starts a whole word: a leading "▁" (ALBERT's rule; everything else, <unk> included,
    continues the word before it), or a piece holding a CJK/kana character (text without spaces)."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return np.fromiter((p.startswith("\u2581") or _CJK.search(p) is not None for p in pieces), dtype=bool,
                       count=len(pieces))


def load_chinese_segmenter(name: str) -> "Callable[[str], list[str]] | None":
    """The segmenter ``data.chinese_word_segmentation`` names: text -> its words in order, concatenating to the
    text (spaces are words of their own); None for "none".

    "jieba" is ``rjieba.cut`` (jieba-rs: the same dictionary and HMM, 17x faster on the zhwiki sample) or, where rjieba has no
    wheel, ``jieba.lcut``; both with the HMM on for words outside the dictionary, as albert_zh's ``jieba.lcut``.
    The two agree on every word holding a CJK character in all but 2 of the 59,688 sentences of the zhwiki
    sample; they differ on Latin runs joined by ``-``/``.`` ("X-SAMPA": one word in rjieba, three in jieba), which
    masking does not look at (see :func:`segmented_word_starts`). Raises ValueError for another name.
    """
    if name not in ("none", "jieba"):  # the values of data.config.ChineseSegmentation (validated there first)
        raise ValueError(f"data.chinese_word_segmentation must be 'none' or 'jieba', got {name!r}")
    if name == "none":
        return None
    try:
        import rjieba
    except ImportError:  # no rjieba wheel for this platform: the pure-Python original, same words
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)  # its dictionary load logs to stderr in every loader worker
        return jieba.lcut
    return rjieba.cut


def _is_cjk(code_points: np.ndarray) -> np.ndarray:
    """(C,) bool: the code point is in one of the ``_CJK_RANGES``."""
    out = np.zeros(len(code_points), dtype=bool)
    for first, last in _CJK_RANGES:
        out |= (code_points >= first) & (code_points <= last)
    return out


def segmented_word_starts(pieces: list[str], cut: "Callable[[str], list[str]]",
                          doc_pieces: "Sequence[int] | None" = None) -> np.ndarray:
    """(T,) bool: which of a document's sentencepiece pieces start a whole word, with Chinese words from ``cut``.

    ``pieces``: the document's pieces as strings (sentencepiece's ``out_type=str``: its normalised text, "▁" for
    a space and before each sentence, unknown characters as themselves). The text they spell is segmented once
    (so piece offsets are exact by construction, with no alignment to the raw text); a piece starts a word when
    it begins with "▁" (ALBERT's rule) or when a segmenter word begins at its first character and that
    character or the one before it is CJK. Latin and digit runs keep ALBERT's rule, so only boundaries that
    touch Chinese come from the segmenter; a word boundary inside a piece joins the two words (a piece cannot
    be split), so a masked unit is always a run of whole words. Source: albert_zh's create_pretraining_data
    (``jieba.lcut``, continuation characters marked "##" for whole-word masking).

    ``doc_pieces`` (D,): several documents' pieces back to back, this many each (default: one document); each
    document is cut on its own and looks at no character of another, so the result is the documents' own
    results concatenated (one pass of the array work for a loader's window of documents).
    """
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    ends = lengths.cumsum()  # (T,) char offset after each piece
    text = "".join(pieces)
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (C,)
    piece_bounds = np.cumsum([0, *([len(pieces)] if doc_pieces is None else doc_pieces)])  # (D+1,)
    char_bounds = np.concatenate(([0], ends))[piece_bounds].tolist()  # (D+1,) each document's first character
    spaced = text.replace("\u2581", " ")
    words = [w for a, b in zip(char_bounds[:-1], char_bounds[1:]) for w in cut(spaced[a:b])]
    word_lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    word_start = np.zeros(len(code_points) + 1, dtype=bool)
    word_start[word_lengths.cumsum() - word_lengths] = True
    cjk = _is_cjk(code_points)
    touches_cjk = cjk.copy()
    touches_cjk[1:] |= cjk[:-1]
    firsts = np.array(char_bounds[:-1], dtype=np.int64)
    firsts = firsts[firsts < len(code_points)]
    touches_cjk[firsts] = cjk[firsts]  # a document's first character has no character before it
    # (T,) char offset of each piece, kept inside its document
    last = np.maximum(np.array(char_bounds[1:]) - 1, np.array(char_bounds[:-1]))
    begin = np.minimum(ends - lengths, np.repeat(last, np.diff(piece_bounds)))
    return (code_points[begin] == 0x2581) | (word_start[begin] & touches_cjk[begin])
