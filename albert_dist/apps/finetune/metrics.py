"""GLUE's metrics (Wang et al. 2019, Table 1), computed with scikit-learn and scipy (not `evaluate`, which
fetches metric scripts from the hub): accuracy; F1 of the positive class (MRPC, QQP); Matthews correlation
(CoLA); Pearson and Spearman correlation (STS-B). Values in [0, 1] (correlations in [-1, 1]), not percent.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of (N,) int predictions equal to the (N,) labels (numpy, not scikit-learn: the GPU check scores
    SST-2 on an image without scikit-learn and scipy, ~50 MB of wheels)."""
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Binary F1 of class 1 (GLUE's MRPC/QQP "F1"), 0 when class 1 is never predicted nor present."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def matthews_correlation(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient (CoLA), 0 for a constant prediction."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def _correlation(fn: Callable, predictions: np.ndarray, labels: np.ndarray) -> float:
    # a constant input has no correlation: scipy warns and returns NaN; GLUE counts that as 0 skill
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(fn(predictions, labels)[0])


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Pearson correlation of (N,) float predictions and targets (STS-B); 0 when either is constant."""
    from scipy.stats import pearsonr

    return _correlation(pearsonr, predictions, labels)


def spearmanr(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Spearman rank correlation of (N,) float predictions and targets (STS-B); 0 when either is constant."""
    from scipy.stats import spearmanr as scipy_spearmanr

    return _correlation(scipy_spearmanr, predictions, labels)


#: metric name (as logged: ``downstream/<task>/<name>``) -> function(predictions, labels)
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy, "f1": f1, "matthews_correlation": matthews_correlation,
    "pearson": pearson, "spearmanr": spearmanr}


def compute(names: tuple[str, ...], logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The named metrics of a classifier's (N, C) logits (argmax) or a regressor's (N, 1) / (N,) outputs.

    Raises:
        KeyError: an unknown metric name (a programming error: task specs name known ones).
    """
    logits = np.asarray(logits)
    if logits.ndim == 2 and logits.shape[1] > 1:
        predictions = logits.argmax(-1)
    else:
        predictions = logits.reshape(-1).astype(np.float64)
    labels = np.asarray(labels)
    return {name: METRICS[name](predictions, labels) for name in names}
