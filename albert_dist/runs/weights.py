"""The weights a run leaves behind, read and written one way: a DeepSpeed checkpoint consolidated to fp32
(`consolidate_fp32`, any ZeRO stage and world size), a consolidated state dict read (`load_state_dict`) and written
(`save_state_dict`), a model built from either and checked against its config (`load_model`, `load_consolidated`),
and the end-of-training model a run writes (`export_trained_model`, `write_trained_model`). Which weights a source
means is `albert_dist.runs.source`'s rule; moved here from albert_dist/apps/export.py (behaviour unchanged).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Optional

import torch
import yaml
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from albert_dist.data.sources.discover import resolve_path
from albert_dist.data.tokenizer import copy_tokenizer
from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.config import AlbertConfig
from albert_dist.model.hf import to_transformers

logger = logging.getLogger(__name__)

#: Files a directory holding a consolidated state dict may hold it in, first found wins.
CHECKPOINT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt")
#: Tied keys a consolidated checkpoint may leave out (restored from the tensor they are tied to).
TIED_KEYS = {"predictions.decoder.weight"}
#: The tensor each of TIED_KEYS is tied to.
TIED_TO = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight"}
#: How the files DeepSpeed writes into every checkpoint tag directory end (ZeRO-3: zero_pp_rank_<r>_mp_rank_00_...).
DEEPSPEED_MARKER = "model_states.pt"

#: The model config written beside a consolidated state dict (`write_trained_model`).
MODEL_CONFIG = "model.yaml"
#: What `write_trained_model` records of the weights beside model.yaml: {"step": N}, the optimizer step they hold.
STEP_FILE = "step.json"


def save_state_dict(state: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a state dict as safetensors (suffix ``.safetensors``) or with ``torch.save`` (any other suffix).

    safetensors refuses tensors that share memory, so the tied MLM decoder (`TIED_KEYS`) is left out when it
    equals the tensor it is tied to (`load_state_dict` + `load_model` restore it) and cloned when it does not;
    every tensor is written contiguous. Returns `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".safetensors":
        torch.save(state, path)
        return path
    from safetensors.torch import save_file  # here: only the .safetensors suffix needs it

    out = {}
    for key, tensor in state.items():
        tied = TIED_TO.get(key)
        if tied is not None and tied in state and torch.equal(state[tied], tensor):
            continue  # the alias: restored from the embeddings on load
        out[key] = tensor.detach().clone().contiguous() if tied is not None else tensor.detach().contiguous()
    save_file(out, str(path), metadata={"format": "pt"})
    return path


def consolidate_fp32(ckpt_dir: str, tag: str) -> dict[str, torch.Tensor]:
    """fp32 state dict of the checkpoint ``<ckpt_dir>/<tag>`` (on CPU), any ZeRO stage, any world size.

    Raises:
        FileNotFoundError: no such checkpoint.
        ValueError: DeepSpeed cannot read it (message from DeepSpeed).
    """
    # here: importing DeepSpeed costs seconds, and a consolidated state dict does not need it
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    path = os.path.join(ckpt_dir, tag)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint directory {path}")
    stage0 = not any(name.endswith("optim_states.pt") and name.startswith(("zero_", "bf16_zero_"))
                     for name in os.listdir(path))
    if stage0:  # no ZeRO partitions: the module state dict holds every full tensor
        states = torch.load(os.path.join(path, "mp_rank_00_model_states.pt"), map_location="cpu",
                            weights_only=False)
        return {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
    state = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir, tag=tag)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def is_deepspeed_checkpoint(path: Path) -> bool:
    return path.is_dir() and any(p.name.endswith(DEEPSPEED_MARKER) for p in path.iterdir())


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a consolidated state dict (a .safetensors or torch.save file, or a directory with one of
    CHECKPOINT_NAMES), fp32 on CPU; a DeepSpeed checkpoint directory is consolidated first.

    A ``{"module": state_dict}`` wrapper and a ``module.`` key prefix (DDP/DeepSpeed) are removed.
    Raises `FileNotFoundError` when no checkpoint file is found.
    """
    path = Path(path)
    if is_deepspeed_checkpoint(path):
        return consolidate_fp32(str(path.parent), path.name)
    if path.is_dir():
        found = [path / n for n in CHECKPOINT_NAMES if (path / n).is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: no {' or '.join(CHECKPOINT_NAMES)} in this directory "
                                    f"(nor a DeepSpeed checkpoint: no *{DEEPSPEED_MARKER})")
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file  # here: only the .safetensors suffix needs it

        state = load_file(str(path), device="cpu")
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("module"), dict):
        state = state["module"]
    state = dict(state)  # consume_prefix_in_state_dict_if_present renames in place
    consume_prefix_in_state_dict_if_present(state, "module.")
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def load_model(checkpoint: str | Path, config: AlbertConfig) -> AlbertForPreTraining:
    """`AlbertForPreTraining(config)` with the checkpoint's weights; `ValueError` on missing / unexpected keys
    or a tensor whose shape differs from the config's (e.g. max_position_embeddings of another preset)."""
    model = AlbertForPreTraining(config)
    state, expected = load_state_dict(checkpoint), model.state_dict()
    shapes = [f"{k}: checkpoint {tuple(v.shape)}, config {tuple(expected[k].shape)}"
              for k, v in state.items() if k in expected and v.shape != expected[k].shape]
    if shapes:  # load_state_dict would raise a RuntimeError listing them; name the config instead
        raise ValueError(f"{checkpoint}: checkpoint does not match the model config: {'; '.join(shapes[:5])}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in TIED_KEYS]
    if missing or unexpected:
        raise ValueError(f"{checkpoint}: checkpoint does not match the model config: "
                         f"missing keys {missing[:10]}, unexpected keys {unexpected[:10]}")
    return model.eval()



def load_consolidated(model_config: AlbertConfig, state: dict[str, torch.Tensor]) -> AlbertForPreTraining:
    """A fresh ``AlbertForPreTraining`` (eval mode) holding ``state``, checked strictly.

    Raises:
        ValueError: a parameter missing (e.g. a group lost) or unexpected, or the tied decoder differing
            from the word embeddings.
    """
    # The tied decoder is one tensor in the model; DeepSpeed may store it under either name or both.
    state = dict(state)
    (decoder_key, embeddings_key), = TIED_TO.items()
    decoder, embeddings = state.get(decoder_key), state.get(embeddings_key)
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise ValueError("consolidated checkpoint: MLM decoder weight differs from the tied word embeddings")
    if embeddings is None and decoder is not None:
        state[embeddings_key] = decoder
    if decoder is None and embeddings is not None:
        state[decoder_key] = embeddings
    model = AlbertForPreTraining(model_config)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"consolidated checkpoint does not match the model: missing {result.missing_keys}, "
                         f"unexpected {result.unexpected_keys}")
    return model.eval()


def export_trained_model(model_config: AlbertConfig, ckpt_dir: str, tag: str, out_dir: str,
                       tokenizer_path: Optional[str]) -> dict[str, str]:
    """The end-of-training model (logged by the MLflow tracker under the run's ``model/``): consolidate
    ``<ckpt_dir>/<tag>`` (`consolidate_fp32`), check it (`load_consolidated`: the failure reported for
    consolidated ZeRO checkpoints elsewhere is a lost tied decoder) and write into ``out_dir``
    ``fp32/model.safetensors`` + ``fp32/model.yaml`` (its AlbertConfig, a model preset) and ``hf/``
    (transformers ``save_pretrained`` + ``spiece.model`` + ``tokenizer_config.json``).

    Args:
        model_config: the run's ``AlbertConfig``.
        ckpt_dir, tag: the final DeepSpeed checkpoint.
        out_dir: receives ``fp32/`` and (when transformers can represent the model) ``hf/``.
        tokenizer_path: the tokenizer copied into ``hf/`` (`albert_dist.data.tokenizer.copy_tokenizer`; None: none).

    Returns:
        ``{"fp32": dir, "hf": dir}`` for what was written; ``hf`` is absent when the model has no transformers
        equivalent (sharing != "all", or a layer->group map transformers computes differently: logged).

    Raises:
        as `consolidate_fp32` and `load_consolidated`.
    """
    from albert_dist.engine.checkpoint.layout import step_of

    model = load_consolidated(model_config, consolidate_fp32(ckpt_dir, tag))
    return write_trained_model(model, out_dir, tokenizer_path, step_of(tag))


def write_trained_model(model: AlbertForPreTraining, out_dir: str, tokenizer_path: Optional[str],
                      step: Optional[int] = None) -> dict[str, str]:
    """Write a run's end-of-training layout (`export_trained_model`) from a model in memory: ``fp32/`` always (with
    `step`, the optimizer step the weights hold, in ``fp32/step.json``: what `albert_dist.runs.source` compares
    with the run's newest checkpoint), ``hf/`` when transformers can represent it. Returns
    ``{"fp32": dir[, "hf": dir]}``."""
    model_config = model.config
    written = {}
    fp32_dir = os.path.join(out_dir, "fp32")
    os.makedirs(fp32_dir, exist_ok=True)
    # safetensors: no pickle to trust on load; the tied decoder alias is left out (export restores it)
    save_state_dict(model.state_dict(), os.path.join(fp32_dir, "model.safetensors"))
    with open(os.path.join(fp32_dir, MODEL_CONFIG), "w") as f:
        yaml.safe_dump(dataclasses.asdict(model_config), f, sort_keys=False)
    if step is not None:
        with open(os.path.join(fp32_dir, STEP_FILE), "w") as f:
            json.dump({"step": int(step)}, f)
    written["fp32"] = fp32_dir
    try:
        hf_model = to_transformers(model)  # ImportError without the hf extra
    except (ImportError, ValueError) as exc:
        logger.warning("no transformers export: %s", exc)
        return written
    hf_dir = os.path.join(out_dir, "hf")
    from transformers.utils import logging as hf_logging  # importable: to_transformers succeeded

    # the end of a training job: transformers' "Writing model shards" bar would land in the job's log file
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        hf_model.save_pretrained(hf_dir)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    if tokenizer_path:  # a tokenizer directory (model.init_from's) keeps its settings: the source's ids
        copy_tokenizer(resolve_path(tokenizer_path), hf_dir, model_config.max_position_embeddings)
    written["hf"] = hf_dir
    logger.info("final model exported to %s", out_dir)
    return written


#: Index files of a sharded transformers directory (`save_pretrained` of a large model): {"weight_map": {key: file}}.
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(path: str | Path) -> list[Path]:
    """The files holding a consolidated state dict or a transformers directory's weights: `path` itself (a file),
    the first of CHECKPOINT_NAMES in the directory, else the shards a SHARD_INDEXES file names; [] when none."""
    path = Path(path)
    if path.is_file():
        return [path]
    for name in CHECKPOINT_NAMES:
        if (path / name).is_file():
            return [path / name]
    for name in SHARD_INDEXES:
        if (path / name).is_file():
            try:
                shards = json.loads((path / name).read_text())["weight_map"].values()
            except (ValueError, KeyError, AttributeError) as exc:
                raise ValueError(f"{path / name}: not a shard index ({type(exc).__name__}: {exc})") from None
            return [path / shard for shard in sorted(set(shards))]
    return []


def stored_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape the weight files of `path` hold (`weight_files`), read without loading the
    tensors where the format allows: a safetensors header (whose offsets safetensors checks against the file's
    size), a torch.save pickle memory-mapped. A ``module.`` prefix (DDP/DeepSpeed) is removed.

    Raises:
        ValueError: a file that does not read (truncated, not a state dict), naming it and why in one line.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for file in weight_files(path):
        try:
            if file.suffix == ".safetensors":
                from safetensors import safe_open  # here: only a safetensors file needs it

                with safe_open(str(file), framework="pt") as st:
                    found = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
            else:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                if isinstance(state, dict) and isinstance(state.get("module"), dict):
                    state = state["module"]
                found = {k: tuple(v.shape) for k, v in state.items()}
        except Exception as exc:  # noqa: BLE001 - safetensors' SafetensorError, pickle's errors: one line
            why = (str(exc).strip().splitlines() or [""])[0]
            raise ValueError(f"{file}: the weights do not read ({type(exc).__name__}: {why})") from None
        shapes.update({k.removeprefix("module."): v for k, v in found.items()})
    return shapes


def load_transformers(path: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A transformers ALBERT directory's weights as an albert_dist `AlbertForPreTraining` state dict (fp32, CPU;
    `albert_dist.model.hf.from_transformers`), and transformers' names of the parameters the directory has no
    weights for (any ALBERT head loads: e.g. run_mlm's `AlbertForMaskedLM` has no SOP head nor pooler; those keep
    transformers' initialisation in the state dict, and the caller decides what to do with them). transformers'
    own "newly initialized" warning and progress bar are silenced. Raises as `from_pretrained` does.
    """
    import transformers
    from transformers.utils import logging as hf_logging

    from albert_dist.model.hf import from_transformers

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        hf, info = transformers.AlbertForPreTraining.from_pretrained(path, attn_implementation="sdpa",
                                                                      output_loading_info=True,
                                                                      dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    return from_transformers(hf).state_dict(), sorted(info.get("missing_keys", ()))
