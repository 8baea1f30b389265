"""`TrainConfig`: one pretraining job (model, data, optimiser, engine, checkpoint, tracking) and its strict loader.

A recipe (configs/pretrain/*.yaml) is a YAML mapping of the fields below. `load_config` merges it and any
dotted `key=value` overrides into the structured schema with OmegaConf: an unknown key, a value of the wrong
type or a value that fails a section's `__post_init__` check is a `ValueError` naming the file or override,
the key and the value. Values derived from several sections (the global batch size, warmup <= max_steps) are
checked in `check_derived`, the one place that knows the world size; the trainer calls it before any process
group starts.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from albert_dist.data.config import DataConfig
from albert_dist.engine.config import CheckpointConfig, EngineConfig, OptimConfig, global_batch_size
from albert_dist.engine.objective import ObjectiveConfig
from albert_dist.model.config import AlbertConfig
from albert_dist.tracking.config import TrackingConfig


@dataclass
class TrainConfig:
    """A whole pretraining job. Sections configure their component; the scalars configure the training loop."""

    model: AlbertConfig = field(default_factory=AlbertConfig)
    """Model hyper-parameters (albert_dist.model.config.AlbertConfig, transformers' names)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpora, tokenizer, SOP/MLM example construction and loader workers."""
    optimizer: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser, weight decay and learning-rate schedule."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """Weight and schedule of the SOP loss against the MLM loss (albert_dist.engine.objective)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """DeepSpeed settings: ZeRO stage, batch sizes, precision, clipping."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint interval, retention and resume."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking (MLflow)."""
    max_steps: int = 1000
    """Optimiser steps to train; also the length of the learning-rate schedule."""
    seed: int = 1234
    """Seed of model initialisation (same on every rank) and of dropout (offset by the rank)."""
    run_dir: Optional[str] = None
    """Directory of this run's outputs (config, ds_config.json, metrics.jsonl, checkpoints); None: runs/<recipe>-<UTC time>."""
    log_interval_steps: int = 10
    """Optimiser steps between two metric records (loss, accuracies, lr, grad norm, throughput, MFU, memory)."""
    eval_interval_steps: int = 100
    """Optimiser steps between two validations (the fixed set of data.eval_examples; 0: only after the last step)."""
    progress_bar: bool = True
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
        if self.optimizer.warmup_steps > self.max_steps:
            raise ValueError(f"optimizer.warmup_steps ({self.optimizer.warmup_steps}) must be <= max_steps "
                             f"({self.max_steps})")


def _parse_overrides(overrides: Sequence[str]):
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ValueError(f"override {item!r} must look like dotted.key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ValueError(f"invalid overrides {list(overrides)!r}: {err}") from err


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load a recipe YAML (or only the defaults when `path` is None) plus dotted overrides, strictly.

    `overrides` are `dotted.key=value` strings whose values are parsed as YAML (`engine.zero_stage=3`,
    `data.train=[...]`). Raises `ValueError` naming the source and the key for an unknown key, a wrong type,
    a malformed override or a value rejected by a section's validation; `FileNotFoundError` if `path` does
    not exist.
    """
    schema = OmegaConf.structured(TrainConfig)
    source = "defaults"
    try:
        merged = schema
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise FileNotFoundError(f"config file not found: {path}")
            source = str(path)
            loaded = OmegaConf.load(path)
            if not isinstance(loaded, type(schema)):
                raise ValueError(f"{path}: a recipe must be a YAML mapping, got a list")
            merged = OmegaConf.merge(merged, loaded)
        if overrides:
            source = f"{source} + overrides {list(overrides)!r}"
            merged = OmegaConf.merge(merged, _parse_overrides(overrides))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        # OmegaConf also wraps ValueErrors raised by a dataclass __post_init__ during to_object.
        cause = err.__cause__ if isinstance(err.__cause__, ValueError) else None
        raise ValueError(f"{source}: invalid config: {cause or err}") from err
    except ValueError as err:
        raise ValueError(f"{source}: invalid config: {err}") from err
    assert isinstance(cfg, TrainConfig)
    return cfg


def check_derived(cfg: TrainConfig, world_size: int) -> int:
    """Check the values that depend on the world size and return the global batch size (sequences/step).

    The one place the batch triple is checked (`engine.config.global_batch_size`); raises
    `ValueError` when train_batch_size != micro x accumulation x world size.
    """
    return global_batch_size(cfg.engine, world_size)


def to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML (written to the run directory as config.yaml; `load_config` reads it back)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_container(cfg: TrainConfig) -> dict:
    """The resolved config as nested plain dicts/lists (for JSON, MLflow params)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


#: Sections and fields whose change does not change what the run computes (where it writes, how it logs).
_HASH_EXCLUDED = ("run_dir", "checkpoint", "tracking", "log_interval_steps", "progress_bar")


def config_hash(cfg: TrainConfig) -> str:
    """SHA-256 (16 hex digits) of the config fields that determine the training trajectory.

    Excludes output/logging fields (`_HASH_EXCLUDED`). The engine section is included, so a resume with
    another accumulation count (e.g. to keep the global batch on another world size) is reported as a
    changed config.
    """
    data = {k: v for k, v in to_container(cfg).items() if k not in _HASH_EXCLUDED}
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
