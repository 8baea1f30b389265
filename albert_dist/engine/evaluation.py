"""Evaluation on the fixed validation set (albert_dist.data.validation), identical for every world size.

Every rank builds the same set and runs its contiguous slice; per rank the *sums* (MLM loss x predictions,
correct predictions, predictions, and the same for SOP) are accumulated in float64 and one ``all_reduce`` adds
them, so the figures are those of the whole set whatever the world size (up to float summation order). Metric
names live here (``metric_names``), in one place for the trainer, the console and the trackers.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from albert_dist.data.config import DataConfig
from albert_dist.engine import metric_names as _names
from albert_dist.data.validation import ValidationSet, build_validation_set, token_counts, unigram_baseline
from albert_dist.distributed.collectives import is_multi_rank

logger = logging.getLogger(__name__)

#: Prefix of every validation metric (albert_dist.engine.metric_names: one section in the MLflow UI).
PREFIX = _names.VAL
#: Metrics of every evaluation, in console order.
EVAL_KEYS = ("loss", "mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy", "mlm_accuracy_over_unigram")
#: Metrics logged once, at the first evaluation: the set's size and its unigram baseline.
ONCE_KEYS = ("unigram_mlm_accuracy", "unigram_mlm_loss", "masked_tokens", "sop_pairs")


def metric_names(keys=EVAL_KEYS + ONCE_KEYS) -> dict[str, str]:
    """``{key: logged name}`` of the validation metrics (``val/`` + key)."""
    return {k: PREFIX + k for k in keys}


class Evaluator:
    """The fixed validation set of ``cfg`` and this rank's share of it, built once per job.

    ``baseline`` (rank 0 only, when the training sources are local): ``unigram_mlm_accuracy``,
    ``unigram_mlm_loss``, ``unigram_token`` of the whole set (albert_dist.data.validation.unigram_baseline).
    Raises ValueError like :func:`albert_dist.data.validation.build_validation_set`.
    """

    def __init__(self, cfg: DataConfig, micro_batch_size: int, rank: int, world_size: int,
                 device: torch.device, sp=None) -> None:
        from albert_dist.data.tokenizer import load_tokenizer

        sp = sp if sp is not None else load_tokenizer(cfg.tokenizer_path)
        self.set: ValidationSet = build_validation_set(cfg, sp)
        self.device, self.world_size = device, world_size
        self.batches = self.set.rank_batches(rank, world_size, micro_batch_size)
        self.passes = self.set.forward_passes(world_size, micro_batch_size)
        self.baseline: Optional[dict[str, float]] = None
        if rank == 0:
            if not self.set.complete:  # every rank builds the same set: one warning per job, not per rank
                logger.warning("data.validation: one pass over the sources gives %d examples < data.eval_examples="
                               "%d; the validation set is all of them (%d masked tokens)", len(self.set),
                               cfg.eval_examples, self.set.masked_tokens)
            probs = token_counts(cfg, sp)
            if probs is not None:
                self.baseline = unigram_baseline(self.set.batch["mlm_labels"], probs)
            logger.info("validation set: %d examples (%d SOP pairs, %d masked tokens) from %d documents, %d rows "
                        "per rank; unigram baseline %s", len(self.set), self.set.sop_pairs, self.set.masked_tokens,
                        self.set.documents, len(self.set) // world_size,
                        "n/a (no local training source)" if self.baseline is None else
                        f"accuracy {self.baseline['unigram_mlm_accuracy']:.4f}, loss "
                        f"{self.baseline['unigram_mlm_loss']:.4f} (always id {int(self.baseline['unigram_token'])}"
                        f" {sp.id_to_piece(int(self.baseline['unigram_token']))!r})")

    def once_metrics(self) -> dict[str, float]:
        """The metrics logged once (named by ``metric_names``): set size and, when known, the unigram baseline."""
        keys = {"masked_tokens": float(self.set.masked_tokens), "sop_pairs": float(self.set.sop_pairs)}
        if self.baseline is not None:
            keys |= {k: self.baseline[k] for k in ("unigram_mlm_accuracy", "unigram_mlm_loss")}
        names = metric_names()
        return {names[k]: v for k, v in keys.items()}

    def sums(self, model: Callable[..., Any]) -> torch.Tensor:
        """(6,) float64 on this rank, summed over ranks: MLM loss x count, MLM correct, MLM count, SOP loss x
        count, SOP correct, SOP count. ``model(**batch)`` returns a ``PreTrainingOutput``. Collective."""
        sums = torch.zeros(6, dtype=torch.float64, device=self.device)
        # A rank with fewer rows repeats its first batch (or the set's first row) and drops the result.
        spare = self.batches[0] if self.batches else {k: v[:1] for k, v in self.set.batch.items()}
        for j in range(self.passes):
            batch = self.batches[j] if j < len(self.batches) else spare
            out = model(**{k: v.to(self.device, non_blocking=True) for k, v in batch.items()})
            if j >= len(self.batches):
                continue
            mlm_n, sop_n = out.mlm_count.double(), out.sop_count.double()
            sums += torch.stack([out.mlm_loss.detach().double() * mlm_n, out.mlm_correct.double(), mlm_n,
                                 out.sop_loss.detach().double() * sop_n, out.sop_correct.double(), sop_n])
        if is_multi_rank():
            dist.all_reduce(sums)
        return sums

    def evaluate(self, model: Callable[..., Any]) -> dict[str, float]:
        """One evaluation (collective): loss (= mlm_loss + sop_loss), mlm_loss (mean over masked tokens, nats),
        sop_loss (mean over pairs), mlm_accuracy, sop_accuracy and, when the baseline is known (rank 0),
        mlm_accuracy_over_unigram = mlm_accuracy / unigram_mlm_accuracy; keys named by ``metric_names``."""
        mlm_loss, mlm_correct, mlm_n, sop_loss, sop_correct, sop_n = self.sums(model).tolist()
        record = {"mlm_loss": mlm_loss / max(mlm_n, 1.0), "sop_loss": sop_loss / max(sop_n, 1.0),
                  "mlm_accuracy": mlm_correct / max(mlm_n, 1.0), "sop_accuracy": sop_correct / max(sop_n, 1.0)}
        record["loss"] = record["mlm_loss"] + record["sop_loss"]
        if self.baseline is not None and self.baseline["unigram_mlm_accuracy"] > 0:
            record["mlm_accuracy_over_unigram"] = record["mlm_accuracy"] / self.baseline["unigram_mlm_accuracy"]
        names = metric_names()
        return {names[k]: record[k] for k in EVAL_KEYS if k in record}
