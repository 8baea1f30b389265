"""What `albert-dist data prepare` does (`PrepareOptions`) and how it sizes the output (`shard_sizes`).

Sizing: ``row_group_bytes = clamp(text_bytes / (ROW_GROUPS_PER_SLOT x slots), MIN_ROW_GROUP_BYTES,
MAX_ROW_GROUP_BYTES)`` with slots = ``--target-ranks x --target-loader-workers``; files hold
`ROW_GROUPS_PER_SHARD` row groups unless ``--num-shards`` or ``--shard-bytes`` says otherwise (the reasons:
`albert_dist.data.prepare.run`'s docstring).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Optional

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.sizes import fmt_bytes

#: Bumped when the output layout or the manifest's meaning changes.
FORMAT_VERSION = 1
#: Row-group sizing (see the module docstring and docs/data-prepare.md).
ROW_GROUPS_PER_SLOT = 4
MIN_ROW_GROUP_BYTES = 64 << 10
MAX_ROW_GROUP_BYTES = 4 << 20
ROW_GROUPS_PER_SHARD = 128
DEFAULT_TARGET_RANKS = 1024
DEFAULT_TARGET_LOADER_WORKERS = 8
#: ``--dedup-memory``'s default (`albert_dist.data.prepare.dedup`)
DEFAULT_DEDUP_MEMORY_BYTES = 1 << 30


@dataclass
class PrepareOptions:
    """What `prepare` does. Sizes in bytes of UTF-8 document text; ``None`` = derived by `shard_sizes`."""

    sources: list[SourceConfig]
    output: str
    num_shards: Optional[int] = None
    shard_bytes: Optional[int] = None
    row_group_bytes: Optional[int] = None
    target_ranks: int = DEFAULT_TARGET_RANKS
    target_loader_workers: int = DEFAULT_TARGET_LOADER_WORKERS
    workers: int = 1
    dedup: bool = True
    dedup_memory_bytes: int = DEFAULT_DEDUP_MEMORY_BYTES
    max_document_bytes: int = DataConfig.max_document_bytes
    tokenizer_path: Optional[str] = DataConfig.tokenizer_path
    overwrite: bool = False
    progress: Optional[bool] = None  # None: a progress bar only on a terminal

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("no input: give --input PATH (repeatable) or --config RECIPE")
        for i, s in enumerate(self.sources):
            if s.format == "hub":
                raise ValueError(f"input[{i}]: hub dataset {s.paths[0]!r}: prepare reads local files only "
                                 "(download it first, e.g. huggingface-cli download --repo-type dataset)")
        if not self.output:
            raise ValueError("--output must name a directory")
        if self.num_shards is not None and self.shard_bytes is not None:
            raise ValueError("give --num-shards or --shard-bytes, not both")
        for name in ("num_shards", "shard_bytes", "row_group_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        for name in ("target_ranks", "target_loader_workers", "workers", "dedup_memory_bytes",
                     "max_document_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

    def fingerprint(self, inputs: list[dict]) -> str:
        """Hash of everything the output depends on (inputs with sizes and mtimes, options; not ``workers``)."""
        opts = {k: v for k, v in asdict(self).items() if k not in ("workers", "overwrite", "progress", "output")}
        blob = json.dumps({"format_version": FORMAT_VERSION, "options": opts, "inputs": inputs}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Sizes:
    """Output sizing: shards (files), text bytes per shard, row-group text bytes, and the rule that chose them."""

    num_shards: int
    row_group_bytes: int
    target_slots: int
    rule: str


def shard_sizes(text_bytes: int, documents: int, opts: PrepareOptions) -> Sizes:
    """Shard count and row-group size for ``text_bytes`` of kept text (see the module docstring)."""
    slots = opts.target_ranks * opts.target_loader_workers
    if opts.row_group_bytes is not None:
        rg, rule = opts.row_group_bytes, "--row-group-bytes"
    else:
        per_slot = math.ceil(max(1, text_bytes) / (ROW_GROUPS_PER_SLOT * slots))
        rg = min(MAX_ROW_GROUP_BYTES, max(MIN_ROW_GROUP_BYTES, per_slot))
        rule = (f"row groups: text / ({ROW_GROUPS_PER_SLOT} x {opts.target_ranks} ranks x "
                f"{opts.target_loader_workers} loader workers), within [{fmt_bytes(MIN_ROW_GROUP_BYTES)}, "
                f"{fmt_bytes(MAX_ROW_GROUP_BYTES)}]")
    if opts.num_shards is not None:
        shards, srule = opts.num_shards, "--num-shards"
    elif opts.shard_bytes is not None:
        shards, srule = math.ceil(text_bytes / opts.shard_bytes), "--shard-bytes"
    else:
        shards, srule = math.ceil(text_bytes / (ROW_GROUPS_PER_SHARD * rg)), f"{ROW_GROUPS_PER_SHARD} row groups per file"
    return Sizes(max(1, min(shards, documents)), rg, slots, f"{rule}; files: {srule}")
