"""The ALBERT model: config, grouped cross-layer sharing, pretraining heads (pure nn.Module code)."""
# The names below are resolved on first use (PEP 562), so `albert_dist.model.config` (imported by the torch-free
# `albert_dist.config`) does not pull in torch through this package's `__init__`.
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AlbertConfig": "albert_dist.model.config",
    "AlbertForPreTraining": "albert_dist.model.albert",
    "PreTrainingOutput": "albert_dist.model.albert",
    "group_index": "albert_dist.model.sharing",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'albert_dist.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
