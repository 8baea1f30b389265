"""What a checkpoint holds besides DeepSpeed's engine state: `TrainState` (step, config snapshot, every
rank's data-loader and RNG states) and the RNG helpers.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: Key of the `TrainState` in DeepSpeed's client_state.
CLIENT_KEY = "albert_dist"



@dataclass
class TrainState:
    """What a checkpoint holds besides DeepSpeed's engine state, in `client_state["albert_dist"]`.

    `data_states[r]` / `rng_states[r]` are rank r's loader `state_dict()` and `rng_state()` at the save.
    """

    step: int = 0
    """Optimiser steps done."""
    config_hash: str = ""
    """`albert_dist.config.config_hash` of the config that wrote it."""
    config: dict = field(default_factory=dict)
    """The resolved TrainConfig as plain dicts (its `model` and `data` sections are the drift check's snapshot)."""
    world_size: int = 1
    """Number of ranks that wrote it."""
    zero_stage: int = 0
    """ZeRO stage it was written with."""
    data_states: list = field(default_factory=list)
    """Per rank: the training loader's state_dict()."""
    rng_states: list = field(default_factory=list)
    """Per rank: `rng_state()`."""
    metrics_states: list = field(default_factory=list)
    """Per rank: the open metric interval (`MetricAccumulator.local_state()`) with the divergence loss window
    (``"loss_window"``, `albert_dist.engine.divergence.saved_window`); [] in checkpoints written before it was saved."""

    @property
    def model_config(self) -> dict:
        """The model section of the snapshot ({} for checkpoints written before snapshots existed)."""
        return dict(self.config.get("model", {}))

    def state_dict(self) -> dict[str, Any]:
        """Plain dict for DeepSpeed's client_state (keys as the fields)."""
        return {"step": self.step, "config_hash": self.config_hash, "config": self.config,
                "world_size": self.world_size, "zero_stage": self.zero_stage,
                "data_states": self.data_states, "rng_states": self.rng_states,
                "metrics_states": self.metrics_states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` (a missing "config" reads as {}, missing "metrics_states" as [])."""
        self.step = int(state["step"])
        self.config_hash = str(state["config_hash"])
        self.config = dict(state.get("config") or {})
        self.world_size = int(state["world_size"])
        self.zero_stage = int(state["zero_stage"])
        self.data_states = list(state["data_states"])
        self.rng_states = list(state["rng_states"])
        self.metrics_states = list(state.get("metrics_states") or [])


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python `random`, numpy, torch CPU and (if present) the current CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_for(seed: int, rank: int, step: int) -> int:
    """Seed of a rank's dropout RNG when it cannot be restored from a checkpoint (fresh start or new rank)."""
    return (seed * 1_000_003 + rank * 7919 + step) % (2**63)


def seed_all(seed: int) -> None:
    """Seed python `random`, numpy and torch (CPU and every CUDA device) with `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
