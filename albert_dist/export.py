"""`albert-dist export`: a checkpoint or a run -> a transformers `save_pretrained` directory (an app, beside
train.py: it reads DeepSpeed checkpoints, so it lives outside the pure-PyTorch `albert_dist.model`; its front end
is `albert_dist.cli.export`).

    albert-dist export RUN_DIR|CHECKPOINT --output DIR [--config YAML] [--tokenizer spiece.model]
                       [--fp32 FILE.safetensors|FILE.pt]

What it reads (`locate`):
* a run directory (holding ``config.yaml``): its newest checkpoint that verifies;
* a checkpoint directory (``<run>/checkpoints``): the same; a DeepSpeed checkpoint ``<run>/checkpoints/step_<N>``
  (any ZeRO stage and world size), consolidated with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``;
* a consolidated state dict: a ``.safetensors`` file, a ``torch.save(model.state_dict())`` file (e.g. DeepSpeed's
  ``zero_to_fp32.py`` output), or a directory holding ``model.safetensors``, ``pytorch_model.bin`` or
  ``model.pt`` (a run's ``final_model/fp32/``).

The model config and the tokenizer come from beside it: the resolved config every checkpoint carries in its
``albert_dist.json``, else the run's ``config.yaml``, else the ``model.yaml`` beside a consolidated state dict
(`final_model/fp32/model.yaml`); the tokenizer is the run's ``data.tokenizer_path``. ``--config`` (a model preset,
configs/model/*.yaml, or a training YAML with a ``model:`` section) and ``--tokenizer`` override them; they are
needed only for a state dict that came from elsewhere. ``--fp32`` also writes the consolidated state dict, as
safetensors or pickle by its suffix (`save_state_dict`; DeepSpeed's own ``zero_to_fp32.py --safe_serialization``
fails on ALBERT's tied decoder/embedding pair, this path does not). Only ``sharing: all`` models export (see
`albert_dist.model.hf`). Needs the `hf` extra (transformers).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Optional

import torch
import yaml
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from albert_dist.config import load_model_config, model_config_of
from albert_dist.data.sources.discover import resolve_path
from albert_dist.data.tokenizer import copy_tokenizer
from albert_dist.engine.checkpoint.layout import META_FILE, CheckpointError, read_meta
from albert_dist.engine.checkpoint.choose import newest_verified
from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.config import AlbertConfig
from albert_dist.model.hf import to_transformers

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt")
#: Tied keys a consolidated checkpoint may leave out (restored from the tensor they are tied to).
TIED_KEYS = {"predictions.decoder.weight"}
#: The tensor each of TIED_KEYS is tied to.
TIED_TO = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight"}
#: How the files DeepSpeed writes into every checkpoint tag directory end (ZeRO-3: zero_pp_rank_<r>_mp_rank_00_...).
_DEEPSPEED_MARKER = "model_states.pt"


#: The run's resolved config, written by the trainer into the run directory.
RUN_CONFIG = "config.yaml"
#: The model config written beside a consolidated state dict (`export_final_model`).
MODEL_CONFIG = "model.yaml"


@dataclasses.dataclass(frozen=True)
class Located:
    """What `albert-dist export SOURCE` exports, and the configuration found beside it."""

    checkpoint: Path
    """A DeepSpeed checkpoint tag directory or a consolidated state dict (file or directory)."""
    model: Optional[AlbertConfig]
    """The model config found beside it; None when nothing was found (then `--config` is needed)."""
    tokenizer: Optional[Path]
    """The run's tokenizer (`data.tokenizer_path`); None when the run's config names none."""
    config_source: str
    """Where `model` (and `tokenizer`) came from, for messages."""


def read_run_config(run_dir: Path) -> Optional[dict]:
    """The resolved TrainConfig of a run directory as plain dicts (its config.yaml), or None."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) and isinstance(data.get("model"), dict) else None


def _from_train_config(checkpoint: Path, config: dict, source: str) -> Located:
    tokenizer = (config.get("data") or {}).get("tokenizer_path")
    return Located(checkpoint, model_config_of(config, source), resolve_path(tokenizer) if tokenizer else None,
                   source)


def locate(source: str | Path) -> Located:
    """Resolve `albert-dist export`'s argument: a run directory, a checkpoint directory, a checkpoint, or a
    consolidated state dict (file, or a directory holding one), and the model config and tokenizer beside it.

    Rules, first match: a directory with ``config.yaml`` is a run: its newest verified checkpoint (in
    ``checkpoint.dir`` or ``<run>/checkpoints``); a directory with ``latest`` or ``step_<N>`` directories is a
    checkpoint directory: its newest verified checkpoint; a DeepSpeed tag directory takes the config of its
    ``albert_dist.json``, else the run's ``config.yaml`` two levels up; a consolidated state dict takes the
    ``model.yaml`` beside it, else the ``config.yaml`` of the run it lies in (up to three levels up).

    Raises:
        FileNotFoundError: `source` does not exist, or a run / checkpoint directory holds no checkpoint.
        CheckpointError: checkpoints exist but none verifies (each listed with its reason).
        ValueError: the config found is not a valid model config (naming the file and field).
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run, checkpoint or file")
    run_config = read_run_config(path) if path.is_dir() else None
    if run_config is not None:  # a run directory
        ckpt_dir = (run_config.get("checkpoint") or {}).get("dir") or str(path / "checkpoints")
        point = newest_verified(ckpt_dir, log=True) if Path(ckpt_dir).is_dir() else None
        if point is None:
            raise FileNotFoundError(f"{path}: a run directory without a checkpoint in {ckpt_dir}")
        path = point.path
    elif path.is_dir() and ((path / "latest").is_file() or any(p.name.startswith("step_") for p in path.iterdir())):
        point = newest_verified(path, log=True)
        if point is None:
            raise FileNotFoundError(f"{path}: a checkpoint directory without a checkpoint")
        path = point.path
    if _is_deepspeed_checkpoint(path):
        if (path / META_FILE).is_file() and read_meta(path).get("config"):
            return _from_train_config(path, read_meta(path)["config"], str(path / META_FILE))
        run_config = read_run_config(path.parent.parent)
        if run_config is not None:
            return _from_train_config(path, run_config, str(path.parent.parent / RUN_CONFIG))
        return Located(path, None, None, "")
    beside = (path if path.is_dir() else path.parent) / MODEL_CONFIG
    for run_dir in list(path.parents)[:3]:
        run_config = read_run_config(run_dir)
        if run_config is not None:
            found = _from_train_config(path, run_config, str(run_dir / RUN_CONFIG))
            if beside.is_file():
                return dataclasses.replace(found, model=load_model_config(beside), config_source=str(beside))
            return found
    if beside.is_file():
        return Located(path, load_model_config(beside), None, str(beside))
    return Located(path, None, None, "")


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


def _is_deepspeed_checkpoint(path: Path) -> bool:
    return path.is_dir() and any(p.name.endswith(_DEEPSPEED_MARKER) for p in path.iterdir())


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a consolidated state dict (a .safetensors or torch.save file, or a directory with one of
    CHECKPOINT_NAMES), fp32 on CPU; a DeepSpeed checkpoint directory is consolidated first.

    A ``{"module": state_dict}`` wrapper and a ``module.`` key prefix (DDP/DeepSpeed) are removed.
    Raises `FileNotFoundError` when no checkpoint file is found.
    """
    path = Path(path)
    if _is_deepspeed_checkpoint(path):
        return consolidate_fp32(str(path.parent), path.name)
    if path.is_dir():
        found = [path / n for n in CHECKPOINT_NAMES if (path / n).is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: no {' or '.join(CHECKPOINT_NAMES)} in this directory "
                                    f"(nor a DeepSpeed checkpoint: no *{_DEEPSPEED_MARKER})")
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


def export(checkpoint: str | Path, config: AlbertConfig | str | Path, output: str | Path,
           tokenizer: str | Path | None = None, fp32: str | Path | None = None) -> Path:
    """Write ``output`` as a transformers `AlbertForPreTraining` directory (config.json + safetensors; with
    `tokenizer` also spiece.model + tokenizer_config.json), and with `fp32` the checked consolidated state dict
    too (`save_state_dict`). `config` is an `AlbertConfig` or a YAML (`albert_dist.config.load_model_config`).

    Raises `ValueError` for a mismatching checkpoint or a model transformers cannot represent.
    """
    if not isinstance(config, AlbertConfig):
        config = load_model_config(config)
    model = load_model(checkpoint, config)
    if fp32 is not None:
        save_state_dict(model.state_dict(), fp32)
    hf = to_transformers(model)
    output = Path(output)
    hf.save_pretrained(output)
    if tokenizer is not None:
        copy_tokenizer(tokenizer, output, config.max_position_embeddings)
    logger.info("exported %s to %s", checkpoint, output)
    return output



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


def export_final_model(model_config: AlbertConfig, ckpt_dir: str, tag: str, out_dir: str,
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
    model = load_consolidated(model_config, consolidate_fp32(ckpt_dir, tag))
    return write_final_model(model, out_dir, tokenizer_path)


def write_final_model(model: AlbertForPreTraining, out_dir: str, tokenizer_path: Optional[str]) -> dict[str, str]:
    """Write a run's ``final_model/`` layout (`export_final_model`) from a model in memory: ``fp32/`` always,
    ``hf/`` when transformers can represent it. Returns ``{"fp32": dir[, "hf": dir]}``."""
    model_config = model.config
    written = {}
    fp32_dir = os.path.join(out_dir, "fp32")
    os.makedirs(fp32_dir, exist_ok=True)
    # safetensors: no pickle to trust on load; the tied decoder alias is left out (export restores it)
    save_state_dict(model.state_dict(), os.path.join(fp32_dir, "model.safetensors"))
    with open(os.path.join(fp32_dir, MODEL_CONFIG), "w") as f:
        yaml.safe_dump(dataclasses.asdict(model_config), f, sort_keys=False)
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


def export_found(source: str, output: str, config: Optional[str] = None, tokenizer: Optional[str] = None,
                 fp32: Optional[str] = None) -> Path:
    """`albert-dist export`: `locate` `source`, take the model config and tokenizer found beside it unless
    `config` / `tokenizer` override them, and `export`; returns the checkpoint exported.

    A run's tokenizer that is no longer on disk is left out with a warning (the model still exports).

    Raises:
        ValueError: no config beside the checkpoint and none given; a checkpoint/config mismatch.
        OSError: a missing file.
        CheckpointError: a checkpoint that does not verify.
    """
    found = locate(source)
    model = config if config is not None else found.model
    if model is None:
        raise ValueError(f"{source}: no config beside it (albert_dist.json, a run's {RUN_CONFIG} or "
                         f"{MODEL_CONFIG}): pass --config")
    spiece = tokenizer if tokenizer is not None else found.tokenizer
    if tokenizer is None and spiece is not None and not Path(spiece).exists():
        logger.warning("the run's tokenizer %s (%s) is not there any more: exported without spiece.model; "
                       "pass --tokenizer", spiece, found.config_source)
        spiece = None
    if config is None:
        print(f"model config from {found.config_source}" + (f"; tokenizer {spiece}" if spiece else ""))
    export(found.checkpoint, model, output, spiece, fp32)
    return found.checkpoint
