"""Text rules shared by the tokenizer trainer and the example builder: sentence splitting and word starts.

Torch-free and tokenizer-agnostic (a sentencepiece processor is passed in), so `data/tokenizer.py` and
`data/pretraining.py` both use it without importing each other.
"""
from __future__ import annotations

import re

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
_CJK = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]")


def word_start_table(sp) -> np.ndarray:
    """(V,) bool: piece id starts a whole word: a leading "▁" (ALBERT's rule; everything else, <unk> included,
    continues the word before it), or a piece holding a CJK/kana character (text without spaces)."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return np.fromiter((p.startswith("\u2581") or _CJK.search(p) is not None for p in pieces), dtype=bool,
                       count=len(pieces))
