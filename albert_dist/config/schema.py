"""`TrainConfig`, the schema of one pretraining job: model, data, optimiser, objective, engine, checkpoint and
tracking sections (each beside the component it configures) plus the loop's scalars; YAML and plain-dict views."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import OmegaConf

from albert_dist.data.config import DataConfig
from albert_dist.engine.config import CheckpointConfig, EngineConfig, OptimConfig
from albert_dist.engine.divergence import DivergenceConfig
from albert_dist.engine.objective import ObjectiveConfig
from albert_dist.model.config import AlbertConfig
from albert_dist.on_resume import APPLIES, QUIET, REFUSE, on_resume
from albert_dist.tracking.config import TrackingConfig


@dataclass
class TrainConfig:
    """A whole pretraining job. Sections configure their component; the scalars configure the training loop."""

    model: AlbertConfig = field(default_factory=AlbertConfig, metadata=on_resume(REFUSE))
    """Model hyper-parameters (albert_dist.model.config.AlbertConfig, transformers' names)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpora, tokenizer, SOP/MLM example construction and loader workers."""
    optimizer: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser, weight decay and learning-rate schedule."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig, metadata=on_resume(
        APPLIES, "follows the new SOP weight schedule from the checkpoint's step on"))
    """Weight and schedule of the SOP loss against the MLM loss (albert_dist.engine.objective)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """DeepSpeed settings: ZeRO stage, batch sizes, precision, clipping."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata=on_resume(QUIET))
    """Checkpoint interval, retention and resume."""
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig, metadata=on_resume(QUIET))
    """What counts as divergence (non-finite loss, loss spike, skipped steps) and what the job does: stop or roll back."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata=on_resume(QUIET))
    """Experiment tracking (MLflow)."""
    max_steps: int = field(default=1000, metadata=on_resume(
        APPLIES, "trains on to the new max_steps; the learning rate follows the new max_steps' schedule from the "
                 "checkpoint's step on (lr_factor(step, warmup_steps, max_steps) of the current config)"))
    """Optimiser steps to train; also the length of the learning-rate schedule."""
    seed: int = field(default=1234, metadata=on_resume(
        APPLIES, "loads the checkpoint's weights and RNG states: the seed only seeds dropout where a rank's RNG "
                 "state cannot be restored (another number of ranks)"))
    """Seed of model initialisation (same on every rank) and of dropout (offset by the rank)."""
    run_dir: Optional[str] = field(default=None, metadata=on_resume(QUIET))
    """Directory of this run's outputs (config, ds_config.json, metrics.jsonl, checkpoints); None: runs/<recipe>-<UTC time>."""
    log_interval_steps: int = field(default=10, metadata=on_resume(QUIET))
    """Optimiser steps between two metric records (loss, accuracies, lr, grad norm, throughput, MFU, memory)."""
    eval_interval_steps: int = field(default=100, metadata=on_resume(QUIET))
    """Optimiser steps between two validations (the fixed set of data.eval_examples; 0: only after the last step)."""
    progress_bar: bool = field(default=True, metadata=on_resume(QUIET))
    """Show a tqdm progress bar with ETA on rank 0."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps!r}")
        if self.log_interval_steps < 1:
            raise ValueError(f"log_interval_steps must be >= 1, got {self.log_interval_steps!r}")
        if self.eval_interval_steps < 0:
            raise ValueError(f"eval_interval_steps must be >= 0, got {self.eval_interval_steps!r}")
        if self.run_dir is not None and not self.run_dir:
            raise ValueError("run_dir must be a non-empty path or null, got ''")
        if self.optimizer.warmup_steps_for(self.max_steps) > self.max_steps:
            raise ValueError(f"optimizer.warmup_steps ({self.optimizer.warmup_steps}) must be <= max_steps "
                             f"({self.max_steps})")


def to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML (written to the run directory as config.yaml; `load_config` reads it back)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_container(cfg: Any) -> dict:
    """The resolved config (a `TrainConfig`, or one of its sections) as nested plain dicts/lists (for JSON, MLflow
    params, the trajectory hash, a preset's defaults): what
    ``OmegaConf.to_container(OmegaConf.structured(cfg))`` gives (tests/unit/test_config.py compares them on every
    recipe), walked directly: OmegaConf re-validates every node on the way, 0.14-0.4 s a call on 2 cores, and the
    preflight, the trainer and every resume check call this."""
    return _plain(cfg)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj
