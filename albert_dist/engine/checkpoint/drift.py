"""What a config change means on resume: the checkpoint's config snapshot against the current config, by the
one table of resume rules (`albert_dist.config.resume_rules`, built from each field's `on_resume` tag; the
vocabulary and what each rule does is `albert_dist.on_resume.RULES`).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from albert_dist.engine.checkpoint.choose import VerifiedCheckpoint
from albert_dist.on_resume import APPLIES, CONVERT, QUIET, REFUSE, RESTART_STREAMS, flatten

logger = logging.getLogger(__name__)

#: dotted field -> (rule, note): the shape of `albert_dist.config.resume_rules()`.
Rules = dict[str, tuple[str, str]]


class ConfigDriftError(ValueError):
    """The config differs from a checkpoint's in a field that cannot change on resume (exit 2 before any process
    group); the message names every such field with both values."""


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


def rule_for(key: str, rules: Rules) -> tuple[str, str]:
    """(rule, note) of a dotted key of the flattened config: its own row, else the nearest enclosing one; a key
    the table does not know (a field of an older version, kept in its checkpoint) applies."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        found = rules.get(".".join(parts[:i]))
        if found is not None:
            return found
    return APPLIES, "ignores it: not a field of this version's config"


@dataclass(frozen=True)
class Drift:
    """The differences between a checkpoint's config and the current one that matter on resume (quiet fields are
    left out), each with its rule."""

    changes: dict
    """Dotted key -> (value in the checkpoint, value now)."""
    rules: dict = field(default_factory=dict)
    """Dotted key -> (rule, note) of each change (`albert_dist.on_resume`)."""
    global_batch: Optional[tuple] = None
    """(sequences per step in the checkpoint, now, ranks then, ranks now) when only the number of ranks changed
    it (allowed, warned by `log_drift`); None when it is unchanged."""

    def keys(self, rule: str) -> list[str]:
        """The changed fields with `rule`, sorted."""
        return [k for k in self.changes if self.rules[k][0] == rule]

    @property
    def streams_restart(self) -> bool:
        """True when the saved data-stream positions cannot be continued with the current config."""
        return bool(self.keys(RESTART_STREAMS))

    @property
    def converts(self) -> bool:
        """True when a change needs the checkpoint converted to DeepSpeed's universal format."""
        return bool(self.keys(CONVERT))


def check_drift(point: VerifiedCheckpoint, current: dict, world_size: int, rules: Rules) -> Drift:
    """Compare `point`'s config snapshot with `current` (the resolved config as plain dicts) by `rules`.

    Raises `ConfigDriftError` (exit 2, before any process group) when a field with rule "refuse" differs, naming
    every such field with both values (and the field's reason, when it has one), or when
    `engine.gradient_accumulation_steps` or the micro batch changed and the global batch (micro x accumulation x
    world size) changed with it. Other differences are returned; `log_drift` says what each does. Local file
    paths are compared by file name (a moved checkout is no change). A format-1 checkpoint has no snapshot:
    nothing is compared.
    """
    if not point.config:
        return Drift({})
    old, new = flatten(_location_free(point.config)), flatten(_location_free(current))
    zero0 = point.zero_stage == 0 and current["engine"]["zero_stage"] == 0  # full states: nothing to convert
    changes, kinds = {}, {}
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k) and rule_for(k, rules)[0] != QUIET:
            changes[k], kinds[k] = (old.get(k), new.get(k)), rule_for(k, rules)
            if zero0 and kinds[k][0] == CONVERT:
                kinds[k] = (APPLIES, "uses the new value (a ZeRO-0 checkpoint holds full states: nothing to convert)")
    refused = [f"{k}={a!r}, the config has {k}={b!r}" for k, (a, b) in changes.items() if kinds[k][0] == REFUSE]
    if refused:
        why = "".join(f"; {k}: {kinds[k][1]}" for k in changes if kinds[k][0] == REFUSE and kinds[k][1])
        raise ConfigDriftError(f"checkpoint {point.path} has {'; '.join(refused)} (these fields cannot change on "
                               f"resume: start a new run, or resume with the checkpoint's values{why})")
    micro = lambda c: c["engine"]["train_micro_batch_size_per_gpu"] * c["engine"]["gradient_accumulation_steps"]
    before, after = micro(point.config) * point.world_size, micro(current) * world_size
    if "engine.gradient_accumulation_steps" in changes or "engine.train_micro_batch_size_per_gpu" in changes:
        if before != after:
            raise ConfigDriftError(f"checkpoint {point.path} was trained with a global batch of {before} sequences "
                                   f"({point.world_size} ranks), the config gives {after} on {world_size} ranks; "
                                   f"choose engine.gradient_accumulation_steps to keep {before}")
    # Only the number of ranks changed the global batch: allowed (elastic), warned by log_drift.
    return Drift(changes, kinds, (before, after, point.world_size, world_size) if before != after else None)


def log_drift(point: VerifiedCheckpoint, drift: Drift) -> None:
    """Warn what the resumed run does about each change: one line per field that applies or is converted (its
    note, else the rule's description), one line naming every field that restarts the data streams, and a
    global batch changed by the number of ranks."""
    if drift.global_batch is not None:
        before, after, ranks_before, ranks_now = drift.global_batch
        logger.warning("checkpoint %s was trained with a global batch of %d sequences (%d ranks); on %d ranks it "
                       "continues with %d (the learning rate is not rescaled); to keep %d set "
                       "engine.gradient_accumulation_steps", point.path, before, ranks_before, ranks_now, after,
                       before)
    for key in drift.keys(APPLIES) + drift.keys(CONVERT):
        (old, new), (rule, note) = drift.changes[key], drift.rules[key]
        what = note or ("converts the checkpoint with DeepSpeed's universal-checkpoint tool and re-partitions it on "
                        "load" if rule == CONVERT else "uses the new value from the next step")
        logger.warning("resuming %s with %s changed (%r -> %r): the run %s", point.path, key, old, new, what)
    restart = drift.keys(RESTART_STREAMS)
    if restart:
        because = ", ".join(f"{k} changed ({drift.changes[k][0]!r} -> {drift.changes[k][1]!r})" for k in restart)
        logger.warning("resuming %s: the data streams restart from the corpus start because %s", point.path, because)


__all__ = ["ConfigDriftError", "Drift", "Rules", "check_drift", "log_drift", "rule_for"]
