"""Resumable, rank-aware pretraining loaders (torchdata ``StatefulDataLoader`` over a stateful stream).

``build_train_loader`` returns an infinite ``StatefulDataLoader`` whose ``state_dict()`` (plain dicts, lists, ints,
strings; fit for DeepSpeed's ``client_state``/``torch.save``) restores the exact batch sequence, with or without
worker processes, without replaying the stream (see :mod:`albert_dist.data.stream` for resume and
:mod:`albert_dist.data.sources.discover` for splitting).
Every rank yields a batch on every call, forever, so ranks cannot diverge in step count.

The fixed validation set is not a stream: see :mod:`albert_dist.data.validation`.

Resume requires the same world size, ``num_workers``, micro batch size, corpus and stream settings (checked:
``ValueError`` on a mismatch of the slot layout or the stream's fingerprint); a resume whose config changes any of
them restarts the streams instead (`albert_dist.engine.checkpoint.drift`, by the same ``on_resume`` tags). The
pieces are planned for this stream's slots (world_size x num_workers), so they are part of the fingerprint: a job
resumed on another world size rebuilds the old streams as "rank r of the old world size"
(`albert_dist.engine.checkpoint.reshard`), which plans the same pieces again.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from dataclasses import asdict, fields
from typing import Any, Iterator, Optional

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from albert_dist.data.sources import store
from albert_dist.data.config import DataConfig
from albert_dist.data.sources.discover import slot_shares
from albert_dist.data.sources.pieces import SourceSlots, amplification_warning, pieces_of, summarize_pieces
from albert_dist.data.pretraining import Example, ExampleBuilder, collate
from albert_dist.data.stream import SourceStream
from albert_dist.data.tokenizer import load_tokenizer
from albert_dist.exit_codes import InputVanished
from albert_dist.on_resume import RESTART_STREAMS, RULE_KEY

logger = logging.getLogger(__name__)

#: The DataConfig fields a stream's batches depend on: those whose change restarts the streams on resume (the
#: `on_resume` tags, one table with the drift check), except the sources (the fingerprint holds their pieces
#: and settings instead) and num_workers (it sizes the pieces, which are fingerprinted; the slot is checked when
#: iterating).
FINGERPRINT_FIELDS = tuple(f.name for f in fields(DataConfig) if f.metadata.get(RULE_KEY) == RESTART_STREAMS
                           and f.name not in ("train", "num_workers"))
#: Extra bytes read per epoch (over reading every byte once) below which read amplification is an info line,
#: not the warning: a small corpus read a few times costs less than one training step.
QUIET_EXTRA_BYTES = 64 << 20
#: The key of the one item a rank's stream yields, in place of a batch, when a read of the object store gave up
#: (`store.StoreUnavailable`): its message. `next_batch` raises it again in the training process, as the same type
#: whether the stream ran in a loader worker or not, and the worker ends without a traceback.
STORE_UNAVAILABLE = "store_unavailable"
#: The same for a file or object of the plan that is gone (`InputVanished`, raised again by `next_batch`).
INPUT_VANISHED = "input_vanished"


def next_batch(iterator: Iterator[dict]) -> dict[str, torch.Tensor]:
    """The next batch of a training loader's iterator. Raises `store.StoreUnavailable` (one line naming the URL)
    when the stream gave up on the object store, `InputVanished` (one line naming the file) when a file or object
    of its plan is gone; the loader yields nothing more after either."""
    batch = next(iterator)
    if STORE_UNAVAILABLE in batch:
        raise store.StoreUnavailable(batch[STORE_UNAVAILABLE])
    if INPUT_VANISHED in batch:
        raise InputVanished(batch[INPUT_VANISHED])
    return batch


class PretrainingStream(torch.utils.data.IterableDataset):
    """Batches of one rank: mixes its sources per document (seeded), builds examples, collates.

    ``pieces``: as for `build_train_loader` (planned here when None). Its object-store requests (planning, reading,
    reading ahead) are retried under ``retry``, this stream's own policy made from ``cfg.store_retry_s``
    (`albert_dist.data.sources.store.RetryPolicy`). Inside a DataLoader worker the slot is
    ``rank * num_workers + worker``; torchdata's ``StatefulDataLoader``
    calls ``state_dict()`` in the worker after each batch and ``load_state_dict()`` before iterating.

    Examples are drawn from a *window* of ``cfg.shuffle_documents`` consecutive documents, shuffled together
    (one document when ``shuffle`` is off), so a batch mixes documents as run_mlm's shuffled blocks do.

    State (JSON-able): the source positions and mixing RNG *before* the window whose examples are being
    drained, plus how many of its examples were consumed. On resume that window is re-read and its examples
    regenerated (the per-document RNG is seeded by the document key), and the consumed ones skipped.
    """

    def __init__(self, cfg: DataConfig, split: str, micro_batch_size: int, rank: int, world_size: int,
                 pieces: Optional[list[Optional[list[dict]]]] = None) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.cfg, self.split = cfg, split
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self.sources = cfg.train if split == "train" else cfg.validation
        if not self.sources:
            raise ValueError(f"data.{split} lists no source")
        self.shuffle = cfg.shuffle and split == "train"
        # this stream's own policy (planning, its readers, a worker's copy): never the process's, so two streams
        # of one process keep their own data.store_retry_s
        self.retry = store.RetryPolicy(budget_s=cfg.store_retry_s)
        # Plan (and validate paths) in the parent process, so a missing file fails before any worker starts,
        # unless the app's preflight planned these slots already (`pieces`). Pieces are sized for this stream's
        # slots (albert_dist.data.sources.discover.piece_bytes_for).
        self.num_slots = world_size * max(1, cfg.num_workers)
        if pieces is not None and len(pieces) != len(self.sources):
            raise ValueError(f"pieces: {len(pieces)} plans for the {len(self.sources)} sources of data.{split}")
        self.plans: list[Optional[list[dict]]] = pieces if pieces is not None else [
            None if src.format == "hub" else pieces_of(src, f"data.{split}[{i}]", cfg.shard_piece_bytes,
                                                         self.num_slots, retry=self.retry)
            for i, src in enumerate(self.sources)
        ]
        weights = np.array([s.weight for s in self.sources], dtype=np.float64)
        self.weights = weights / weights.sum()
        self.fingerprint = self._fingerprint(micro_batch_size)
        self._resume: Optional[dict] = None
        self._live: Optional[dict] = None
        self._builder: Optional[ExampleBuilder] = None

    def _fingerprint(self, micro_batch_size: int) -> str:
        """Hash of what defines this stream's batches: the sources' pieces (file names and byte ranges, not
        absolute paths, so a checkpoint survives moving the corpus; they depend on world_size x num_workers through
        their size), the settings of `FINGERPRINT_FIELDS`, the batch size. Fields that do not change the batches
        (the validation set's) are left out; the slot itself is checked when iterating."""
        pieces = [
            None if plan is None else [(os.path.basename(p["path"]), p["start"], p["end"], p["row_group"]) for p in plan]
            for plan in self.plans
        ]
        payload = {
            "split": self.split, "micro_batch_size": micro_batch_size, "pieces": pieces,
            "sources": [asdict(s) | {"paths": s.paths if s.format == "hub" else None} for s in self.sources],
            # the tokenizer by file name, like the pieces: config paths are absolute since load_config resolves them
            "settings": {k: getattr(self.cfg, k) for k in FINGERPRINT_FIELDS}
            | {"tokenizer_path": os.path.basename(self.cfg.tokenizer_path)},
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    # -- slots ---------------------------------------------------------------------------------------------------
    def _slot(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def log_slot_shares(self, num_workers: int) -> None:
        """Log, per source, how many pieces and bytes each slot of this rank reads; on rank 0, one warning when
        a source would be read more than `albert_dist.data.sources.pieces.AMPLIFICATION_LIMIT` times per epoch (with the
        ``albert-dist data prepare`` command), an info line instead when the extra reading is small."""
        slots = self.world_size * max(1, num_workers)
        plans: list[SourceSlots] = []
        for i, pieces in enumerate(self.plans):
            where = f"data.{self.split}[{i}]"
            if pieces is None:
                logger.info("%s: hub dataset %s streamed over %d slots", where, self.sources[i].paths[0], slots)
                continue
            plan = summarize_pieces(self.sources[i], where, slots, pieces, manifest=False)
            plan.ranks, plan.workers, plan.weight = self.world_size, num_workers, self.sources[i].weight
            plan.only_source = len(self.sources) == 1
            plans.append(plan)
            for w in range(max(1, num_workers)):
                shares = slot_shares(len(pieces), slots, self.rank * max(1, num_workers) + w)
                shared = max(k for _, k, _ in shares)
                logger.info("%s: rank %d worker %d reads %d of %d pieces, %d bytes%s", where, self.rank, w,
                            len(shares), len(pieces), sum(pieces[i]["nbytes"] for i, _, _ in shares),
                            f" (each shared with {shared - 1} other slots)" if shared > 1 else "")
        warning = amplification_warning(plans)
        if warning and self.rank == 0:
            extra = sum(p.bytes * (p.amplification - 1) for p in plans)
            (logger.warning if extra > QUIET_EXTRA_BYTES else logger.info)(warning)

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position after the last yielded batch (before any batch when iteration has not started)."""
        if self._live is not None:
            return copy.deepcopy(self._live)
        return copy.deepcopy(self._resume) if self._resume is not None else {"fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``; raises ValueError when it was taken under another config or layout."""
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"data loader state was saved with another data config, corpus, micro batch size or number of "
                f"slots (world size x num_workers, which sizes the pieces) (fingerprint "
                f"{state.get('fingerprint')!r}, now {self.fingerprint!r})"
            )
        self._resume = copy.deepcopy(state)
        self._live = None

    # -- iteration ------------------------------------------------------------------------------------------------
    def _make_sources(self, slot: int, num_slots: int) -> list[SourceStream]:
        return [
            SourceStream(src, f"data.{self.split}[{i}]", self.plans[i], slot, num_slots, self.cfg.seed + 1000 * i,
                         self.shuffle, self.cfg.max_document_bytes, self.retry)
            for i, src in enumerate(self.sources)
        ]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        try:
            yield from self._batches()
        except Exception as err:  # not `except store.StoreUnavailable`: see below
            # A generator left unfinished is closed at interpreter exit, after module globals may be gone: the
            # GeneratorExit it receives (a BaseException) must not reach a clause that looks up `store`.
            if isinstance(err, store.StoreUnavailable):
                yield {STORE_UNAVAILABLE: str(err)}  # not a worker traceback: the trainer stops every rank (next_batch)
            elif isinstance(err, InputVanished):  # the same way
                yield {INPUT_VANISHED: str(err)}
            else:
                raise

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._builder is None:
            self._builder = ExampleBuilder(load_tokenizer(self.cfg.tokenizer_path), self.cfg)
        slot, num_slots = self._slot()
        windows = _SlotWindows(self, self._make_sources(slot, num_slots), slot, num_slots)
        resume = self._resume
        batches = 0
        if resume is not None and "before" in resume:
            if (resume["slot"], resume["num_slots"]) != (slot, num_slots):
                raise ValueError(
                    f"data loader state is for slot {resume['slot']} of {resume['num_slots']}, this process is slot "
                    f"{slot} of {num_slots}: resume needs the same world size and num_workers"
                )
            batches = resume["batches"]
            windows.restore(resume["before"])
            windows.next_window()
            windows.consumed = resume["consumed"]
        while True:
            batch = windows.take(self.micro_batch_size)
            batches += 1
            self._live = {
                "fingerprint": self.fingerprint, "slot": slot, "num_slots": num_slots, "batches": batches,
                "before": windows.before, "consumed": windows.consumed,
            }
            yield collate(batch, self.cfg.max_seq_length)


class _SlotWindows:
    """One slot's examples, a window at a time (`PretrainingStream`): the sources mixed per document, each window's
    examples built and shuffled together, and the checks on what the documents gave (a slot holding a single
    document, an epoch of every source without one example).

    A window is a pure function of the snapshot taken before it (``before``: per-document RNGs are seeded by the
    document key, the permutation by the stream positions after its last document), so a resume restores that
    snapshot, re-reads the window and skips the ``consumed`` examples."""

    def __init__(self, owner: PretrainingStream, streams: list[SourceStream], slot: int, num_slots: int) -> None:
        self.owner, self.streams, self.slot, self.num_slots = owner, streams, slot, num_slots
        self.seed = owner.cfg.seed
        self.mix = np.random.default_rng([self.seed, slot, 3])
        self.window = owner.cfg.shuffle_documents if owner.shuffle else 1
        self.pending: list[Example] = []  # the current window's examples
        self.consumed = 0  # of them
        self.before: Optional[dict] = None  # the snapshot the current window was read from
        self._single_warned: set[int] = set()  # sources already reported as a single repeating document
        self._barren: list[int] = []  # epochs of every source when the current run of example-less documents began

    def snapshot(self) -> dict:
        return {"sources": [s.state_dict() for s in self.streams], "mix": copy.deepcopy(self.mix.bit_generator.state)}

    def restore(self, snap: dict) -> None:
        for s, st in zip(self.streams, snap["sources"]):
            s.load_state_dict(st)
        self.mix.bit_generator.state = snap["mix"]

    def take(self, n: int) -> list[Example]:
        """The next `n` examples, reading windows as needed."""
        batch: list[Example] = []
        while len(batch) < n:
            if self.consumed >= len(self.pending):
                self.next_window()
                continue
            take = min(n - len(batch), len(self.pending) - self.consumed)
            batch.extend(self.pending[self.consumed : self.consumed + take])
            self.consumed += take
        return batch

    def next_window(self) -> None:
        """Fill ``pending`` with the next window: the examples of ``window`` documents, shuffled together."""
        self.before = self.snapshot()
        self.pending, self.consumed = self._build([self._read_document() for _ in range(self.window)]), 0
        if self.window > 1 and self.pending:
            start = [s.epoch for s in self.streams] + [s.docs_in_epoch for s in self.streams]
            order = np.random.default_rng([self.seed, self.slot, 5, *start]).permutation(len(self.pending))
            self.pending = [self.pending[j] for j in order]

    def _read_document(self) -> tuple[int, str, np.random.Generator, list[int]]:
        """The next document: (its source, text, generator, every source's epoch once it was read)."""
        streams = self.streams
        i = int(self.mix.choice(len(streams), p=self.owner.weights)) if len(streams) > 1 else 0
        text, (epoch, index) = streams[i].next_document()
        return i, text, np.random.default_rng([self.seed, i, self.slot, epoch, index]), [s.epoch for s in streams]

    def _build(self, docs: list[tuple[int, str, np.random.Generator, list[int]]]) -> list[Example]:
        """The examples of `docs`, built together (`ExampleBuilder.build_documents`: the same examples as one
        by one), then each document's checks in reading order."""
        owner = self.owner
        built = owner._builder.build_documents([d[1] for d in docs], [d[2] for d in docs])
        out: list[Example] = []
        for (i, _, _, epochs), examples in zip(docs, built):
            if self.streams[i].single_document and i not in self._single_warned and owner.split == "train":
                self._single_warned.add(i)
                logger.warning("data.train[%d]: slot %d of %d (rank x workers) holds a single document; its %d "
                               "examples repeat about every %d batches of this slot (new masks and SOP pairs "
                               "each time): add documents, or split this one at blank lines", i, self.slot,
                               self.num_slots, len(examples), max(1, -(-len(examples) // owner.micro_batch_size)))
            if examples:
                self._barren = []
            elif not self._barren:
                self._barren = epochs
            elif all(e >= b + 2 for e, b in zip(epochs, self._barren)):
                # a full epoch of every source without one example: fail instead of spinning forever
                raise ValueError(
                    f"data.{owner.split}: slot {self.slot} of {self.num_slots} read a whole epoch of every source "
                    "without one example (documents shorter than 2 tokens?)"
                )
            out.extend(examples)
        return out


def prefetch_factor_for(num_workers: int, micro_batches_per_step: int) -> Optional[int]:
    """The DataLoader ``prefetch_factor`` that keeps at least `micro_batches_per_step` batches in flight over
    `num_workers` workers: ceil(GA / num_workers), at least torch's default 2; None without workers (torch
    refuses a factor then). The trainer takes a step's GA micro-batches before its first forward (the loss is
    normalised by the step's label counts, `albert_dist.engine.loss`), so with fewer in flight the workers
    stop once the queue is full and the next step waits while they make the rest."""
    if num_workers == 0:
        return None
    return max(2, -(-micro_batches_per_step // num_workers))


def build_train_loader(cfg: DataConfig, micro_batch_size: int, rank: int, world_size: int,
                       pieces: Optional[list[Optional[list[dict]]]] = None, micro_batches_per_step: int = 1,
                       pin_memory: bool = False) -> StatefulDataLoader:
    """Infinite, resumable training loader of one rank.

    Yields dicts ``input_ids, attention_mask, token_type_ids, mlm_labels`` (B, S) int64 and ``sop_labels`` (B,)
    int64, B = micro_batch_size, S = cfg.max_seq_length. ``state_dict()``/``load_state_dict()`` come from
    torchdata's StatefulDataLoader. ``pieces``: per training source, its plan for world_size x
    max(1, num_workers) slots (`albert_dist.data.sources.pieces.pieces_of`; None for a hub source), as the app's
    preflight made it (`albert_dist.apps.pretrain.preflight.JobPlan.train_pieces`); planned here when not given.
    ``micro_batches_per_step`` (the gradient accumulation steps): the workers keep at least that many batches
    in flight (`prefetch_factor_for`), so the next step's micro-batches are made while this one computes; the
    state still resumes exactly (StatefulDataLoader snapshots each worker's state with the batch it yields,
    not what it has prefetched). ``pin_memory``: batches come in page-locked memory (for CUDA, where a
    ``non_blocking`` copy from pageable memory blocks the host).
    Raises ValueError at once for missing paths, empty globs, bad arguments.
    """
    if micro_batches_per_step < 1:
        raise ValueError(f"micro_batches_per_step must be >= 1, got {micro_batches_per_step}")
    stream = PretrainingStream(cfg, "train", micro_batch_size, rank, world_size, pieces)
    stream.log_slot_shares(cfg.num_workers)
    return StatefulDataLoader(
        stream,
        batch_size=None,
        num_workers=cfg.num_workers,
        persistent_workers=False,
        prefetch_factor=prefetch_factor_for(cfg.num_workers, micro_batches_per_step),
        pin_memory=pin_memory,
    )
