"""What the benchmarks share: a synthetic ALBERT pretraining batch, min / median / max of repeats, local gloo
ranks, CPU-time measurement of a code snippet with ``torch.utils.benchmark``, and the one way a script writes its
figures into a doc (`write_block`).

Not a benchmark (the leading underscore keeps bench/run_all.py from running it); import it as ``_common``
(bench/ is on the path of a benchmark the suite runs, and of ``python bench/<name>.py``).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from albert_dist.distributed.local_ranks import local_rank_env, spawn_local_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from doc_blocks import write_block  # noqa: E402,F401 - its home is tools/doc_blocks.py; benchmarks import it here

if TYPE_CHECKING:
    import torch

# torch is imported where it is used: a benchmark that pins its threads (data_pipeline) imports this first.
__all__ = ["cpu_seconds", "fmt_stats", "local_rank_env", "spawn_local_ranks", "stats", "synthetic_batch",
           "write_block"]


def synthetic_batch(vocab_size: int, batch: int, seq: int, predictions: int, seed: int = 0,
                    padded: bool = False) -> dict[str, "torch.Tensor"]:
    """A random ALBERT pretraining micro-batch, as `albert_dist.model.AlbertForPreTraining` takes it.

    Args:
        vocab_size: ids are drawn from [5, vocab_size) (0-4 are ALBERT's special ids).
        batch, seq: B sequences of S positions.
        predictions: MLM labels per sequence, at random positions after [CLS] (ALBERT's
            max_predictions_per_seq: 20 at S = 128).
        seed: the generator's seed (the same batch for the same arguments).
        padded: right padding as in real batches: lengths S-16..S, the first sequence S/2 long (ALBERT's
            short_seq_prob), pad id 0 with attention mask 0; else every position is a token.

    Returns:
        ``input_ids``, ``attention_mask``, ``token_type_ids`` (segment B from the middle of each sequence),
        ``mlm_labels`` (-100 where there is no prediction): (B, S) int64; ``sop_labels``: (B,) int64 in {0, 1}.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    lengths = torch.full((batch,), seq)
    if padded:
        lengths = torch.randint(seq - 16, seq + 1, (batch,), generator=g)
        lengths[0] = seq // 2
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask  # pad id 0
    token_type_ids = ((torch.arange(seq)[None, :] >= lengths[:, None] // 2) & attention_mask.bool()).long()
    mlm_labels = torch.full((batch, seq), -100)
    for b in range(batch):
        positions = torch.randperm(int(lengths[b]) - 1, generator=g)[:predictions] + 1
        mlm_labels[b, positions] = input_ids[b, positions]
    sop_labels = torch.randint(0, 2, (batch,), generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                mlm_labels=mlm_labels, sop_labels=sop_labels)


def stats(values: Iterable[float]) -> dict[str, float]:
    """``{"min", "median", "max", "n"}`` of the finite values (one per repeat); NaN for each when there are
    none."""
    finite = [float(v) for v in values if v == v and abs(v) != float("inf")]
    if not finite:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan"), "n": 0}
    return {"min": min(finite), "median": statistics.median(finite), "max": max(finite), "n": len(finite)}


def fmt_stats(values: Iterable[float], scale: float = 1.0, digits: int = 3) -> str:
    """``"min / median / max"`` of ``values`` divided by ``scale``, ``digits`` decimals."""
    s = stats(values)
    return " / ".join(f"{s[k] / scale:.{digits}f}" for k in ("min", "median", "max"))


def cpu_seconds(stmt: Callable[[], Any], min_run_time: float = 1.0, threads: Optional[int] = None) -> float:
    """The best (smallest) process CPU time of one ``stmt()`` call, measured by
    ``torch.utils.benchmark.Timer.blocked_autorange`` (warm-up, blocks of calls until ``min_run_time`` CPU
    seconds) with ``time.process_time`` as the timer: on a shared machine other processes stretch wall time,
    not this process's CPU time. ``threads``: torch threads during the measurement (default: the current
    number)."""
    import torch
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="stmt()", globals={"stmt": stmt}, timer=time.process_time,
                            num_threads=threads or torch.get_num_threads())
    return min(timer.blocked_autorange(min_run_time=min_run_time).times)


def checkout_relative(text: str) -> str:
    """`text` with every absolute path inside the checkout written relative to it (``<checkout>/runs/x`` ->
    ``runs/x``): what bench/results records names no machine's folders."""
    return text.replace(str(Path(__file__).resolve().parents[1]) + "/", "")
