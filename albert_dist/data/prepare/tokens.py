"""The token estimate of a `albert-dist data prepare` output (a byte-budgeted sample, encoded as training does)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from albert_dist.data.config import SourceConfig

#: Bytes of output text the token estimate encodes.
TOKEN_SAMPLE_BYTES = 4 << 20


def estimate_tokens(shard_dir: Path, tokenizer_path: Optional[str], text_bytes: int) -> Optional[dict]:
    """Tokens of the output, estimated from a `TOKEN_SAMPLE_BYTES` sample of it spread over every shard and
    encoded as the pretraining pipeline encodes (sentences, then sentencepiece). None without a tokenizer."""
    if not tokenizer_path:
        return None
    from albert_dist.data.sample import ByteBudgetSample
    from albert_dist.data.text import split_sentences
    from albert_dist.data.tokenizer import load_tokenizer

    sp = load_tokenizer(tokenizer_path)
    sample = ByteBudgetSample([SourceConfig(paths=[str(shard_dir / "*.parquet")])], "output", TOKEN_SAMPLE_BYTES)
    tokens = 0
    for text in sample:
        tokens += sum(len(ids) for ids in sp.encode(split_sentences(text)))
    sampled = sum(sample.taken.values())
    if not sampled:
        return None
    from albert_dist.data.sources.discover import resolve_path

    per_byte = tokens / sampled
    return {"tokens": int(round(per_byte * text_bytes)), "tokens_per_byte": round(per_byte, 6),
            "sample_bytes": sampled, "sample_documents": sample.documents,
            "tokenizer": str(resolve_path(tokenizer_path))}
