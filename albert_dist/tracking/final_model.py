"""The end-of-training model: DeepSpeed's fp32 consolidation of the final checkpoint, checked, then exported.

Outputs (``out_dir``, logged by the trainer under the run's ``model/`` artifacts)::

    fp32/model.safetensors     consolidated fp32 state dict of albert_dist's AlbertForPreTraining (tied decoder left out)
    fp32/model.yaml            its AlbertConfig (a model preset: `albert-dist export fp32 --config fp32/model.yaml`)
    hf/                        transformers AlbertForPreTraining.save_pretrained + tokenizer (spiece.model,
                               tokenizer_config.json): `from_pretrained` + `AlbertTokenizer` load it

Consolidation uses DeepSpeed's own tool (`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`,
which merges every rank's fp32 master partition and re-creates shared tensors from the checkpoint's
``shared_params``); a ZeRO-0 checkpoint has no partitions and its module state dict is taken as is. The
result must load with ``strict=True`` into a fresh model (every group's parameters present, nothing extra)
and its MLM decoder must equal the word embeddings it is tied to — the failure reported for consolidated
ZeRO checkpoints elsewhere is a lost tied decoder.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from typing import Any, Optional

import torch
import yaml

from albert_dist.model.export import consolidate_fp32, save_state_dict  # noqa: F401 - consolidate_fp32 re-exported

log = logging.getLogger(__name__)

TIED = ("predictions.decoder.weight", "albert.embeddings.word_embeddings.weight")


def load_consolidated(model_config: Any, state: dict[str, torch.Tensor]):
    """A fresh ``AlbertForPreTraining`` (eval mode) holding ``state``, checked strictly.

    Raises:
        ValueError: a parameter missing (e.g. a group lost) or unexpected, or the tied decoder differing
            from the word embeddings.
    """
    from albert_dist.model import AlbertForPreTraining

    # The tied decoder is one tensor in the model; DeepSpeed may store it under either name or both.
    state = dict(state)
    decoder, embeddings = state.get(TIED[0]), state.get(TIED[1])
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise ValueError("consolidated checkpoint: MLM decoder weight differs from the tied word embeddings")
    if embeddings is None and decoder is not None:
        state[TIED[1]] = decoder
    if decoder is None and embeddings is not None:
        state[TIED[0]] = embeddings
    model = AlbertForPreTraining(model_config)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"consolidated checkpoint does not match the model: missing {result.missing_keys}, "
                         f"unexpected {result.unexpected_keys}")
    return model.eval()


def export_final_model(model_config: Any, ckpt_dir: str, tag: str, out_dir: str,
                       tokenizer_path: Optional[str]) -> dict[str, str]:
    """Consolidate ``<ckpt_dir>/<tag>`` and write the fp32 and HF exports into ``out_dir``.

    Args:
        model_config: the run's ``AlbertConfig``.
        ckpt_dir, tag: the final DeepSpeed checkpoint.
        out_dir: receives ``fp32/`` and (when transformers can represent the model) ``hf/``.
        tokenizer_path: the sentencepiece model copied into ``hf/spiece.model`` (None: no tokenizer).

    Returns:
        ``{"fp32": dir, "hf": dir}`` for what was written; ``hf`` is absent when the model has no transformers
        equivalent (sharing != "all", or a layer->group map transformers computes differently: logged).

    Raises:
        as `consolidate_fp32` and `load_consolidated`.
    """
    state = consolidate_fp32(ckpt_dir, tag)
    model = load_consolidated(model_config, state)
    written = {}
    fp32_dir = os.path.join(out_dir, "fp32")
    os.makedirs(fp32_dir, exist_ok=True)
    # safetensors: no pickle to trust on load; the tied decoder alias is left out (export restores it)
    save_state_dict(model.state_dict(), os.path.join(fp32_dir, "model.safetensors"))
    with open(os.path.join(fp32_dir, "model.yaml"), "w") as f:
        yaml.safe_dump(dataclasses.asdict(model_config), f, sort_keys=False)
    written["fp32"] = fp32_dir
    try:
        from albert_dist.model.hf import to_transformers

        hf_model = to_transformers(model)
    except (ImportError, ValueError) as exc:
        log.warning("no transformers export: %s", exc)
        return written
    hf_dir = os.path.join(out_dir, "hf")
    hf_model.save_pretrained(hf_dir)
    if tokenizer_path:
        from albert_dist.data.sources import resolve_path
        from albert_dist.data.tokenizer import write_transformers_config

        shutil.copy2(resolve_path(tokenizer_path), os.path.join(hf_dir, "spiece.model"))
        write_transformers_config(hf_dir, model_config.max_position_embeddings)
    written["hf"] = hf_dir
    log.info("final model exported to %s", out_dir)
    return written
