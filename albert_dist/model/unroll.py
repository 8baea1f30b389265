"""The unshared reference model for gradient tests: `unroll(model)` gives the `sharing="none"` twin of a model;
`source_names` maps a model's parameters onto another sharing plan's (`model.init_from` untying a source).

The gradient-correctness tests (tests/unit/test_model_sharing.py, tests/distributed/test_grad_matrix.py)
compare the gradient of every shared parameter with the sum of its copies' gradients in the unrolled twin
(chain rule over the reuses), which needs no knowledge of how DeepSpeed reduces or partitions gradients.
"""
from __future__ import annotations

import dataclasses

import torch

from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.sharing import (SHARED_PREFIX, executed_blocks, shared_block_of, shares_attention,
                                       shares_ffn)


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


_BLOCKS_PREFIX = "albert.encoder.blocks."


def _block_parameter(config, k: int, rest: str) -> str:
    """Name of the parameter `rest` (``attention.query.weight``, ``ffn.weight``, ...) that executed block `k`
    uses under `config`'s sharing plan."""
    shared = shares_attention(config.sharing) if rest.startswith("attention.") else shares_ffn(config.sharing)
    if not shared:
        return f"{_BLOCKS_PREFIX}{k}.{rest}"
    _, g, j = executed_blocks(config)[k]
    return f"{SHARED_PREFIX}{g}.albert_layers.{j}.{rest}"


def source_names(target, source) -> dict[str, str]:
    """For every parameter of ``AlbertForPreTraining(target)``, the parameter of ``AlbertForPreTraining(source)``
    it starts from (`model.init_from`): the same name outside the encoder blocks; for a block parameter, the one
    the source uses at the executed blocks the target's parameter serves. A target with less sharing than the
    source (``sharing="none"`` from ``"all"``, more groups) so starts each block from its group's weights
    (untying: the same function at step 0).

    Both configs must have the same `num_hidden_layers` and `inner_group_num` (the executed blocks line up).

    Raises:
        ValueError: a target parameter would serve blocks whose weights differ in the source (more sharing
            than the source: tying different tensors into one has no faithful start), naming the fields.
    """
    import torch

    with torch.device("meta"):  # names only: no memory, no initialisation
        names = [name for name, _ in AlbertForPreTraining(target).named_parameters()]
    plan = executed_blocks(target)
    out: dict[str, str] = {}
    for name in names:
        shared = shared_block_of(name)
        if shared is not None:
            g, j, rest = shared
            blocks = [k for k, gk, jk in plan if (gk, jk) == (g, j)]
        elif name.startswith(_BLOCKS_PREFIX):
            k, rest = name[len(_BLOCKS_PREFIX):].split(".", 1)
            blocks = [int(k)]
        else:
            out[name] = name
            continue
        found = {_block_parameter(source, k, rest) for k in blocks}
        if len(found) > 1:
            raise ValueError(
                f"model.sharing={target.sharing!r} with num_hidden_groups={target.num_hidden_groups} shares "
                f"{name} across executed blocks {blocks}, which the source (sharing={source.sharing!r}, "
                f"num_hidden_groups={source.num_hidden_groups}) keeps apart: init_from can untie shared weights "
                "(less sharing than the source), not tie different ones; keep the source's sharing or use less")
        out[name] = found.pop()
    return out
