"""`albert-dist export`: a run, a checkpoint or a state dict -> a transformers `save_pretrained` directory (the
command; its front end is `albert_dist.cli.export`, the weights are read by `albert_dist.runs.weights`).

    albert-dist export RUN_DIR|CHECKPOINT --output DIR [--step N] [--config YAML] [--tokenizer spiece.model]
                       [--fp32 FILE.safetensors|FILE.pt]

What it reads is what `albert_dist.runs` says the argument means (one rule for every command: a run directory's
newest verified checkpoint, or its final model when that holds the same step; ``--step N``: checkpoint
``step_N``), printed as ``RUN -> step_N, newest verified checkpoint``: a run directory, a checkpoint directory, a
DeepSpeed checkpoint (any ZeRO stage and world size, consolidated with DeepSpeed's
``get_fp32_state_dict_from_zero_checkpoint``), a final model, or a consolidated state dict (a ``.safetensors``
file, a ``torch.save(model.state_dict())`` file, e.g. DeepSpeed's ``zero_to_fp32.py`` output, or a directory
holding one).

The model config and the tokenizer come from beside it (`albert_dist.runs.source`). ``--config`` (a model preset,
configs/model/*.yaml, or a training YAML with a ``model:`` section) and ``--tokenizer`` override them; they are
needed only for a state dict that came from elsewhere. ``--fp32`` also writes the consolidated state dict, as
safetensors or pickle by its suffix (`save_state_dict`; DeepSpeed's own ``zero_to_fp32.py --safe_serialization``
fails on ALBERT's tied decoder/embedding pair, this path does not). Only ``sharing: all`` models export (see
`albert_dist.model.hf`). Needs the `hf` extra (transformers).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from albert_dist.config import load_model_config, model_config_of
from albert_dist.data.tokenizer import copy_tokenizer
from albert_dist.model.config import AlbertConfig
from albert_dist.model.hf import to_transformers
from albert_dist.runs.source import MODEL_CONFIG, RUN_CONFIG, find
from albert_dist.runs.weights import load_model, save_state_dict

logger = logging.getLogger(__name__)


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



def export_found(source: str, output: str, config: Optional[str] = None, tokenizer: Optional[str] = None,
                 fp32: Optional[str] = None, step: Optional[int] = None) -> Path:
    """`albert-dist export`: what `source` means (`albert_dist.runs.find`, `step`: ``--step N``), printed; the
    model config and tokenizer found beside it unless `config` / `tokenizer` override them; `export`. Returns the
    weights exported.

    A run's tokenizer that is no longer on disk is left out with a warning (the model still exports).

    Raises:
        ValueError: no config beside the checkpoint and none given; a checkpoint/config mismatch.
        OSError: a missing file.
        CheckpointError: a checkpoint that does not verify.
    """
    found = find(source, step=step)
    print(found.took())
    model = config if config is not None else (model_config_of({"model": found.model}, found.config_source)
                                               if found.model is not None else None)
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
    export(found.weights, model, output, spiece, fp32)
    return found.weights
