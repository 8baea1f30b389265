"""`FinetuneOptions`: what one `albert-dist finetune` asks for (the front end's flags, parsed; no argparse here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class FinetuneOptions:
    """A fine-tuning job: the model, the tasks, the hyper-parameters (None: the task's default,
    `albert_dist.apps.finetune.run.DEFAULT_LEARNING_RATE` and its neighbours) and the outputs. Field names are the flags' (``--data-dir``: data_dir);
    their help is `albert_dist.cli.finetune`'s. Checked by `albert_dist.apps.finetune.run.finetune` (`ValueError`
    naming the flag)."""

    model: str
    """Run directory, MLflow run id (or runs:/<id>), or transformers ALBERT directory."""
    step: Optional[int] = None
    """A run's checkpoint step_N (or its final model when that records step N) instead of the run's newest verified
    checkpoint (`albert_dist.runs`: the one rule of docs/checkpoints.md)."""
    init: str = "pretrained"
    """pretrained, or random: the same config and tokenizer, fresh weights."""
    task: Optional[list[str]] = None
    """GLUE task names (or None with `train_file`)."""
    data_dir: Optional[str] = None
    train_file: Optional[str] = None
    validation_file: Optional[str] = None
    text_column: str = "sentence"
    text_pair_column: Optional[str] = None
    label_column: str = "label"
    task_type: str = "auto"
    task_name: Optional[str] = None
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """One fine-tune per seed."""
    learning_rate: Optional[float] = None
    epochs: Optional[float] = None
    batch_size: Optional[int] = None
    max_seq_length: Optional[int] = None
    warmup_ratio: Optional[float] = None
    weight_decay: float = 0.01
    classifier_dropout: Optional[float] = None
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    subset_seed: int = 0
    bf16: bool = False
    deepspeed: Optional[str] = None
    """DeepSpeed JSON path for the Trainer."""
    output: Optional[str] = None
    """Directory for downstream.json (None: the run directory)."""
    no_tracking: bool = False
    tracking_uri: Optional[str] = None
    experiment: Optional[str] = None
