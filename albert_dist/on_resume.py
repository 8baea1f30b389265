"""What changing a config field means when a job resumes from a checkpoint: the vocabulary every config section
tags its fields with, once, beside the field (`field(default=..., metadata=on_resume(RESTART_STREAMS))`).

`albert_dist.config.resume_rules()` reads the tags into the one table (a section's tag is its fields' default),
and everything else is derived from it: the drift check and its messages (`albert_dist.engine.checkpoint.drift`),
the training loader's fingerprint (`albert_dist.data.loader`), the config hash (`albert_dist.config.config_hash`)
and the table in docs/checkpoints.md (checked by tests/unit/test_resume_semantics.py). Stdlib only: every layer's
config imports it.
"""
from __future__ import annotations

from typing import Any

REFUSE = "refuse"
CONVERT = "convert"
RESTART_STREAMS = "restart_streams"
APPLIES = "applies"
QUIET = "quiet"

#: rule -> what the resumed job does when a field with that rule differs from the checkpoint's config.
RULES: dict[str, str] = {
    REFUSE: "refused before any process group: exit 2 naming the field and both values (start a new run, or "
            "resume with the checkpoint's value)",
    CONVERT: "the checkpoint is converted with DeepSpeed's universal-checkpoint tool and re-partitioned on load "
             "(as for another number of ranks); warned",
    RESTART_STREAMS: "the data streams restart from the corpus start (the saved stream positions belong to the "
                     "old value); warned",
    APPLIES: "the run uses the new value from the next step; warned",
    QUIET: "cannot change what the run computes (where it writes, how often it logs or saves): not warned, not "
           "part of the config hash",
}

#: Key of the rule in a dataclass field's metadata; `NOTE_KEY` holds what the rule means for that field.
RULE_KEY = "on_resume"
NOTE_KEY = "on_resume_note"


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A resolved config as plain dicts -> {dotted field: value}, the table's keys (lists are single fields:
    `data.train`, `optimizer.betas`)."""
    if isinstance(config, dict) and config:
        out: dict[str, Any] = {}
        for k, v in config.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: config}


def on_resume(rule: str, note: str = "") -> dict[str, str]:
    """Field metadata tagging a config field (or a whole section) with `rule` (one of `RULES`) and an optional
    `note` saying what the resumed run then does for this field in particular.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"on_resume rule must be one of {sorted(RULES)}, got {rule!r}")
    return {RULE_KEY: rule, NOTE_KEY: note}


__all__ = ["APPLIES", "CONVERT", "NOTE_KEY", "QUIET", "REFUSE", "RESTART_STREAMS", "RULES", "RULE_KEY", "flatten", "on_resume"]
