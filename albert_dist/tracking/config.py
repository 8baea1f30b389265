"""Configuration of experiment tracking (MLflow)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrackingConfig:
    """Where and how a job is tracked in MLflow (one run per job, created by global rank 0).

    The retry/backoff fields govern the tracker's own background sender and uploader
    (`albert_dist.tracking.sender`, `albert_dist.tracking.checkpoints`); MLflow's HTTP client additionally
    retries each request (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7 with exponential backoff).

    Raises:
        ValueError: naming the field and value, for an empty experiment name or a non-positive interval
            or timeout.
    """

    tracking_uri: Optional[str] = None
    """MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else a local SQLite store `sqlite:///mlruns.db`."""
    experiment_name: str = "albert_dist"
    """MLflow experiment the run is created in."""
    run_name: Optional[str] = None
    """Run name; None -> MLflow's generated name."""
    enabled: bool = True
    """False: metrics go to the console and the run directory's metrics.jsonl only."""
    log_checkpoints: bool = True
    """Upload every saved checkpoint as run artifacts under `checkpoints/step_<N>/` (background, rank 0)."""
    log_final_model: bool = True
    """At the end of training log the consolidated fp32 model and the HF export under `model/`."""
    flush_interval_s: float = 5.0
    """Seconds between two sends of buffered metrics/params/tags (the training loop never waits on them)."""
    retry_backoff_s: float = 1.0
    """First wait after a failed send or upload; doubled after each further failure."""
    max_backoff_s: float = 30.0
    """Upper bound of the wait between two retries."""
    close_timeout_s: float = 600.0
    """At the end of the job, how long to wait for unsent metrics and running uploads before giving up."""

    def __post_init__(self) -> None:
        if not self.experiment_name:
            raise ValueError(f"tracking.experiment_name must be non-empty, got {self.experiment_name!r}")
        for name in ("flush_interval_s", "retry_backoff_s", "max_backoff_s", "close_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"tracking.{name} must be > 0, got {value!r}")
        if self.max_backoff_s < self.retry_backoff_s:
            raise ValueError(
                f"tracking.max_backoff_s ({self.max_backoff_s!r}) must be >= tracking.retry_backoff_s "
                f"({self.retry_backoff_s!r})"
            )
