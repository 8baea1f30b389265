"""ALBERT pretraining examples: document -> sentences -> segment pairs (SOP) -> n-gram masking -> batch tensors.

Follows google-research/albert ``create_pretraining_data.py`` (itself BERT's), with these documented choices:

* Sentences: lines, further split after ``. ! ?`` followed by a space and after ``。！？``.
* Segments are filled greedily with whole sentences up to ``max_seq_length - 3`` tokens; with probability
  ``short_seq_prob`` a document targets a random length in [2, max_seq_length - 3] instead (ALBERT draws it
  once per document).
* SOP (ALBERT paper, section 3.2): A/B split at a random sentence boundary of the chunk; with probability 0.5
  A and B are swapped and ``sop_label`` = 1 (transformers' convention: 0 = original order). B always comes from
  the same document. A chunk of one sentence is split at a random whole-word boundary inside that sentence
  (ALBERT's code would take B from a random *other* document there); a one-token chunk gives no example.
* The pair is truncated to ``max_seq_length - 3`` by trimming the longer segment, each trimmed token from the
  front or the back with probability 1/2 (BERT's ``truncate_seq_pair``, in closed form).
* Masking (ALBERT paper, section 4.1, ``max_ngram`` = 3): whole words are the units (a word starts at a piece
  beginning with "▁"; a piece holding a CJK/kana character is a word of its own, so text without spaces falls
  back to pieces unless ``chinese_word_segmentation`` names a segmenter: then a Chinese word starts at a piece
  where a segmenter word begins, so a masked word masks all its pieces and n-grams count words, see
  :func:`albert_dist.data.text.segmented_word_starts`; ``whole_word_masking=False`` makes every piece a unit).
  The word sequence is tiled into
  n-grams with n drawn from p(n) ∝ 1/n; tiles are visited in a random order and taken when they fit ``num_to_predict = min(max_predictions_per_seq, max(1, round(n_tokens x
  masked_lm_prob)))`` tokens. Of the chosen tokens 80% become [MASK], 10% a random ordinary token, 10% stay.
  [CLS], [SEP] and padding are never candidates. Tiling makes the chosen n-grams non-overlapping without a
  per-token loop; it differs from ALBERT's "random start, reject overlaps" loop only in where n-grams may start.

Everything per token is numpy; Python loops run per sentence and per example only.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Optional

import numpy as np
import torch

from albert_dist.data.config import DataConfig, masking_budget
from albert_dist.data.text import has_cjk, load_chinese_segmenter, segmented_word_starts, split_sentences, word_start_table
from albert_dist.data.tokenizer import CLS_ID, FIRST_NORMAL_ID, MASK_ID, PAD_ID, SEP_ID
from albert_dist.model.config import IGNORE_INDEX


@dataclass
class Example:
    """One unpadded example ``[CLS] A [SEP] B [SEP]`` of length L = len_a + len(B) + 3.

    ``input_ids`` (L,) int32 after masking; ``masked_positions`` (k,) int64 positions chosen for prediction and
    ``masked_ids`` (k,) int32 their original tokens; ``sop_label`` 1 when A and B were swapped.
    """

    input_ids: np.ndarray
    len_a: int
    masked_positions: np.ndarray
    masked_ids: np.ndarray
    sop_label: int

    @property
    def token_type_ids(self) -> np.ndarray:
        """(L,) int32: 0 for [CLS] A [SEP], 1 for B [SEP]."""
        return (np.arange(len(self.input_ids)) >= self.len_a + 2).astype(np.int32)

    @property
    def mlm_labels(self) -> np.ndarray:
        """(L,) int32: the original token at masked positions, -100 elsewhere."""
        labels = np.full(len(self.input_ids), IGNORE_INDEX, dtype=np.int32)
        labels[self.masked_positions] = self.masked_ids
        return labels


class ExampleBuilder:
    """Turns one document into ALBERT examples; deterministic given the ``numpy.random.Generator`` passed in."""

    def __init__(self, sp, cfg: DataConfig) -> None:
        self.sp = sp
        self.cfg = cfg
        self.vocab_size = sp.get_piece_size()
        self.word_start = word_start_table(sp)
        self.segment = load_chinese_segmenter(cfg.chinese_word_segmentation)  # None: CJK pieces are words
        self.max_num_tokens = cfg.max_seq_length - 3
        ngrams = np.arange(1, cfg.max_ngram + 1)
        self.ngram_p = (1.0 / ngrams) / (1.0 / ngrams).sum()
        self.ngram_cdf = np.cumsum(self.ngram_p)[:-1]  # n = 1 + #(cdf <= u): exactly n <= max_ngram
        self.mask_below = 1.0 - 2.0 * cfg.random_token_prob  # r < this: [MASK]
        self.keep_below = 1.0 - cfg.random_token_prob  # this > r >= mask_below: keep; else random token
        self._cls = np.array([CLS_ID], dtype=np.int32)
        self._sep = np.array([SEP_ID], dtype=np.int32)

    # -- documents -> token arrays ----------------------------------------------------------------------------
    def encode_document(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens (T,) int32, sentence offsets (n+1,) int64, word starts (T,) bool) of the document's non-empty
        sentences. Word starts come from the vocabulary table, or from the Chinese segmenter when one is set and
        the document holds a CJK character (the segmenter runs here, in the loader worker that builds examples)."""
        tokens, offsets, starts, _ = self.encode_documents([text])
        return tokens, offsets[0], starts

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
        """`encode_document` of several documents at once (one sentencepiece call per kind, one segmenter
        pass): (tokens (T,) int32 and word starts (T,) bool, the documents back to back; per document its
        sentence offsets (n_d+1,) int64, relative to its first token; (D+1,) int64 each document's first token)."""
        sentences = [split_sentences(t) for t in texts]
        segment = [self.segment is not None and has_cjk(t) for t in texts]
        docs: list = [None] * len(texts)  # per document: (tokens, sentence lengths, starts)
        for as_str in (False, True):
            which = [d for d in range(len(texts)) if segment[d] == as_str]
            if not which:
                continue
            # the segmenter needs the pieces' text; their ids then come from the same strings (one encode, not two)
            pieces = self.sp.encode([s for d in which for s in sentences[d]], out_type=str if as_str else int,
                                    num_threads=1)
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            flat = list(chain.from_iterable(pieces))
            if as_str:
                tokens = np.asarray(self.sp.piece_to_id(flat), dtype=np.int32)
                sent_bounds = np.cumsum([0, *(len(sentences[d]) for d in which)])
                doc_pieces = np.diff(np.concatenate(([0], lengths.cumsum()))[sent_bounds])  # (D,) pieces each
                starts = segmented_word_starts(flat, self.segment, doc_pieces.tolist())
            else:
                tokens = np.fromiter(flat, dtype=np.int32, count=len(flat))
                starts = self.word_start[tokens]
            tok_at, sent_at = 0, 0
            for d in which:
                n = len(sentences[d])
                lens = lengths[sent_at : sent_at + n]
                total = int(lens.sum())
                docs[d] = (tokens[tok_at : tok_at + total], lens, starts[tok_at : tok_at + total])
                tok_at, sent_at = tok_at + total, sent_at + n
        doc_tokens = np.fromiter((len(doc[0]) for doc in docs), dtype=np.int64, count=len(docs))
        offsets = [np.concatenate(([0], np.cumsum(lens[lens > 0]))) for _, lens, _ in docs]
        tokens = np.concatenate([doc[0] for doc in docs]) if docs else np.zeros(0, np.int32)
        starts = np.concatenate([doc[2] for doc in docs]) if docs else np.zeros(0, bool)
        return tokens, offsets, starts, np.concatenate(([0], np.cumsum(doc_tokens)))

    def build(self, text: str, rng: np.random.Generator) -> list[Example]:
        """All examples of one document, in order (ALBERT's ``create_instances_from_document`` for SOP)."""
        return self.build_documents([text], [rng])[0]

    def build_documents(self, texts: list[str], rngs: list[np.random.Generator]) -> list[list[Example]]:
        """`build` of each document with its own generator, the array work done once for them all (a loader's
        window): each document's draws are the ones `build` makes, in the same order, so the examples are
        identical to building the documents one by one."""
        tokens, offsets, starts, doc_first = self.encode_documents(texts)
        positions = np.arange(len(tokens))  # pairs are cut as positions, then gathered with their word starts
        pairs: list[tuple[np.ndarray, np.ndarray, int]] = []
        pair_doc: list[int] = []
        for d, rng in enumerate(rngs):
            doc_pos = positions[doc_first[d] : doc_first[d + 1]]
            n_sent = len(offsets[d]) - 1
            target = self.max_num_tokens
            if rng.random() < self.cfg.short_seq_prob:
                target = int(rng.integers(2, self.max_num_tokens + 1))
            first = 0
            for i in range(n_sent):
                if i == n_sent - 1 or offsets[d][i + 1] - offsets[d][first] >= target:
                    pair = self._pair(doc_pos, starts, offsets[d], first, i + 1, rng)
                    if pair is not None:
                        pairs.append(pair)
                        pair_doc.append(d)
                    first = i + 1
        examples = self._mask(pairs, np.array(pair_doc, dtype=np.int64), tokens, starts, rngs) if pairs else []
        per_doc = np.bincount(np.array(pair_doc, dtype=np.int64), minlength=len(texts)).tolist()
        out, at = [], 0
        for n in per_doc:
            out.append(examples[at : at + n])
            at += n
        return out

    def _pair(self, tokens, starts, offsets, first: int, stop: int, rng) -> "tuple[np.ndarray, np.ndarray, int] | None":
        """(A, B, sop_label) from sentences [first, stop) of the document, truncated; None if too short.
        ``tokens`` (T,): what A and B are cut from (the builder passes positions); ``starts`` (T,) bool word starts."""
        if stop - first >= 2:
            cut = offsets[int(rng.integers(first + 1, stop))]
        else:
            sent = tokens[offsets[first] : offsets[stop]]
            if len(sent) < 2:
                return None
            inner = np.flatnonzero(starts[sent[1:]]) + 1  # word starts after the first piece
            cut_in = int(rng.choice(inner)) if len(inner) else int(rng.integers(1, len(sent)))
            cut = offsets[first] + cut_in
        a = tokens[offsets[first] : cut]
        b = tokens[cut : offsets[stop]]
        sop_label = int(rng.random() < 0.5)
        if sop_label:
            a, b = b, a
        a, b = self._truncate_pair(a, b, rng)
        return a, b, sop_label

    def _truncate_pair(self, a: np.ndarray, b: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
        """BERT's truncate_seq_pair in closed form: always trim the longer (ties: B), front/back with p=1/2."""
        excess = len(a) + len(b) - self.max_num_tokens
        if excess <= 0:
            return a, b
        la, lb = len(a), len(b)
        if la > lb:
            cut_a = min(excess, la - lb)
            rest = excess - cut_a
            cut_a, cut_b = cut_a + rest // 2, (rest + 1) // 2
        else:
            cut_b = min(excess, lb - la)
            rest = excess - cut_b
            cut_b, cut_a = cut_b + (rest + 1) // 2, rest // 2
        front_a, front_b = rng.binomial(cut_a, 0.5), rng.binomial(cut_b, 0.5)
        return a[front_a : la - (cut_a - front_a)], b[front_b : lb - (cut_b - front_b)]

    def choose_ngrams(
        self, word_starts: np.ndarray, num_tokens: int, budget: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`choose_ngrams_batch` for one example: ``(tile_words, tile_tokens, chosen)``, each (T,)."""
        words, tokens, _, chosen = self.choose_ngrams_batch(
            word_starts, np.zeros(len(word_starts), dtype=np.int64), num_tokens, np.array([budget]), rng)
        return words, tokens, chosen

    def choose_ngrams_batch(
        self, word_starts: np.ndarray, word_example: np.ndarray, num_tokens: int, budgets: np.ndarray,
        rng: "np.random.Generator | list[np.random.Generator]", example_doc: "np.ndarray | None" = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tile the words of several examples into n-grams and pick the masked ones, all examples at once.

        ``word_starts`` (W,) int: sorted flat token index where each word starts (each example's first token
        starts a word); ``word_example`` (W,) int: non-decreasing example of each word; ``num_tokens``: flat
        token count; ``budgets`` (E,) int: tokens to mask per example. Each example's words are tiled into
        n-grams with n ~ p(n) ∝ 1/n, n <= max_ngram (its last tile may be cut short); tiles are visited in a
        random order and taken while they fit the example's budget (ALBERT's loop takes every n-gram that still
        fits; each pass below takes the longest fitting prefix of what is left, and three passes fill the
        budget as that loop does in practice). Returns ``(tile_words, tile_tokens, tile_example, chosen)``,
        each (T,); the tiles cover the flat tokens in order, so ``np.repeat(chosen, tile_tokens)`` is the
        (num_tokens,) token mask.

        ``rng``: one generator, or one per document with ``example_doc`` (E,) non-decreasing, the document of
        each example; each document then draws from its own generator what it would alone: 2 x its words
        uniforms (n-gram lengths, then its tiles' visiting keys).
        """
        rngs = rng if isinstance(rng, list) else [rng]
        n_words, n_examples = len(word_starts), len(budgets)
        word_bounds = np.concatenate((word_starts, [num_tokens]))
        first_word = word_example.searchsorted(np.arange(n_examples))  # (E,)
        words_in_example = np.diff(np.append(first_word, n_words))
        word_doc = np.zeros(n_words, dtype=np.int64) if example_doc is None else example_doc[word_example]
        doc_words = np.bincount(word_doc, minlength=len(rngs)).tolist()  # (D,)
        u = [rng.random(2 * w) for rng, w in zip(rngs, doc_words)]  # per document: lengths, then visiting keys
        u_len = u[0][: doc_words[0]] if len(u) == 1 else np.concatenate([x[:w] for x, w in zip(u, doc_words)])
        n = np.ones(n_words, dtype=np.int64)
        for threshold in self.ngram_cdf:  # inverse CDF; max_ngram - 1 comparisons beat a searchsorted
            n += u_len >= threshold
        # the j-th draw of an example is the length of its j-th tile: per-example cumulative sums
        total = n.cumsum()
        before = np.where(first_word > 0, total[first_word - 1], 0)  # (E,)
        end_rel = total - before[word_example]
        start_rel = end_rel - n
        k = (start_rel < words_in_example[word_example]).nonzero()[0]  # draws that start a real tile
        tile_example = word_example[k]
        tile_start = first_word[tile_example] + start_rel[k]
        tile_end = first_word[tile_example] + np.minimum(end_rel[k], words_in_example[tile_example])
        tile_tokens = word_bounds[tile_end] - word_bounds[tile_start]
        if len(u) == 1:
            keys = u[0][n_words : n_words + len(k)]
        else:  # a document's j-th tile takes the j-th key of its own draws (tiles <= words)
            tile_doc = word_doc[tile_start]
            pool_at = np.cumsum([0, *doc_words])[:-1]  # (D,) where each document's keys start in the pool
            rank = np.arange(len(k)) - tile_doc.searchsorted(np.arange(len(rngs)))[tile_doc]
            keys = np.concatenate([x[w:] for x, w in zip(u, doc_words)])[pool_at[tile_doc] + rank]
        order = np.lexsort((keys, tile_example))  # by example, random inside
        chosen = np.zeros(len(k), dtype=bool)
        left = np.asarray(budgets, dtype=np.int64).copy()
        examples = np.arange(n_examples)
        for _ in range(3):
            order = order[tile_tokens[order] <= left[tile_example[order]]]
            if not len(order):
                break
            tok, ex = tile_tokens[order], tile_example[order]
            running = tok.cumsum()
            seg_first = ex.searchsorted(examples)
            base = np.where(seg_first > 0, running[seg_first - 1], 0)
            take = running - base[ex] <= left[ex]
            chosen[order[take]] = True
            left -= np.bincount(ex[take], weights=tok[take], minlength=n_examples).astype(np.int64)
            order = order[~take]
        return tile_end - tile_start, tile_tokens, tile_example, chosen

    def _mask(self, pairs: list[tuple[np.ndarray, np.ndarray, int]], pair_doc: np.ndarray, tokens: np.ndarray,
              word_start: np.ndarray, rngs: list) -> list[Example]:
        """``[CLS] A [SEP] B [SEP]`` for every pair of the documents with whole-word n-gram masking, vectorised
        over all their examples (see the module docstring for the rules). A and B hold positions into the
        documents' ``tokens`` (T,) int32 and ``word_start`` (T,) bool; ``pair_doc`` (E,) non-decreasing: the
        document of each pair, whose generator ``rngs[d]`` draws its masks."""
        n_ex = len(pairs)
        la = np.fromiter((len(p[0]) for p in pairs), dtype=np.int64, count=n_ex)
        lb = np.fromiter((len(p[1]) for p in pairs), dtype=np.int64, count=n_ex)
        sop = [p[2] for p in pairs]
        cand = la + lb  # (E,) candidates per example: every token but [CLS]/[SEP]
        flat_pos = np.concatenate([seg for a, b, _ in pairs for seg in (a, b)])  # (N,)
        flat = tokens[flat_pos]
        off = cand.cumsum() - cand  # (E,) flat offset of each example
        ex_of = np.repeat(np.arange(n_ex), cand)  # (N,)
        # whole_word_masking false: every piece is a unit of its own (n-grams of pieces)
        starts = word_start[flat_pos] if self.cfg.whole_word_masking else np.ones(len(flat), dtype=bool)
        starts[off] = True
        starts[(off + la)[lb > 0]] = True  # B's first piece starts a word even when the cut fell inside one
        word_starts = starts.nonzero()[0]
        budgets = masking_budget(cand, self.cfg.masked_lm_prob, self.cfg.max_predictions_per_seq)  # (E,)
        _, tile_tokens, _, chosen = self.choose_ngrams_batch(word_starts, ex_of[word_starts], len(flat), budgets,
                                                             rngs, pair_doc)
        sel = np.repeat(chosen, tile_tokens).nonzero()[0]  # (k,) flat candidates to predict

        # layout: example e occupies out[out_off[e] : out_off[e] + cand[e] + 3]
        out_off = off + 3 * np.arange(n_ex)
        within = np.arange(len(flat)) - off[ex_of]
        new_idx = out_off[ex_of] + 1 + within + (within >= la[ex_of])
        out = np.empty(len(flat) + 3 * n_ex, dtype=np.int32)
        out[new_idx] = flat
        out[out_off] = CLS_ID
        out[out_off + la + 1] = SEP_ID
        out[out_off + cand + 2] = SEP_ID
        pos = new_idx[sel]
        original = out[pos]
        if len(rngs) == 1:
            u = rngs[0].random(2 * len(pos))
            r, rand = u[: len(pos)], u[len(pos) :]
        else:  # each document's draws: its masked tokens' "what becomes of it", then their random ids
            doc_sel = np.bincount(pair_doc[ex_of[sel]], minlength=len(rngs)).tolist()
            u = [rng.random(2 * m) for rng, m in zip(rngs, doc_sel)]
            r = np.concatenate([x[:m] for x, m in zip(u, doc_sel)])
            rand = np.concatenate([x[m:] for x, m in zip(u, doc_sel)])
        replace = r >= self.keep_below
        out[pos[r < self.mask_below]] = MASK_ID
        out[pos[replace]] = FIRST_NORMAL_ID + (rand[replace] * (self.vocab_size - FIRST_NORMAL_ID)).astype(np.int32)

        ex_sel = ex_of[sel]
        local = pos - out_off[ex_sel]
        cuts = np.concatenate(([0], np.bincount(ex_sel, minlength=n_ex).cumsum())).tolist()
        ends = (out_off + cand + 3).tolist()
        starts_out = out_off.tolist()
        la_list = la.tolist()
        return [  # slices (views), cheaper than np.split
            Example(out[starts_out[e] : ends[e]], la_list[e], local[cuts[e] : cuts[e + 1]],
                    original[cuts[e] : cuts[e + 1]], sop[e])
            for e in range(n_ex)
        ]


def collate(examples: list[Example], max_seq_length: int) -> dict[str, torch.Tensor]:
    """Pad to ``max_seq_length`` and stack: ``input_ids``, ``attention_mask``, ``token_type_ids``, ``mlm_labels``
    (B, S) int64 (pad id 0, labels -100 where not masked) and ``sop_labels`` (B,) int64.

    One scatter per tensor for the whole batch (no per-row copies)."""
    bsz = len(examples)
    lengths = np.fromiter((len(e.input_ids) for e in examples), dtype=np.int64, count=bsz)
    rows = np.repeat(np.arange(bsz), lengths)
    cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((bsz, max_seq_length), PAD_ID, dtype=np.int64)
    input_ids[rows, cols] = np.concatenate([e.input_ids for e in examples])
    positions = np.arange(max_seq_length)
    attention_mask = (positions < lengths[:, None]).astype(np.int64)
    len_a = np.fromiter((e.len_a for e in examples), dtype=np.int64, count=bsz)
    token_type_ids = ((positions >= len_a[:, None] + 2) & (attention_mask == 1)).astype(np.int64)
    n_masked = np.fromiter((len(e.masked_positions) for e in examples), dtype=np.int64, count=bsz)
    mlm_labels = np.full((bsz, max_seq_length), IGNORE_INDEX, dtype=np.int64)
    mlm_labels[np.repeat(np.arange(bsz), n_masked), np.concatenate([e.masked_positions for e in examples])] = (
        np.concatenate([e.masked_ids for e in examples]))
    sop = np.fromiter((e.sop_label for e in examples), dtype=np.int64, count=bsz)
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
        "token_type_ids": torch.from_numpy(token_type_ids),
        "mlm_labels": torch.from_numpy(mlm_labels),
        "sop_labels": torch.from_numpy(sop),
    }


def drop_full_mask(batch: dict[str, torch.Tensor]) -> dict[str, Optional[torch.Tensor]]:
    """`batch` (a `collate` dict) with ``attention_mask`` None when no row is padded, else `batch` itself.

    Called on the host copy, before the batch goes to the device: the check reads host memory (no device sync,
    one pass over B x S int64). The model then runs attention without a mask (`AlbertModel.forward`), the only
    form PyTorch's FlashAttention backend takes (a mask sends SDPA to the memory-efficient or math kernel);
    equal to the all-ones mask (tests/unit/test_attention_mask.py)."""
    mask = batch["attention_mask"]
    if mask.device.type != "cpu":
        raise ValueError(f"drop_full_mask decides on the host: attention_mask is on {mask.device}")
    return {**batch, "attention_mask": None} if bool(mask.all()) else batch
