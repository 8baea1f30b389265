"""State-dict conversion to / from transformers' `AlbertForPreTraining` (needs the `hf` extra).

With `sharing="all"` our parameter names are transformers' names, so conversion copies tensors one to one;
the only differences are (a) transformers' extra tied key ``predictions.decoder.bias`` (== ``predictions.bias``)
and (b) when embedding_size == hidden_size we have no E->H projection (as the original ALBERT code), which
transformers always has: we export it as the identity and import it only if it is the identity.

Refused with `ValueError` (conversion would silently change the model):
* ``sharing != "all"`` — transformers has no partial sharing;
* (L, G) pairs where transformers' float layer->group formula ``int(i / (L / G))`` disagrees with ours
  ``i * G // L`` (49 pairs for L <= 64, e.g. L=18, G=14), see `mismatched_layers`.
"""
from __future__ import annotations

import torch

from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.config import HF_FIELDS, AlbertConfig
from albert_dist.model.sharing import group_index

_MAPPING = "albert.encoder.embedding_hidden_mapping_in."


def hf_group_index(layer_idx: int, num_hidden_layers: int, num_hidden_groups: int) -> int:
    """transformers' layer->group formula (modeling_albert.AlbertTransformer.forward), float arithmetic."""
    return int(layer_idx / (num_hidden_layers / num_hidden_groups))


def mismatched_layers(num_hidden_layers: int, num_hidden_groups: int) -> list[int]:
    """Layers whose group differs between transformers' float formula and `group_index`."""
    L, G = num_hidden_layers, num_hidden_groups
    return [i for i in range(L) if hf_group_index(i, L, G) != group_index(i, L, G)]


def _check_convertible(config: AlbertConfig) -> None:
    if config.sharing != "all":
        raise ValueError(f"model.sharing={config.sharing!r} has no transformers equivalent; only 'all' converts")
    bad = mismatched_layers(config.num_hidden_layers, config.num_hidden_groups)
    if bad:
        raise ValueError(
            f"num_hidden_layers={config.num_hidden_layers}, num_hidden_groups={config.num_hidden_groups}: "
            f"transformers assigns layers {bad} to a different group than albert_dist (float vs integer "
            f"group index); converting would change the model")


def hf_config(config: AlbertConfig):
    """transformers.AlbertConfig with the same hyper-parameters (SDPA attention). Raises like `to_transformers`."""
    import transformers

    _check_convertible(config)
    return transformers.AlbertConfig(**{name: getattr(config, name) for name in HF_FIELDS},
                                     attn_implementation="sdpa")


def to_transformers(model: AlbertForPreTraining):
    """A `transformers.AlbertForPreTraining` computing the same logits, weights copied (fp32, eval mode).

    Raises `ValueError` for sharing != "all" or an (L, G) on which the group formulas disagree.
    """
    import transformers

    config = model.config
    hf = transformers.AlbertForPreTraining(hf_config(config)).eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state["predictions.decoder.bias"] = state["predictions.bias"].clone()
    if config.embedding_size == config.hidden_size:  # no projection here: export the identity
        state[_MAPPING + "weight"] = torch.eye(config.hidden_size, dtype=state["albert.pooler.weight"].dtype)
        state[_MAPPING + "bias"] = torch.zeros(config.hidden_size, dtype=state["albert.pooler.weight"].dtype)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if missing or unexpected:  # a naming bug, never user input
        raise RuntimeError(f"conversion to transformers: missing {missing}, unexpected {unexpected}")
    return hf


def from_transformers(hf_model, gradient_checkpointing: bool = False) -> AlbertForPreTraining:
    """An `AlbertForPreTraining` (sharing "all") with the weights of a transformers `AlbertForPreTraining`.

    Raises `ValueError` when transformers' config has values we reject (e.g. an unknown `hidden_act`), an (L, G)
    on which the group formulas disagree, or (E == H) a projection that is not the identity.
    """
    hc = hf_model.config
    config = AlbertConfig(**{name: getattr(hc, name) for name in HF_FIELDS}, sharing="all",
                          gradient_checkpointing=gradient_checkpointing)
    _check_convertible(config)
    state = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    state.pop("predictions.decoder.bias", None)  # tied to predictions.bias
    if config.embedding_size == config.hidden_size:
        weight, bias = state.pop(_MAPPING + "weight"), state.pop(_MAPPING + "bias")
        if not (torch.equal(weight, torch.eye(config.hidden_size, dtype=weight.dtype))
                and torch.count_nonzero(bias) == 0):
            raise ValueError("embedding_size == hidden_size but the transformers model's "
                             "embedding_hidden_mapping_in is not the identity; albert_dist has no such projection")
    model = AlbertForPreTraining(config)
    model.load_state_dict(state, strict=True)
    return model.train(hf_model.training)
