"""Documents of a source: the per-slot stream the loader cycles forever, and every document in file order.

Every local source is planned once per job (`albert_dist.data.sources.pieces.pieces_of`: discovery, the text-field
check, pieces for the job's slot count), and each slot reads its share of the pieces
(`albert_dist.data.sources.discover.slot_shares`) through a ``datasets.IterableDataset.from_generator`` over that share
alone: its ``state_dict()`` records the piece index and the record index inside it, and on resume datasets
re-reads only the current piece up to that record (bounded by the piece, independent of the position in the
corpus). A hub dataset (``format: hub``) is ``datasets.load_dataset(..., streaming=True)``, split with
``datasets.distributed.split_dataset_by_node`` over the slots (its own shards when it has enough, else every
slot reads all of it and keeps one record in ``slots``), in its stored order: datasets' shuffle buffer is not
part of its state_dict, so it would break exact resume.

Each slot cycles its pieces forever, with a new order of its pieces and of the documents inside each piece
every epoch (documents are shuffled in blocks of at most `SHUFFLE_BLOCK_BYTES`, so a multi-GB compressed piece is
never held in memory), so no rank or worker ever runs dry; epochs are counted per slot.

Bad records (malformed JSON, invalid UTF-8, empty, longer than ``max_document_bytes``, missing text field, the
rest of a damaged piece) come from the reader as skip markers (`albert_dist.data.sources.read`), are counted per
reason and logged with their file and position; 0-byte files and parquet files whose footer does not parse are
counted at planning time. A path that does not exist or a glob that matches nothing raises ``ValueError`` when
the loader is built.
"""
from __future__ import annotations

import logging
import os
import zlib
from collections import Counter
from functools import partial
from typing import Any, Iterator, Optional

import numpy as np

from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.read import piece_read_ranges, read_piece, record_location
from albert_dist.data.sources.hub import load_args as hub_load_args
from albert_dist.data.sources.discover import slot_shares
from albert_dist.data.sources.pieces import pieces_of
from albert_dist.data.sources.store import DEFAULT_RETRY, ReadAhead, RetryPolicy, is_url

logger = logging.getLogger(__name__)

_LOUD_SKIPS = 3  # per reason and slot, logged as warnings
_LOG_EVERY_DOCUMENTS = 100_000
#: Documents of a piece are shuffled in consecutive blocks of about this many bytes (a byte-range piece is one
#: block; a compressed file or large row group is several), which bounds the memory of the shuffle.
SHUFFLE_BLOCK_BYTES = 4 << 20


def _generate_records(shares: list[dict], text_field: str, txt_documents: str, max_bytes: int, order_seed: int,
                      ahead: Optional[ReadAhead] = None, retry: RetryPolicy = DEFAULT_RETRY):
    """datasets generator: the records of each share ``{"piece", "k", "j", "at"}`` (records j, j+k, ... of the
    piece; ``at``: its place in the epoch's order), shuffled in blocks of `SHUFFLE_BLOCK_BYTES` when order_seed >=
    0. ``ahead``: the epoch's pieces, fetched ahead of the reader (datasets calls this once per share);
    ``retry``: the policy an object's reads are retried under."""
    for share in shares:
        piece = share["piece"]
        if ahead is not None:
            ahead.at(share["at"])
        records = read_piece(piece, text_field, txt_documents, max_bytes, (share["k"], share["j"]), retry=retry)
        if order_seed < 0:
            yield from records
            continue
        # seeded by the file *name* and range, so moving the corpus keeps the order (and a saved resume state)
        name = zlib.crc32(os.path.basename(piece["path"]).encode())
        block: list[dict] = []
        held, index = 0, 0
        for rec in records:
            block.append(rec)
            held += len(rec["text"]) + 64
            if held >= SHUFFLE_BLOCK_BYTES:
                yield from _shuffled(block, [order_seed, piece["start"], piece["row_group"] + 1, name, index])
                block, held, index = [], 0, index + 1
        yield from _shuffled(block, [order_seed, piece["start"], piece["row_group"] + 1, name, index])
    if ahead is not None and shares and shares[-1]["at"] == len(ahead.order) - 1:
        ahead.at(len(ahead.order))  # the epoch is read: drop what was fetched for it and not read


def _shuffled(block: list[dict], seed: list[int]) -> Iterator[dict]:
    for i in np.random.default_rng(seed).permutation(len(block)):
        yield block[i]


class SourceStream:
    """The documents of one source that belong to one slot (rank x workers + worker), cycled forever.

    ``pieces``: the source's plan (`pieces_of` for this job's slot count; None for a hub source). ``retry``: the
    policy its object-store reads are retried under (the job's ``data.store_retry_s``).
    ``next_document()`` returns ``(text, key)`` where ``key = (epoch, index of the document in this slot's
    epoch)`` identifies the document for seeding; unusable records are counted in ``counters`` and skipped.
    ``state_dict()`` is JSON-able: epoch, position and the datasets ``IterableDataset.state_dict()``.
    Raises ValueError when a whole epoch of this slot holds no usable document (instead of spinning forever).
    """

    def __init__(
        self,
        source: SourceConfig,
        where: str,
        pieces: Optional[list[dict]],
        slot: int,
        num_slots: int,
        seed: int,
        shuffle: bool,
        max_document_bytes: int,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.source, self.where, self.retry = source, where, retry
        self.pieces, self.slot, self.num_slots = pieces, slot, num_slots
        self.seed, self.shuffle, self.max_document_bytes = seed, shuffle, max_document_bytes
        self.shares = None if pieces is None else [
            {"piece": pieces[i], "k": k, "j": j} for i, k, j in slot_shares(len(pieces), num_slots, slot)]
        self.epoch = 0
        self.docs_in_epoch = 0
        self.single_document = False  # the last finished epoch of this slot held exactly one document
        self.records_in_epoch = 0
        self.counters: Counter = Counter()
        self._ds = None
        self._it: Optional[Iterator] = None
        self._resume_ds_state: Optional[dict] = None

    # -- datasets plumbing -------------------------------------------------------------------------------------
    def _epoch_shares(self) -> list[dict]:
        """This epoch's share list: permuted per epoch when shuffling, else in file order."""
        assert self.shares is not None
        if not self.shuffle:
            return sorted(self.shares, key=lambda s: (s["piece"]["path"], s["piece"]["start"], s["piece"]["row_group"]))
        perm = np.random.default_rng([self.seed, self.epoch, self.slot, 7]).permutation(len(self.shares))
        return [self.shares[i] for i in perm]

    def _build(self):
        import datasets

        if self.shares is not None:
            order_seed = int(np.random.default_rng([self.seed, self.epoch, 11]).integers(2**31)) if self.shuffle else -1
            shares = [{**share, "at": i} for i, share in enumerate(self._epoch_shares())]
            # an object store's pieces are fetched ahead of the reader (a local file's page cache does that)
            remote = any(is_url(share["piece"]["path"]) for share in shares)
            ahead = ReadAhead([share["piece"] for share in shares],
                              partial(piece_read_ranges, text_field=self.source.text_field,
                                      txt_documents=self.source.txt_documents, retry=self.retry),
                              retry=self.retry) if remote else None
            ds = datasets.IterableDataset.from_generator(
                _generate_records,
                gen_kwargs={
                    "shares": shares,
                    "text_field": self.source.text_field,
                    "txt_documents": self.source.txt_documents,
                    "max_bytes": self.max_document_bytes,
                    "order_seed": order_seed,
                    "ahead": ahead,
                    "retry": self.retry,
                },
            )
        else:
            from datasets.distributed import split_dataset_by_node

            path, kwargs = hub_load_args(self.source)  # what the preflight resolved (albert_dist.data.sources.hub)
            ds = datasets.load_dataset(path, **kwargs, streaming=True)
            strategy = "shards" if ds.num_shards >= self.num_slots else "examples"
            ds = split_dataset_by_node(ds, rank=self.slot, world_size=self.num_slots, strategy=strategy)
        if self._resume_ds_state is not None:
            ds.load_state_dict(self._resume_ds_state)
            self._resume_ds_state = None
        self._ds = ds
        # .iter() rather than iter(ds): datasets would otherwise split shards again inside a DataLoader worker,
        # but our slots already account for the workers.
        self._it = ds.iter(batch_size=1)

    def _record(self, raw: dict) -> dict:
        if self.shares is not None:
            return {k: v[0] for k, v in raw.items()}
        value = raw.get(self.source.text_field, [None])[0]
        if not isinstance(value, str):
            return {"text": "", "skip": "missing_field", "nbytes": 0}
        nbytes = len(value.encode("utf-8"))
        if nbytes > self.max_document_bytes:
            return {"text": "", "skip": "too_long", "nbytes": nbytes}
        text = value.strip()
        return {"text": text, "skip": "" if text else "empty", "nbytes": nbytes}

    # -- public API --------------------------------------------------------------------------------------------
    def next_document(self) -> tuple[str, tuple[int, int]]:
        """Next usable document text of this slot and its key ``(epoch, index in epoch)``."""
        while True:
            if self._it is None:
                self._build()
            try:
                raw = next(self._it)
            except StopIteration:
                self._end_epoch()
                continue
            rec = self._record(raw)
            self.records_in_epoch += 1
            self.counters["bytes"] += rec["nbytes"]
            if rec["skip"]:
                self._count_skip(rec)
                continue
            key = (self.epoch, self.docs_in_epoch)
            self.docs_in_epoch += 1
            self.counters["documents"] += 1
            if self.counters["documents"] % _LOG_EVERY_DOCUMENTS == 0:
                logger.info("%s slot %d/%d: %d documents, %d bytes read so far, skipped %s", self.where, self.slot,
                            self.num_slots, self.counters["documents"], self.counters["bytes"],
                            {k: v for k, v in self.counters.items() if k.startswith("skipped_")} or "none")
            return rec["text"], key

    def _count_skip(self, rec: dict) -> None:
        name = f"skipped_{rec['skip']}"
        self.counters[name] += 1
        # the first few of each kind loudly (with file:line), the rest in the epoch and periodic summaries
        if self.counters[name] > _LOUD_SKIPS:
            logger.debug("%s slot %d: skipped a record (%s, %d bytes, record %d of epoch %d)", self.where,
                         self.slot, rec["skip"], rec["nbytes"], self.records_in_epoch - 1, self.epoch)
        elif rec["skip"] == "damaged":
            logger.warning("%s slot %d: skipped the rest of a piece from %s: %s (%d damaged pieces so far)",
                           self.where, self.slot, self._location(rec), rec.get("detail", ""), self.counters[name])
        else:
            logger.warning("%s slot %d: skipped the record at %s (%s, %d bytes; %d such so far)", self.where,
                           self.slot, self._location(rec), rec["skip"], rec["nbytes"], self.counters[name])

    def _location(self, rec: dict) -> str:
        """Where a record is: file:line (local sources), else its number in this slot's epoch (hub)."""
        path = rec.get("path")
        if not path:
            return f"record {self.records_in_epoch - 1} of epoch {self.epoch} of {self.source.paths[0]}"
        piece = next(p for p in self.pieces if p["path"] == path)  # its format, as the plan found it
        return record_location(piece["kind"], piece["compression"], path, int(rec["pos"]), int(rec.get("group", -1)))

    def _end_epoch(self) -> None:
        skipped = {k: v for k, v in self.counters.items() if k.startswith("skipped_")}
        logger.info(
            "%s slot %d/%d: epoch %d done: %d documents, %d records; totals %d documents, %d bytes, skipped %s",
            self.where, self.slot, self.num_slots, self.epoch, self.docs_in_epoch, self.records_in_epoch,
            self.counters["documents"], self.counters["bytes"], skipped or "none",
        )
        if self.docs_in_epoch == 0:
            raise ValueError(
                f"{self.where}: slot {self.slot} of {self.num_slots} (rank x num_workers + worker) got no usable "
                f"document in a whole epoch ({self.records_in_epoch} records, skipped {skipped or 'none'}); "
                "the source is empty or too small for this many ranks x workers"
            )
        # one document in this slot's share: the loader warns once how often it repeats (it knows the batches)
        self.single_document = self.docs_in_epoch == 1
        self.epoch += 1
        self.docs_in_epoch = 0
        self.records_in_epoch = 0
        self._it = None

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: epoch, documents/records read in it, the datasets state and the counters."""
        ds_state = self._ds.state_dict() if self._it is not None else self._resume_ds_state
        return {
            "epoch": self.epoch,
            "docs_in_epoch": self.docs_in_epoch,
            "records_in_epoch": self.records_in_epoch,
            "datasets": ds_state,
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the position ``state`` was taken at (same slots and pieces required)."""
        self.epoch = int(state["epoch"])
        self.docs_in_epoch = int(state["docs_in_epoch"])
        self.records_in_epoch = int(state["records_in_epoch"])
        self.counters = Counter(state["counters"])
        self._resume_ds_state = state["datasets"]
        self._ds, self._it = None, None


def iter_texts(sources: list[SourceConfig], where: str, max_document_bytes: int,
               counters: Optional[Counter] = None, retry: RetryPolicy = DEFAULT_RETRY) -> Iterator[str]:
    """Every usable document text of local sources in file order (single process; for tokenizer training and
    token counts). Skipped records are counted in ``counters`` (``skipped_<reason>``, plus ``documents``) when
    given; damaged pieces are logged as warnings with their file and position. An object store is read under
    ``retry``.

    Raises ValueError for a hub source and as `pieces_of` does.
    """
    counters = Counter() if counters is None else counters
    for i, source in enumerate(sources):
        if source.format == "hub":
            raise ValueError(f"{where}[{i}]: hub sources are not supported here, got {source.paths!r}")
        pieces = pieces_of(source, f"{where}[{i}]", 1 << 62, require_pieces=False, retry=retry)
        for piece in sorted(pieces, key=lambda pc: (pc["path"], pc["start"], pc["row_group"])):
            for rec in read_piece(piece, source.text_field, source.txt_documents, max_document_bytes, retry=retry):
                if not rec["skip"]:
                    counters["documents"] += 1
                    yield rec["text"]
                    continue
                counters[f"skipped_{rec['skip']}"] += 1
                if rec["skip"] == "damaged":
                    location = record_location(piece["kind"], piece["compression"], piece["path"], rec["pos"],
                                               piece["row_group"])
                    logger.warning("%s[%d]: skipped the rest of %s: %s", where, i, location, rec["detail"])
