"""What a config change means on resume: the checkpoint's config snapshot against the current config.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from albert_dist.engine.checkpoint.plan import ResumePoint

logger = logging.getLogger(__name__)



class ConfigDriftError(ValueError):
    """The config differs from a checkpoint's in a field that cannot change on resume (a model field)."""


#: The config fields a resume may change, and what the resumed run then does (warned once when they differ).
#: Any other difference outside `model` is warned as not being a continuation; a `model` field is refused.
RESUMABLE_FIELDS: dict[str, str] = {
    "max_steps": "trains on to the new max_steps; the learning rate follows the new max_steps' schedule from "
                 "the checkpoint's step on (lr_factor(step, warmup_steps, max_steps) of the current config)",
    "eval_interval_steps": "evaluates at the new interval",
    "log_interval_steps": "logs at the new interval",
    "progress_bar": "shows or hides the progress bar",
    "run_dir": "writes its outputs to the new run directory",
    "data.train": "reads the new training sources from their beginning (the saved stream positions belong "
                  "to the old ones)",
    "data.validation": "validates on the new sources",
    "data.eval_examples": "validates on the new fixed validation set",
    "data.eval_seed": "validates on the new fixed validation set",
    "data.eval_masked_lm_prob": "validates on the new fixed validation set",
    "data.num_workers": "loads with the new number of workers (the saved stream positions are dropped)",
    "engine.gradient_accumulation_steps": "accumulates the new number of micro-steps; the global batch must "
                                          "stay the same (checked), so the trajectory continues",
    "engine.compile": "compiles (or not) from the resumed step on; the arithmetic is the same within fp32 "
                      "rounding (tests/distributed/test_compile.py)",
    "engine.compile_scope": "compiles the new scope from the resumed step on",
    "checkpoint": "checkpoints with the new settings",
    "tracking": "tracks with the new settings",
}
#: Data fields that change what an example looks like (stored with each checkpoint; changing one is warned).
DATA_SHAPE_FIELDS = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob", "max_ngram",
                     "random_token_prob", "tokenizer_path")
#: What the loaders' saved positions depend on: when any differs, the data streams start afresh.
_STREAM_FIELDS = ("data.train", "data.num_workers", "data.seed", "data.shuffle", "data.shuffle_documents",
                  "data.shard_piece_bytes",
                  "data.max_document_bytes", "engine.train_micro_batch_size_per_gpu",
                  *(f"data.{k}" for k in DATA_SHAPE_FIELDS))


def _location_free(config: dict) -> dict:
    """`config` with local file paths cut to their names: the same corpus and tokenizer in another checkout or
    mount are no change (the rule of the loaders' own fingerprint, `albert_dist.data.loader`)."""
    out = json.loads(json.dumps(config))
    data = out.get("data", {})
    for split in ("train", "validation"):
        for src in data.get(split) or []:
            if src.get("format") != "hub":
                src["paths"] = [os.path.basename(p) for p in src.get("paths", [])]
            src["hub_data_files"] = [os.path.basename(p) for p in src.get("hub_data_files", [])]
    if data.get("tokenizer_path"):
        data["tokenizer_path"] = os.path.basename(data["tokenizer_path"])
    return out


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _rule_for(key: str) -> Optional[str]:
    for name in (key, key.split(".")[0]):
        if name in RESUMABLE_FIELDS:
            return name
    parts = key.split(".")
    for i in range(len(parts), 0, -1):  # data.train[0].paths is flattened as data.train (a list)
        if ".".join(parts[:i]) in RESUMABLE_FIELDS:
            return ".".join(parts[:i])
    return None


@dataclass(frozen=True)
class Drift:
    """The differences between a checkpoint's config and the current one (dotted key -> (saved, current))."""

    changes: dict
    """Dotted key -> (value in the checkpoint, value now)."""
    global_batch: Optional[tuple] = None
    """(sequences per step in the checkpoint, now, ranks then, ranks now) when only the number of ranks changed
    it (allowed, warned by `log_drift`); None when it is unchanged."""

    @property
    def streams_restart(self) -> bool:
        """True when the saved data-stream positions cannot be continued with the current config."""
        return any(k == f or k.startswith(f + ".") for k in self.changes for f in _STREAM_FIELDS)


def check_drift(point: ResumePoint, current: dict, world_size: int) -> Drift:
    """Compare `point`'s config snapshot with `current` (the resolved config as plain dicts).

    Raises `ConfigDriftError` (exit 2, before any process group) when a `model` field differs, naming every
    such field with both values, or when `engine.gradient_accumulation_steps` changed and the global batch
    (micro x accumulation x world size) changed with it. Other differences are returned; `log_drift` warns.
    Local file paths are compared by file name (a moved checkout is no change). A format-1 checkpoint has no
    snapshot: nothing is compared.
    """
    if not point.config:
        return Drift({})
    old, new = _flatten(_location_free(point.config)), _flatten(_location_free(current))
    changes = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    model = [f"{k}={a!r}, the config has {k}={b!r}" for k, (a, b) in changes.items() if k.startswith("model.")]
    if model:
        raise ConfigDriftError(f"checkpoint {point.path} has {'; '.join(model)} (the model cannot change on resume: "
                               f"start a new run, or resume with the checkpoint's model config)")
    micro = lambda c: c["engine"]["train_micro_batch_size_per_gpu"] * c["engine"]["gradient_accumulation_steps"]
    before, after = micro(point.config) * point.world_size, micro(current) * world_size
    if "engine.gradient_accumulation_steps" in changes or "engine.train_micro_batch_size_per_gpu" in changes:
        if before != after:
            raise ConfigDriftError(f"checkpoint {point.path} was trained with a global batch of {before} sequences "
                                   f"({point.world_size} ranks), the config gives {after} on {world_size} ranks; "
                                   f"choose engine.gradient_accumulation_steps to keep {before}")
    # Only the number of ranks changed the global batch: allowed (elastic), warned by log_drift.
    return Drift(changes, (before, after, point.world_size, world_size) if before != after else None)


def log_drift(point: ResumePoint, drift: Drift) -> None:
    """One warning per changed field: what the resumed run does (`RESUMABLE_FIELDS`), or that it is not a
    continuation of the checkpoint's run (any other field); and a global batch changed by the number of ranks."""
    if drift.global_batch is not None:
        before, after, ranks_before, ranks_now = drift.global_batch
        logger.warning("checkpoint %s was trained with a global batch of %d sequences (%d ranks); on %d ranks it "
                       "continues with %d (the learning rate is not rescaled); to keep %d set "
                       "engine.gradient_accumulation_steps", point.path, before, ranks_before, ranks_now, after,
                       before)
    for key, (old, new) in drift.changes.items():
        rule = _rule_for(key)
        if rule is not None:
            logger.warning("resuming %s with %s changed (%r -> %r): the run %s", point.path, key, old, new,
                           RESUMABLE_FIELDS[rule])
        else:
            logger.warning("resuming %s with %s changed (%r -> %r): not a resumable field; the run uses the new "
                           "value and is no longer the continuation of the checkpoint's", point.path, key, old, new)
