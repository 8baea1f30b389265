"""What changing a config field means on resume (the one table, from each field's `on_resume` tag) and the hash of
the fields that determine a run's trajectory."""
from __future__ import annotations

import hashlib
import json
from dataclasses import fields, is_dataclass
from typing import Optional, get_type_hints

from albert_dist.config.schema import TrainConfig, to_container
from albert_dist.on_resume import NOTE_KEY, QUIET, RULE_KEY, RULES, flatten


def resume_rules() -> dict[str, tuple[str, str]]:
    """The one table of what changing a config field means on resume: dotted field -> (rule, note), from the
    `on_resume` tag of each field (`albert_dist.on_resume`; a field without a tag takes its section's).

    Sections (dataclass fields) are descended; lists, e.g. `data.train` or `optimizer.betas`, are single fields.
    Raises `ValueError` for a field with no rule at all (every field must say what a resume does with it).
    """
    table: dict[str, tuple[str, str]] = {}

    def walk(cls: type, prefix: str, inherited: Optional[tuple[str, str]]) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            key = f"{prefix}{f.name}"
            own = (f.metadata[RULE_KEY], f.metadata.get(NOTE_KEY, "")) if RULE_KEY in f.metadata else None
            rule = own or inherited
            if is_dataclass(hints[f.name]):
                walk(hints[f.name], key + ".", rule)
            elif rule is None:
                raise ValueError(f"config field {key} has no on_resume rule (albert_dist.on_resume)")
            else:
                table[key] = rule

    walk(TrainConfig, "", None)
    return table


def resume_table_markdown() -> str:
    """The resume-semantics table as docs/checkpoints.md shows it: one row per (rule, note), its fields (a
    section whose fields all share the row as `section.*`), and what happens."""
    table = resume_rules()
    rows: dict[tuple[str, str], list[str]] = {}
    for key, rule in table.items():
        rows.setdefault(rule, []).append(key)

    def collapse(keys: list[str]) -> list[str]:
        out, done = [], set()
        for key in keys:
            parts = key.split(".")
            for depth in range(1, len(parts)):  # the shortest section all of whose fields are in this row
                section = ".".join(parts[:depth]) + "."
                if all(k in keys for k in table if k.startswith(section)):
                    if section not in done:
                        done.add(section)
                        out.append(section + "*")
                    break
            else:
                out.append(key)
        return out

    order = list(RULES)
    lines = ["| on resume | fields | what the resumed run does |", "|---|---|---|"]
    for (rule, note), keys in sorted(rows.items(), key=lambda item: (order.index(item[0][0]), item[0][1])):
        what = f"the run {note}; warned" if note else RULES[rule]
        lines.append(f"| `{rule}` | {', '.join(f'`{k}`' for k in collapse(keys))} | {what} |")
    return "\n".join(lines) + "\n"


def config_hash(cfg: TrainConfig) -> str:
    """SHA-256 (16 hex digits) of the config fields that determine the training trajectory: every field but the
    ones `resume_rules` calls quiet (where the run writes, how often it logs, evaluates or saves, tracking)."""
    rules = resume_rules()
    data = {k: v for k, v in flatten(to_container(cfg)).items() if rules.get(k, ("",))[0] != QUIET}
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
