"""The unshared reference model for gradient tests: `unroll(model)` gives the `sharing="none"` twin of a model.

The gradient-correctness tests (tests/unit/test_model_sharing.py, tests/distributed/test_grad_matrix.py)
compare the gradient of every shared parameter with the sum of its copies' gradients in the unrolled twin
(chain rule over the reuses), which needs no knowledge of how DeepSpeed reduces or partitions gradients.
"""
from __future__ import annotations

import dataclasses

import torch

from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.sharing import executed_blocks, shared_block_of


def unroll(model: AlbertForPreTraining) -> tuple[AlbertForPreTraining, dict[str, list[str]]]:
    """An equivalent `sharing="none"` model in which every executed block owns its parameters.

    Returns ``(unrolled, copies)``: `unrolled` computes exactly the same function as `model` (same config
    except ``sharing="none"``, weights copied, same train/eval mode), and ``copies`` maps every parameter name
    of `model` (``named_parameters()``) to the names of its copies in `unrolled`; a shared sub-block parameter
    maps to one copy per executed block that uses it, every other parameter to the same name. The gradient of
    a shared parameter equals the sum of the gradients of its copies (chain rule over the reuses).
    """
    config = model.config
    unrolled = AlbertForPreTraining(dataclasses.replace(config, sharing="none"))
    unrolled.train(model.training)
    copies: dict[str, list[str]] = {}
    target = dict(unrolled.named_parameters())
    plan = executed_blocks(config)
    for name, _ in model.named_parameters():
        shared = shared_block_of(name)
        if shared is not None:
            g, j, rest = shared
            copies[name] = [f"albert.encoder.blocks.{k}.{rest}" for k, gk, jk in plan if (gk, jk) == (g, j)]
        else:
            copies[name] = [name]
    source = dict(model.named_parameters())
    missing = set(target) - {c for names in copies.values() for c in names}
    if missing:  # a layout bug, never user input
        raise RuntimeError(f"unroll left parameters of the unrolled model without a source: {sorted(missing)}")
    with torch.no_grad():
        for name, names in copies.items():
            for copy in names:
                target[copy].copy_(source[name])
    return unrolled, copies
