"""Configuration of experiment tracking (MLflow)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrackingConfig:
    """Where and how a job is tracked in MLflow (one run per job, created by global rank 0)."""

    tracking_uri: Optional[str] = None
    """MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else a local SQLite store `sqlite:///mlruns.db`."""
    experiment_name: str = "albert_dist"
    """MLflow experiment the run is created in."""
    run_name: Optional[str] = None
    """Run name; None -> MLflow's generated name."""
    enabled: bool = True
    """False: metrics go to the console and the run directory's metrics.jsonl only."""

    def __post_init__(self) -> None:
        if not self.experiment_name:
            raise ValueError(f"tracking.experiment_name must be non-empty, got {self.experiment_name!r}")
