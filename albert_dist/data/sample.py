"""A byte-budgeted sample of documents drawn from every file of local sources (tokenizer training, estimates).

Why a byte budget: whatever reads the sample holds it in memory, and its cost grows with the *bytes* held, not
with a line count. sentencepiece's unigram trainer builds a suffix array over every character of its sample
(``MakeSeedSentencePieces``: the characters as char32 plus int32 index arrays): measured ~22 bytes of peak RSS
per byte of ASCII sample (docs/data-tokenizer.md). A cap of N sentences (its ``input_sentence_size``) bounds nothing when
sentences are long; a byte cap bounds the trainer's memory for any corpus.

How the budget is spread: every file gets a quota proportional to its estimated text bytes (its size for
uncompressed files, the text column's uncompressed bytes for parquet, size x a measured decompression ratio for
.gz/.zst), so the sample covers every file and every part of the corpus in proportion. Inside a file:

* uncompressed .txt/.jsonl: the quota is read as up to `MAX_WINDOWS` windows at evenly spaced offsets (a seek
  each; a window starts at the first record that begins at or after its offset, the byte-range rule of
  :func:`albert_dist.data.sources.read.split_records`), so a 10 GB file costs its quota in reading, not 10 GB;
* parquet: evenly spaced row groups, read until the quota is met;
* .gz/.zst: not seekable, so the quota is the file's *prefix*. The alternative, reservoir sampling over the whole
  stream, would decompress the entire corpus (hours at 1 TB) to gain an unbiased position inside each file;
  corpora ship as many shards of shuffled documents, where a prefix of every shard is a fair sample. A corpus of
  a few large compressed files with ordered content should be resharded with ``albert-dist data prepare``
  first (its parquet row groups are then sampled evenly).

The sample is deterministic (no randomness: evenly spaced windows), the sum of the texts it yields never exceeds
the budget (the last document of a quota is cut at the quota), and records that cannot be read are skipped and
counted like in training. A file that cannot be read to its quota (a truncated .gz, a corrupt row group) is
logged with its name and skipped from there.
"""
from __future__ import annotations

import logging
import math
import os
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.read import check_text_field, read_piece
from albert_dist.data.sources import store
from albert_dist.data.sources.discover import CorpusFile, find_files
from albert_dist.sizes import fmt_bytes

logger = logging.getLogger(__name__)

#: Most windows (seek positions) per uncompressed file, and the smallest window worth a seek.
MAX_WINDOWS = 64
MIN_WINDOW_BYTES = 16 * 1024
#: Smallest read of a window of a local file and of an object-store file (a request each).
MIN_READ_BYTES, URL_MIN_READ_BYTES = 4 * 1024, 64 * 1024
#: Compression ratio estimate: up to this many files per compression, this many compressed bytes each.
RATIO_PROBE_FILES = 8
RATIO_PROBE_BYTES = 256 * 1024
#: Text-to-compressed ratio assumed when no probe could be decompressed (typical of zstd/gzip on text).
DEFAULT_RATIO = 3.5


@dataclass
class FileQuota:
    """One file of the sample: its format, estimated text bytes and quota (bytes of text to take)."""

    path: str
    kind: str
    compression: str
    text_field: str
    txt_documents: str
    size_bytes: int
    est_text_bytes: float
    quota_bytes: int = 0
    #: the file as its source's files were found (format, size, version, parquet footer: read once)
    file: Optional[CorpusFile] = field(default=None, repr=False)


@dataclass
class ByteBudgetSample:
    """Plan and iterate a sample of at most ``budget_bytes`` of document text (UTF-8) over local sources.

    ``plan`` (built on construction, reading only metadata and a few compressed probes) lists every file with
    its quota. Iterating yields document texts (str); afterwards ``taken`` holds the text bytes taken per file,
    ``documents`` the documents yielded and ``skipped`` the skip counts by reason (including ``damaged``
    for a file whose rest could not be read). Raises ValueError (naming ``where``) when a path is missing, a source is
    a hub dataset or ``budget_bytes`` < 1.
    """

    sources: list[SourceConfig]
    where: str
    budget_bytes: int
    max_document_bytes: int = 1 << 30
    plan: list[FileQuota] = field(init=False)
    taken: Counter = field(init=False, default_factory=Counter)
    documents: int = field(init=False, default=0)
    skipped: Counter = field(init=False, default_factory=Counter)

    def __post_init__(self) -> None:
        if self.budget_bytes < 1:
            raise ValueError(f"{self.where}: the sample budget must be >= 1 byte, got {self.budget_bytes}")
        self.plan = []
        for i, source in enumerate(self.sources):
            where = f"{self.where}[{i}]"
            if source.format == "hub":
                raise ValueError(f"{where}: hub sources are not supported here, got {source.paths!r}")
            files = find_files(source, where)
            check_text_field(source, where, files)
            for f in files:
                self.plan.append(FileQuota(f.path, f.kind, f.compression, source.text_field, source.txt_documents,
                                           f.size, 0.0, file=f))
        ratios = _compression_ratios([p for p in self.plan if p.compression])
        for p in self.plan:
            try:
                p.est_text_bytes = _estimate_text_bytes(p, ratios)
            except Exception as err:  # noqa: BLE001 - a parquet footer that does not parse: skip the file
                self.skipped["damaged"] += 1
                logger.warning("%s: skipping %s: not a readable parquet file (%s: %s)", self.where, p.path,
                               type(err).__name__, err)
        total = sum(p.est_text_bytes for p in self.plan)
        for p in self.plan:
            # a proportional share of the budget (>= 1 byte: every file counts); when the corpus is smaller than
            # the budget the share exceeds the file's estimate, so an underestimated .gz/.zst is still read whole
            share = self.budget_bytes * p.est_text_bytes / total if total else 0
            p.quota_bytes = max(1, int(share)) if p.est_text_bytes > 0 else 0
        # flooring keeps the sum <= budget, the max(1, .) of tiny files may not: trim the largest quotas
        excess = sum(p.quota_bytes for p in self.plan) - self.budget_bytes
        for p in sorted(self.plan, key=lambda q: -q.quota_bytes):
            if excess <= 0:
                break
            cut = min(excess, p.quota_bytes - 1)
            p.quota_bytes -= cut
            excess -= cut

    @property
    def input_bytes(self) -> int:
        """On-disk bytes of every planned file."""
        return sum(p.size_bytes for p in self.plan)

    @property
    def est_text_bytes(self) -> float:
        """Estimated text bytes of the whole corpus (decompressed, parquet text column uncompressed)."""
        return sum(p.est_text_bytes for p in self.plan)

    def __iter__(self) -> Iterator[str]:
        for p in self.plan:
            if p.quota_bytes > 0:
                yield from self._file(p)

    def _file(self, p: FileQuota) -> Iterator[str]:
        windows = _windows(p)
        left = p.quota_bytes
        for w, piece in enumerate(windows):
            # a window's share of what is left, so a short window passes its unused quota on to the next ones
            want = math.ceil(left / (len(windows) - w))
            got = 0
            records = read_piece(piece, p.text_field, p.txt_documents, self.max_document_bytes)
            try:
                for rec in records:
                    if rec["skip"] == "damaged":  # the reader's marker: the rest of this piece cannot be read
                        # only this window is lost (one parquet row group, or the rest of a compressed stream,
                        # which is its file's only window): its unused quota passes to the next windows, as
                        # prepare and training skip just the damaged row group
                        self.skipped["damaged"] += 1
                        where = f"row group {piece['row_group']} of " if piece["row_group"] >= 0 else ""
                        logger.warning("%s: skipped the rest of %s%s after %d bytes of its window: %s", self.where,
                                       where, p.path, got, rec.get("detail") or "damaged")
                        break
                    if rec["skip"]:
                        self.skipped[rec["skip"]] += 1
                        continue
                    text = rec["text"]
                    nbytes = len(text.encode("utf-8"))
                    if nbytes > want - got:  # cut the last document at the quota (at a character boundary)
                        text = text.encode("utf-8")[: want - got].decode("utf-8", errors="ignore")
                        nbytes = len(text.encode("utf-8"))
                    if text:
                        got += nbytes
                        self.documents += 1
                        yield text
                    if got >= want:
                        break
            finally:
                records.close()
            left -= got
            self.taken[p.path] += got


def _windows(p: FileQuota) -> list[dict]:
    """The pieces (see paths.cut_pieces) a file's quota is read from, evenly spread over the file."""
    base = {"path": p.path, "kind": p.kind, "compression": p.compression, "row_group": -1,
            **({"file_bytes": p.file.size, "version": p.file.version} if p.file else {})}
    if p.kind == "parquet":
        groups = p.file.footer().num_row_groups
        # enough row groups to hold the quota (plus one: the estimate counts offsets and page headers too),
        # and up to MAX_WINDOWS of them to spread it
        needed = math.ceil(p.quota_bytes * groups / p.est_text_bytes) + 1 if p.est_text_bytes else groups
        n = max(1, min(groups, max(needed, min(MAX_WINDOWS, math.ceil(p.quota_bytes / MIN_WINDOW_BYTES)))))
        picks = sorted({(i * groups) // n for i in range(n)})
        return [{**base, "start": 0, "end": p.size_bytes, "row_group": g, "nbytes": 0} for g in picks]
    if p.compression or (p.kind == "txt" and p.txt_documents == "file") or p.quota_bytes >= p.size_bytes:
        return [{**base, "start": 0, "end": p.size_bytes, "nbytes": p.size_bytes}]
    n = max(1, min(MAX_WINDOWS, p.quota_bytes // MIN_WINDOW_BYTES))
    bounds = [(i * p.size_bytes) // n for i in range(n + 1)]
    # a window spans its whole stripe (so a stripe of short or skipped records still fills its share) but takes
    # only ~quota/n bytes of it: reads of half that size keep what is read near what is taken (reads of the
    # stripe's size read the whole corpus: 33x the sample's text at 64 MB). From an object store each read is a
    # request, so reads are at least 64 KiB there: about one request per window, as before, for 1/16 of the bytes
    # (bench/object_cache.py counts both). The windows, and so the sample, are the same wherever the file is.
    floor = URL_MIN_READ_BYTES if store.is_url(p.path) else MIN_READ_BYTES
    read_bytes = max(floor, min(1 << 20, p.quota_bytes // (2 * n)))
    return [{**base, "start": s, "end": e, "nbytes": e - s, "read_bytes": read_bytes}
            for s, e in zip(bounds, bounds[1:]) if e > s]


def _estimate_text_bytes(p: FileQuota, ratios: dict[str, float]) -> float:
    if p.size_bytes == 0:
        return 0.0
    if p.kind == "parquet":
        meta = p.file.footer()
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        col = names.index(p.text_field) if p.text_field in names else None
        return float(sum(meta.row_group(g).column(col).total_uncompressed_size if col is not None
                         else meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)))
    return p.size_bytes * ratios.get(p.compression, 1.0)


def _compression_ratios(plans: list[FileQuota]) -> dict[str, float]:
    """Decompressed / compressed bytes per compression, from the first RATIO_PROBE_BYTES of a few spread files."""
    ratios: dict[str, float] = {}
    for compression in sorted({p.compression for p in plans}):
        files = [p for p in plans if p.compression == compression and p.size_bytes > 0]
        step = max(1, len(files) // RATIO_PROBE_FILES)
        raw = out = 0
        for p in files[::step][:RATIO_PROBE_FILES]:
            with store.open_input(p.path) as f:
                data = f.read(RATIO_PROBE_BYTES)
            try:
                if compression == ".gz":
                    produced = len(zlib.decompressobj(wbits=31).decompress(data))
                else:
                    import zstandard

                    produced = len(zstandard.ZstdDecompressor().decompressobj().decompress(data))
            except Exception as err:  # noqa: BLE001 - a probe that fails only loses this estimate
                logger.debug("compression ratio probe of %s failed: %s", p.path, err)
                continue
            raw, out = raw + len(data), out + produced
        ratios[compression] = out / raw if raw and out else DEFAULT_RATIO
    return ratios


def describe(sample: ByteBudgetSample) -> str:
    """One line for a log: the budget, the corpus it is drawn from and the share."""
    est = sample.est_text_bytes
    share = f"{100 * min(1.0, sample.budget_bytes / est):.1f}% of" if est else "of"
    return (f"sample budget {fmt_bytes(sample.budget_bytes)} of text, {share} ~{fmt_bytes(est)} in {len(sample.plan)} files "
            f"({fmt_bytes(sample.input_bytes)} on disk)")
