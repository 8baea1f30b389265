"""One fine-tune: tokenize a task once, then per seed build `AlbertForSequenceClassification` on the source's
encoder, train it with transformers' `Trainer` (CPU or GPU; under torchrun or the deepspeed launcher it runs
data-parallel, as transformers' run_glue does) and score the dev split.

The Trainer reports nowhere (``report_to="none"``: `albert_dist.tracking.finetune_runs` logs to MLflow itself,
as child runs of the pretraining run), saves nothing (``save_strategy="no"``) and shows no bar of its own: the
caller's bar advances per optimizer step through `StepBar`.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from albert_dist.apps.finetune.metrics import compute
from albert_dist.apps.finetune.tasks import Split, TaskData
from albert_dist.model.classifier import CLASSIFIER_DROPOUT_PROB, AlbertForSequenceClassification
from albert_dist.model.config import AlbertConfig


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of one task's fine-tunes (every seed the same)."""

    learning_rate: float
    """Peak learning rate of AdamW (linear warmup, then linear decay to 0: run_glue's schedule)."""
    num_train_epochs: float
    """Passes over the training subset."""
    per_device_train_batch_size: int
    """Examples per optimizer step and device."""
    max_seq_length: int
    """Tokens per example with [CLS]/[SEP], longest-first truncation."""
    warmup_ratio: float
    """Warmup as a fraction of the optimizer steps, in [0, 1)."""
    weight_decay: float = 0.01
    """AdamW weight decay (not on biases and LayerNorm, as the Trainer decides)."""
    classifier_dropout_prob: float = CLASSIFIER_DROPOUT_PROB
    """Dropout before the classifier."""
    bf16: bool = False
    """bf16 autocast (GPUs that support it)."""
    deepspeed: Optional[str] = None
    """A DeepSpeed JSON config for the Trainer (big tasks under the deepspeed launcher); None: plain PyTorch."""

    def __post_init__(self) -> None:
        for name, flag in (("learning_rate", "--learning-rate"), ("num_train_epochs", "--epochs")):
            if not getattr(self, name) > 0:
                raise ValueError(f"{flag} must be > 0, got {getattr(self, name)!r}")
        if self.per_device_train_batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.per_device_train_batch_size!r}")
        if self.max_seq_length < 3:
            raise ValueError(f"--max-seq-length must be >= 3 ([CLS] x [SEP]), got {self.max_seq_length!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if not 0 <= self.classifier_dropout_prob < 1:
            raise ValueError(f"--classifier-dropout must be in [0, 1), got {self.classifier_dropout_prob!r}")
        if self.deepspeed is not None and not Path(self.deepspeed).is_file():
            raise ValueError(f"--deepspeed {self.deepspeed}: no such file")


class EncodedSplit(torch.utils.data.Dataset):
    """A tokenized split: per example a dict of input_ids / token_type_ids / attention_mask (lists) and labels."""

    def __init__(self, features: dict[str, list], labels: list):
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {k: v[i] for k, v in self.features.items()}
        item["labels"] = self.labels[i]
        return item


def encode(tokenizer: Any, split: Split, max_seq_length: int) -> EncodedSplit:
    """``[CLS] a [SEP] (b [SEP])`` ids, token types 0 / 1, truncated longest-first to `max_seq_length`
    (transformers' tokenizer call; padding is per batch, by the collator)."""
    features = tokenizer(split.texts, split.pairs, truncation="longest_first", max_length=max_seq_length,
                         return_token_type_ids=True, return_attention_mask=True)
    return EncodedSplit({k: features[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, split.labels)


def steps_per_run(num_examples: int, config: FinetuneConfig, world_size: int = 1) -> int:
    """Optimizer steps of one fine-tune, as the Trainer counts them (the last partial batch is a step)."""
    batches = math.ceil(num_examples / (config.per_device_train_batch_size * world_size))
    return math.ceil(config.num_train_epochs * batches)


def build_model(model_config: AlbertConfig, num_labels: int, state: Optional[dict[str, torch.Tensor]],
                seed: int, classifier_dropout_prob: float) -> AlbertForSequenceClassification:
    """The classifier with the pretrained encoder (`state`), or every weight fresh (`state` None); the fresh
    weights (classifier, and everything at random init) are drawn from `torch.manual_seed(seed)`."""
    torch.manual_seed(seed)
    model = AlbertForSequenceClassification(model_config, num_labels, classifier_dropout_prob)
    if state is not None:
        model.load_encoder(state)
    return model


def finetune_once(model: AlbertForSequenceClassification, train: EncodedSplit, dev: EncodedSplit,
                  tokenizer: Any, task: TaskData, config: FinetuneConfig, seed: int,
                  callbacks: Optional[list] = None) -> dict[str, float]:
    """Train `model` on `train` with the Trainer and score `dev`.

    Returns:
        the task's metrics on dev (`albert_dist.apps.finetune.metrics`), plus ``train_loss`` (mean over the run,
        nats or squared units) and ``train_runtime_s``.
    """
    from transformers import DataCollatorWithPadding, PrinterCallback, Trainer, TrainingArguments

    with tempfile.TemporaryDirectory(prefix="albert-finetune-") as out:
        args = TrainingArguments(
            output_dir=out, seed=seed, data_seed=seed, report_to="none", save_strategy="no",
            eval_strategy="no", logging_strategy="no", disable_tqdm=True,
            learning_rate=config.learning_rate, num_train_epochs=config.num_train_epochs,
            per_device_train_batch_size=config.per_device_train_batch_size,
            per_device_eval_batch_size=max(64, config.per_device_train_batch_size),
            warmup_steps=math.ceil(config.warmup_ratio * steps_per_run(len(train), config)),
            weight_decay=config.weight_decay, lr_scheduler_type="linear", bf16=config.bf16,
            use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, deepspeed=config.deepspeed,
            ddp_find_unused_parameters=False)  # every parameter takes part (no pretraining heads here)
        trainer = Trainer(model=model, args=args, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer), callbacks=callbacks or [])
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training dict; the table says it all
        start = time.perf_counter()
        result = trainer.train()
        runtime = time.perf_counter() - start
        predictions = trainer.predict(dev).predictions
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]
    scores = compute(task.metrics, np.asarray(predictions, dtype=np.float64), np.asarray(dev.labels))
    return {**scores, "train_loss": float(result.training_loss), "train_runtime_s": runtime}


def step_bar_callback(bar: Any) -> Any:
    """A `TrainerCallback` advancing the tqdm `bar` by one per optimizer step."""
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: D102 - transformers' hook
            bar.update(1)

    return StepBar()
