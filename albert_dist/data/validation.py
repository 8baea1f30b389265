"""The fixed validation set and its unigram baseline.

**The set.** The first ``DataConfig.eval_examples`` ALBERT examples (SOP pairs, n-gram masks) of the validation
sources, built in one pass by every rank alike, seeded by ``DataConfig.eval_seed`` only: the same examples, masks
and SOP pairs at every evaluation, for every world size, number of workers and training seed. Documents are read
in file order (sources mixed per document by their weights, seeded), each one's examples drawn from a generator
keyed by ``(eval_seed, source, document index)``, exactly as the training stream builds them (same
``short_seq_prob``, masking and SOP rules), so the set measures the training objective, except the masking rate:
``eval_masked_lm_prob`` (0.15) whatever ``masked_lm_prob`` is, so runs that mask 15% and 30% are scored alike. Reading stops at
``eval_examples`` or at the end of a source's first pass, whichever comes first: no document is used twice.
Rank ``r`` of ``W`` evaluates the contiguous rows ``[r N / W, (r + 1) N / W)``; summing metric *sums and counts*
over ranks (albert_dist.engine.evaluation) then gives the same figures for any world size.

**The unigram baseline.** The accuracy and loss of predicting every masked token of the set from token
frequencies alone: the argmax of the training corpus's unigram distribution at every position, and the
cross-entropy of the labels under it. Frequencies come from the training sources' tokens (encoded as the pipeline
encodes them: sentences of each document), add-one smoothed over the ids a label can take, with the sources mixed
by their weights. A model that learns nothing but frequencies scores this; ``val_mlm_accuracy_over_unigram`` says
how far above it a model is.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from albert_dist.data.sources import cache, store
from albert_dist.data.config import DataConfig
from albert_dist.data.sources.discover import discover_files
from albert_dist.data.pretraining import Example, ExampleBuilder, collate
from albert_dist.data.text import split_sentences
from albert_dist.data.sources.pieces import pieces_of
from albert_dist.data.stream import SourceStream, iter_texts
from albert_dist.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, load_tokenizer
from albert_dist.model.config import IGNORE_INDEX

logger = logging.getLogger(__name__)

#: Bytes of training text read (per source, in file order) to count token frequencies for the unigram baseline:
#: 64 MiB is ~16M tokens, a few seconds of sentencepiece, and more than the frequencies of 8k-32k pieces need.
UNIGRAM_SAMPLE_BYTES = 64 << 20
#: Ids that are never an MLM label: padding and the control symbols the pipeline inserts by id.
NEVER_LABELS = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)


@dataclass
class ValidationSet:
    """The whole fixed validation set as padded tensors (see the module docstring for how it is chosen).

    ``batch``: ``input_ids, attention_mask, token_type_ids, mlm_labels`` (N, S) int64 and ``sop_labels`` (N,)
    int64, S = ``max_seq_length``, exactly as :func:`albert_dist.data.pretraining.collate` makes them.
    ``documents``: documents read; ``complete``: False when the sources ran out before ``eval_examples``.
    """

    batch: dict[str, torch.Tensor]
    documents: int
    complete: bool

    def __len__(self) -> int:
        return int(self.batch["sop_labels"].shape[0])

    @property
    def masked_tokens(self) -> int:
        """MLM predictions in the set (positions with a label)."""
        return int((self.batch["mlm_labels"] != IGNORE_INDEX).sum())

    @property
    def sop_pairs(self) -> int:
        """SOP predictions in the set (one per example)."""
        return len(self)

    def rank_rows(self, rank: int, world_size: int) -> tuple[int, int]:
        """``[start, stop)``: the contiguous rows rank ``rank`` of ``world_size`` evaluates (sizes differ by <= 1)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        n = len(self)
        return rank * n // world_size, (rank + 1) * n // world_size

    def rank_batches(self, rank: int, world_size: int, micro_batch_size: int) -> list[dict[str, torch.Tensor]]:
        """This rank's rows in batches of ``micro_batch_size`` (the last one may be smaller); views, no copies."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        start, stop = self.rank_rows(rank, world_size)
        return [{k: v[i : min(i + micro_batch_size, stop)] for k, v in self.batch.items()}
                for i in range(start, stop, micro_batch_size)]

    def forward_passes(self, world_size: int, micro_batch_size: int) -> int:
        """Forward passes every rank runs: the most any rank's rows need (ZeRO-3's forward is collective, so a
        rank with fewer rows runs extra passes whose results it discards)."""
        most = -(-len(self) // world_size)
        return max(1, -(-most // micro_batch_size))


def _validation_streams(cfg: DataConfig) -> list[SourceStream]:
    streams = []
    retry = store.RetryPolicy(budget_s=cfg.store_retry_s)
    for i, src in enumerate(cfg.validation):
        where = f"data.validation[{i}]"
        # one slot: the set is read in file order by every rank alike, whatever the world size
        plan = None if src.format == "hub" else pieces_of(src, where, cfg.shard_piece_bytes, slots=1, retry=retry)
        streams.append(SourceStream(src, where, plan, 0, 1, cfg.eval_seed + 1000 * i, False, cfg.max_document_bytes,
                                    retry))
    return streams


def build_validation_set(cfg: DataConfig, sp=None) -> ValidationSet:
    """Build the fixed validation set of ``cfg`` (every rank alike; no process group needed).

    Object-store sources that fit ``data.cache_max_bytes`` are read through the node's cache (`_local_copies`).
    ``sp``: the sentencepiece processor (loaded from ``cfg.tokenizer_path`` when None). Raises ValueError when
    ``data.validation`` lists no source or holds no example. Fewer than ``data.eval_examples``: the whole first
    pass of the sources is the set, ``complete`` False (the trainer's `Evaluator` warns, on rank 0).
    """
    if not cfg.validation:
        raise ValueError("data.validation lists no source; there is no validation set to build")
    builder = ExampleBuilder(sp if sp is not None else load_tokenizer(cfg.tokenizer_path),
                             dataclasses.replace(cfg, masked_lm_prob=cfg.eval_masked_lm_prob))
    with _local_copies(cfg):
        streams = _validation_streams(cfg)
        return _build(cfg, builder, streams)


def _local_copies(cfg: DataConfig):
    """The validation sources' objects pinned in the node's cache (`albert_dist.data.sources.cache`) and read from there:
    every rank and every (re)start of a job builds this set, so the store is read once per node, not once per
    build. A source larger than ``data.cache_max_bytes`` is read from the store (its first ``eval_examples``
    examples may be a small part of it); local and hub sources are read as they are. The store is read under
    ``data.store_retry_s``."""
    urls = []
    retry = store.RetryPolicy(budget_s=cfg.store_retry_s)
    for i, src in enumerate(cfg.validation):
        if not cfg.cache_max_bytes or src.format == "hub" or not any(store.is_url(p) for p in src.paths):
            continue
        files = [f for f in discover_files(src, f"data.validation[{i}]", retry) if store.is_url(f)]
        total = sum(store.file_size(f, retry) for f in files)
        if total > cfg.cache_max_bytes:
            logger.info("data.validation[%d]: %d bytes of objects > data.cache_max_bytes=%d; read from the store, "
                        "not cached", i, total, cfg.cache_max_bytes)
            continue
        urls += files
    if not urls:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    with stack:
        copies = stack.enter_context(cache.ObjectCache(cfg.cache_dir or cache.default_dir(), cfg.cache_max_bytes,
                                                       retry=retry).pin(urls))
        stack.enter_context(store.read_locally(copies))
        return stack.pop_all()


def _build(cfg: DataConfig, builder: ExampleBuilder, streams: list[SourceStream]) -> ValidationSet:
    weights = np.array([s.weight for s in cfg.validation], dtype=np.float64)
    weights /= weights.sum()
    mix = np.random.default_rng([cfg.eval_seed, 3])
    examples: list[Example] = []
    documents, complete = 0, True
    while len(examples) < cfg.eval_examples:
        i = int(mix.choice(len(streams), p=weights)) if len(streams) > 1 else 0
        text, (epoch, index) = streams[i].next_document()
        if epoch > 0:  # the source's first pass is over: the set would repeat documents
            complete = False
            break
        documents += 1
        examples.extend(builder.build(text, np.random.default_rng([cfg.eval_seed, i, index])))
    examples = examples[: cfg.eval_examples]
    if not examples:
        raise ValueError(f"data.validation: {[s.paths for s in cfg.validation]!r} holds no example "
                         "(documents shorter than 2 tokens?)")
    return ValidationSet(collate(examples, cfg.max_seq_length), documents, complete)


def token_counts(cfg: DataConfig, sp, max_bytes: int = UNIGRAM_SAMPLE_BYTES) -> Optional[np.ndarray]:
    """(V,) float64 unigram distribution of the training sources: per local source, the tokens of its first
    ``max_bytes`` bytes of documents (file order), add-one smoothed over the ids a label can take (all but
    ``NEVER_LABELS``), mixed by the sources' weights. Hub sources are left out (streaming one to count it would
    cost a download); None when no source is local. An object store is read under ``cfg.store_retry_s``."""
    vocab = sp.get_piece_size()
    can_label = np.ones(vocab, dtype=bool)
    can_label[list(NEVER_LABELS)] = False
    mixed = np.zeros(vocab, dtype=np.float64)
    weight_sum = 0.0
    for i, src in enumerate(cfg.train):
        if src.format == "hub":
            logger.info("unigram baseline: data.train[%d] is a hub dataset, left out of the token counts", i)
            continue
        counts = np.zeros(vocab, dtype=np.int64)
        read = 0
        for text in iter_texts([src], f"data.train[{i}]", cfg.max_document_bytes,
                               retry=store.RetryPolicy(budget_s=cfg.store_retry_s)):
            pieces = sp.encode(split_sentences(text), num_threads=1)
            counts += np.bincount(np.fromiter((t for p in pieces for t in p), dtype=np.int64), minlength=vocab)
            read += len(text.encode("utf-8"))
            if read >= max_bytes:
                break
        smoothed = np.where(can_label, counts + 1.0, 0.0)
        mixed += src.weight * smoothed / smoothed.sum()
        weight_sum += src.weight
    return mixed / weight_sum if weight_sum else None


def unigram_baseline(labels: torch.Tensor, probs: np.ndarray) -> dict[str, float]:
    """Accuracy and mean cross-entropy (nats) of predicting every label from ``probs`` alone.

    ``labels``: int64 MLM labels of any shape (-100 = no prediction); ``probs``: (V,) a distribution over the
    vocabulary (:func:`token_counts`). Returns ``{"unigram_mlm_accuracy", "unigram_mlm_loss", "unigram_token"}``
    (the id predicted everywhere, as a float). Raises ValueError when no position has a label.
    """
    y = labels[labels != IGNORE_INDEX].numpy()
    if not len(y):
        raise ValueError("unigram baseline: the labels hold no masked position")
    best = int(np.argmax(probs))
    return {"unigram_mlm_accuracy": float(np.mean(y == best)),
            "unigram_mlm_loss": float(-np.mean(np.log(probs[y]))),
            "unigram_token": float(best)}
