"""Every metric name the trainer logs, in one place (torch-free: compare, bench and tests import it).

Names are grouped by a ``<section>/`` prefix, which the MLflow UI turns into one chart section each and
which sorts the same way in ``metrics.jsonl`` and in `albert-dist compare`:

    train/  loss, mlm_loss, sop_loss, mlm_accuracy, sop_accuracy, sop_weight, grad_norm, lr, skipped_steps
                                                            (every log_interval_steps); rollbacks,
            rollback_from_step, rollback_skipped_batch_first/last (at a divergence rollback)
    val/    loss, mlm_loss, sop_loss, mlm_accuracy, sop_accuracy, mlm_accuracy_over_unigram
                                                            (every eval_interval_steps; the fixed set's
            unigram_mlm_accuracy, unigram_mlm_loss, masked_tokens, sop_pairs once)
    perf/   tokens_per_s, samples_per_s, positions_per_s, mfu, mfu_measured_peak, data_wait_s, data_wait_share,
            step_time_s_max, step_time_s_median, slowest_rank, data_wait_s_max, data_wait_s_median,
            data_wait_slowest_rank                          (stragglers: albert_dist.engine.stragglers)
    mem/    peak_gib_max, peak_gib_min, peak_gib_rank<r> (only up to MAX_PER_RANK_SERIES ranks)
    system/ CPU, RAM, disk, network, GPU: MLflow's own SystemMetricsMonitor (not logged by the trainer)
    downstream/<task>/<metric>   median dev score over seeds at the scored checkpoint's step
                                                            (`albert-dist finetune`, albert_dist.apps.finetune)

A new metric gets its name here (and, when "best" means something for it, an entry in `BEST`), so that
`compare`, the docs and the tests read one definition.
"""
from __future__ import annotations

from typing import Optional

TRAIN, VAL, PERF, MEM = "train/", "val/", "perf/", "mem/"
DOWNSTREAM = "downstream/"

#: Quantities the MetricAccumulator computes for training and validation alike.
LOSS, MLM_LOSS, SOP_LOSS = "loss", "mlm_loss", "sop_loss"
MLM_ACCURACY, SOP_ACCURACY = "mlm_accuracy", "sop_accuracy"
EVAL_QUANTITIES = (LOSS, MLM_LOSS, SOP_LOSS, MLM_ACCURACY, SOP_ACCURACY)

TRAIN_LOSS, TRAIN_MLM_LOSS, TRAIN_SOP_LOSS = (TRAIN + q for q in (LOSS, MLM_LOSS, SOP_LOSS))
TRAIN_MLM_ACCURACY, TRAIN_SOP_ACCURACY = TRAIN + MLM_ACCURACY, TRAIN + SOP_ACCURACY
TRAIN_SOP_WEIGHT = TRAIN + "sop_weight"
"""Weight of the SOP loss in this step's backward (albert_dist.engine.objective)."""
TRAIN_GRAD_NORM = TRAIN + "grad_norm"
"""Global gradient norm before clipping, mean over the interval's steps."""
TRAIN_LR = TRAIN + "lr"
"""Learning rate the step's update used."""
TRAIN_SKIPPED_STEPS = TRAIN + "skipped_steps"
"""Optimizer steps DeepSpeed skipped so far (inf/NaN gradients: no update, no lr-schedule step), cumulative."""
TRAIN_ROLLBACKS = TRAIN + "rollbacks"
"""Divergence rollbacks of the job so far (albert_dist.engine.divergence), logged at each rollback, at the step
training goes on from (the checkpoint's)."""
TRAIN_ROLLBACK_FROM_STEP = TRAIN + "rollback_from_step"
"""The first flagged step of the divergence that rollback undid."""
TRAIN_ROLLBACK_SKIPPED_FIRST = TRAIN + "rollback_skipped_batch_first"
TRAIN_ROLLBACK_SKIPPED_LAST = TRAIN + "rollback_skipped_batch_last"
"""The micro-batches of rank 0's training stream the rollback skipped (1-based, first..last, inclusive)."""
VAL_LOSS, VAL_MLM_LOSS, VAL_SOP_LOSS = (VAL + q for q in (LOSS, MLM_LOSS, SOP_LOSS))
VAL_MLM_ACCURACY, VAL_SOP_ACCURACY = VAL + MLM_ACCURACY, VAL + SOP_ACCURACY
VAL_MLM_ACCURACY_OVER_UNIGRAM = VAL + "mlm_accuracy_over_unigram"
"""val/mlm_accuracy divided by the fixed validation set's unigram baseline (albert_dist.engine.evaluation)."""
#: Logged once, at the first evaluation: the validation set's size and unigram baseline (constants of a run).
VAL_ONCE = tuple(VAL + k for k in ("unigram_mlm_accuracy", "unigram_mlm_loss", "masked_tokens", "sop_pairs"))
PERF_TOKENS_PER_S = PERF + "tokens_per_s"
"""Non-padding tokens per second, all ranks."""
PERF_SAMPLES_PER_S = PERF + "samples_per_s"
PERF_POSITIONS_PER_S = PERF + "positions_per_s"
"""Padded sequence positions per second, all ranks (what the FLOPs count)."""
PERF_MFU = PERF + "mfu"
"""Model FLOPs utilisation against the datasheet peak (albert_dist.engine.metrics.mfu, Peaks.datasheet); not
logged on a device without one (a CPU) unless engine.peak_tflops_per_device gives it."""
PERF_MFU_MEASURED_PEAK = PERF + "mfu_measured_peak"
"""Model FLOPs utilisation against the dense matmul peak measured at start-up (Peaks.measured)."""
PERF_DATA_WAIT_S = PERF + "data_wait_s"
"""Seconds a step waited for its micro-batches (host clock), mean over the interval's steps and the ranks."""
PERF_DATA_WAIT_SHARE = PERF + "data_wait_share"
"""That wait's share of the interval's training time (0-1; evaluation and checkpoints excluded)."""
PERF_STEP_TIME_S_MAX, PERF_STEP_TIME_S_MEDIAN = PERF + "step_time_s_max", PERF + "step_time_s_median"
"""A rank's own busy seconds per step (data wait + compute it did not spend waiting for the others; mean over the
interval's steps): the largest over ranks, and the median (albert_dist.engine.stragglers)."""
PERF_SLOWEST_RANK = PERF + "slowest_rank"
"""The global rank whose step time is PERF_STEP_TIME_S_MAX (the lowest such rank on a tie)."""
PERF_DATA_WAIT_S_MAX, PERF_DATA_WAIT_S_MEDIAN = PERF + "data_wait_s_max", PERF + "data_wait_s_median"
"""A rank's data wait per step (host clock, mean over the interval's steps): the largest over ranks, the median."""
PERF_DATA_WAIT_SLOWEST_RANK = PERF + "data_wait_slowest_rank"
"""The global rank whose data wait is PERF_DATA_WAIT_S_MAX."""
MEM_PEAK_GIB_MAX, MEM_PEAK_GIB_MIN = MEM + "peak_gib_max", MEM + "peak_gib_min"
"""Peak memory (GiB) of the rank that used most / least (CUDA: max allocated; CPU: peak RSS)."""
#: One series per rank only up to this many ranks (a chart per rank is unreadable beyond); min/max always.
MAX_PER_RANK_SERIES = 8


def mem_peak_rank(rank: int) -> str:
    """Peak memory (GiB) of one global rank."""
    return f"{MEM}peak_gib_rank{int(rank)}"


#: Metrics for which "best" means something, and which direction: losses fall, accuracies and throughput rise.
#: Everything else (lr, grad norm, memory, system/) has final values only.
BEST: dict[str, Optional[str]] = {
    **{name: "min" for name in (TRAIN_LOSS, TRAIN_MLM_LOSS, TRAIN_SOP_LOSS, VAL_LOSS, VAL_MLM_LOSS, VAL_SOP_LOSS,
                                PERF_DATA_WAIT_S, PERF_DATA_WAIT_SHARE, PERF_STEP_TIME_S_MAX, PERF_STEP_TIME_S_MEDIAN,
                                PERF_DATA_WAIT_S_MAX, PERF_DATA_WAIT_S_MEDIAN)},
    **{name: "max" for name in (TRAIN_MLM_ACCURACY, TRAIN_SOP_ACCURACY, VAL_MLM_ACCURACY, VAL_SOP_ACCURACY,
                                VAL_MLM_ACCURACY_OVER_UNIGRAM, PERF_TOKENS_PER_S, PERF_SAMPLES_PER_S,
                                PERF_POSITIONS_PER_S, PERF_MFU, PERF_MFU_MEASURED_PEAK)},
    **{name: None for name in VAL_ONCE + (TRAIN_SOP_WEIGHT, TRAIN_SKIPPED_STEPS, PERF_SLOWEST_RANK,
                                          PERF_DATA_WAIT_SLOWEST_RANK, TRAIN_ROLLBACKS,
                                          TRAIN_ROLLBACK_FROM_STEP, TRAIN_ROLLBACK_SKIPPED_FIRST,
                                          TRAIN_ROLLBACK_SKIPPED_LAST)},
}

#: What `albert-dist compare` plots by default (one panel each; val/ drawn in the train/ panel, with markers).
DEFAULT_CURVES = (LOSS, MLM_ACCURACY)


def best_direction(name: str) -> Optional[str]:
    """``"min"``, ``"max"`` or None (no meaningful best) for a metric name; unregistered names ending in
    ``loss`` / ``accuracy`` / ``_per_s`` follow the rule of their kind."""
    if name in BEST:
        return BEST[name]
    if name.startswith(DOWNSTREAM):  # every GLUE metric (accuracy, F1, Matthews, Pearson, Spearman) rises
        return "max"
    last = name.rsplit("/", 1)[-1]
    if last.endswith("loss"):
        return "min"
    if "accuracy" in last or last.endswith("_per_s"):
        return "max"
    return None
