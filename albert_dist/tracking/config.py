"""Configuration of experiment tracking (MLflow)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrackingConfig:
    """Where and how a job is tracked in MLflow (one run per job, created by global rank 0).

    The retry/backoff fields govern the tracker's background sender and uploader (`albert_dist.tracking.sender`,
    `albert_dist.tracking.checkpoints`), the one retry layer: in a training process MLflow's own HTTP retries
    default to 0 (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, unless set).

    Raises:
        ValueError: naming the field and value, for an empty experiment name or a non-positive interval
            or timeout, or keep_last_checkpoints < 1.
    """

    tracking_uri: Optional[str] = None
    """MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else `<checkout or cwd>/mlruns.db` (SQLite). A relative
    local store (`sqlite:///x.db`, a path) is resolved against the working directory at start and recorded."""
    experiment_name: str = "albert_dist"
    """MLflow experiment the run is created in."""
    run_name: Optional[str] = None
    """Run name; None -> the run directory's name (`<recipe>-<UTC time>` unless run_dir is set)."""
    enabled: bool = True
    """False: metrics go to the console and the run directory's metrics.jsonl only."""
    log_checkpoints: bool = True
    """Upload every saved checkpoint as run artifacts under `checkpoints/step_<N>/` (background, rank 0)."""
    keep_last_checkpoints: Optional[int] = None
    """Checkpoint artifacts kept in the run (older ones deleted once a newer one is complete; the one the job
    resumed from is kept); None -> checkpoint.keep_last."""
    log_model: bool = True
    """At the end of training log the consolidated fp32 model and the HF export as the run's `model/` artifacts
    (MLflow's `log_model` term; the run directory's copy is written either way)."""
    log_system_metrics: bool = True
    """Run MLflow's own system-metrics monitor (CPU, RAM, disk, network; GPU with pynvml) on every node."""
    system_metrics_interval_s: float = 10.0
    """Seconds between two system-metrics samples."""
    connect_timeout_s: float = 30.0
    """At start, how long to wait for the server; unreachable -> train anyway, the run is created later."""
    flush_interval_s: float = 5.0
    """Seconds between two sends of buffered metrics/params/tags (the training loop never waits on them)."""
    retry_backoff_s: float = 1.0
    """First wait after a failed send or upload; doubled after each further failure."""
    max_backoff_s: float = 30.0
    """Upper bound of the wait between two retries."""
    close_timeout_s: float = 600.0
    """At the end of the job, how long to wait for unsent metrics and running uploads (what is left stays on
    disk for `albert-dist tracking sync`); after a stop signal the wait is at most 5 s."""

    def __post_init__(self) -> None:
        if not self.experiment_name:
            raise ValueError(f"tracking.experiment_name must be non-empty, got {self.experiment_name!r}")
        for name in ("flush_interval_s", "retry_backoff_s", "max_backoff_s", "close_timeout_s",
                     "system_metrics_interval_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"tracking.{name} must be > 0, got {value!r}")
        if self.keep_last_checkpoints is not None and self.keep_last_checkpoints < 1:
            raise ValueError(f"tracking.keep_last_checkpoints must be >= 1 or null, got {self.keep_last_checkpoints!r}")
        if self.max_backoff_s < self.retry_backoff_s:
            raise ValueError(
                f"tracking.max_backoff_s ({self.max_backoff_s!r}) must be >= tracking.retry_backoff_s "
                f"({self.retry_backoff_s!r})"
            )
