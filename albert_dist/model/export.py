"""`albert-dist export`: a consolidated fp32 checkpoint -> a transformers `save_pretrained` directory.

    albert-dist export CHECKPOINT --config MODEL_OR_TRAIN_YAML --output DIR [--tokenizer spiece.model]

CHECKPOINT is a file written by ``torch.save(model.state_dict())`` (e.g. DeepSpeed's
``zero_to_fp32.py`` output) or a directory holding ``pytorch_model.bin`` or ``model.pt``. The YAML is a model
preset (configs/model/*.yaml) or a training config with a ``model:`` section. Only ``sharing: all`` models
export (see `albert_dist.model.hf`). Needs the `hf` extra (transformers).
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.config import AlbertConfig

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("pytorch_model.bin", "model.pt")
#: Tied keys a consolidated checkpoint may leave out (restored from the tensor they are tied to).
TIED_KEYS = {"predictions.decoder.weight"}


def load_config(path: str | Path) -> AlbertConfig:
    """The model config from a flat preset or from the ``model:`` section of a training YAML (a run's
    config.yaml), through the package's one YAML loader (`albert_dist.config.load_model_config`)."""
    from albert_dist.config import load_model_config

    return load_model_config(path)


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a consolidated state dict (file, or a directory with one of CHECKPOINT_NAMES), fp32 on CPU.

    A ``{"module": state_dict}`` wrapper and a ``module.`` key prefix (DDP/DeepSpeed) are removed.
    Raises `FileNotFoundError` when no checkpoint file is found.
    """
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in CHECKPOINT_NAMES if (path / n).is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: no {' or '.join(CHECKPOINT_NAMES)} in this directory")
        path = found[0]
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


def export(checkpoint: str | Path, config_path: str | Path, output: str | Path,
           tokenizer: str | Path | None = None) -> Path:
    """Write ``output`` as a transformers `AlbertForPreTraining` directory (config.json + safetensors).

    Raises `ValueError` for a mismatching checkpoint or a model transformers cannot represent.
    """
    from albert_dist.model.hf import to_transformers

    config = load_config(config_path)
    hf = to_transformers(load_model(checkpoint, config))
    output = Path(output)
    hf.save_pretrained(output)
    if tokenizer is not None:
        from albert_dist.data.tokenizer import write_transformers_config

        shutil.copyfile(tokenizer, output / "spiece.model")
        write_transformers_config(output, config.max_position_embeddings)
    logger.info("exported %s to %s", checkpoint, output)
    return output


def cli(argv: list[str]) -> int:
    """`albert-dist export CHECKPOINT --config YAML --output DIR [--tokenizer spiece.model]`; returns 0, or 2 (with
    one line on stderr) for a missing file or a checkpoint/config mismatch."""
    parser = argparse.ArgumentParser(prog="albert-dist export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="consolidated state-dict file or a directory holding one")
    parser.add_argument("--config", required=True, help="model preset or training YAML (model: section)")
    parser.add_argument("--output", required=True, help="directory to write (transformers save_pretrained)")
    parser.add_argument("--tokenizer", default=None,
                        help="sentencepiece model to copy as spiece.model (+ tokenizer_config.json for transformers)")
    args = parser.parse_args(argv)
    try:
        export(args.checkpoint, args.config, args.output, args.tokenizer)
    except (FileNotFoundError, ValueError) as err:  # a wrong path or config: one line, not a traceback
        print(f"albert-dist export: {err}", file=sys.stderr)
        return 2
    print(f"exported to {args.output}")
    return 0
