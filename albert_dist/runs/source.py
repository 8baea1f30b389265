"""What a job left behind -> one `Source` record, by one rule (docs/checkpoints.md, "Which weights a run means").

The rule (`choose`): **a run means its newest verified checkpoint; its final model when that holds the same step
(the same weights, already consolidated) or when no checkpoint is left; ``--step N``: the checkpoint ``step_N``
(or the final model when it holds step N).** It is the same for every reader: `albert-dist export`,
`model.init_from`, `albert-dist finetune`, and for a run read from MLflow (`albert_dist.runs.mlflow`).

What a reference may be (`find`, first match):

* a transformers ALBERT directory (``config.json``): its weights, its config, its own tokenizer;
* a run directory (``config.yaml``): the rule above over its checkpoint directory (``checkpoint.dir``, else
  ``<run>/checkpoints``) and its final model;
* a final model directory (``fp32/`` + ``hf/``) or its ``fp32/``: those weights;
* a DeepSpeed checkpoint ``step_<N>`` (``albert_dist.json``, or DeepSpeed's ``*model_states.pt``): that one;
* a checkpoint directory (``latest`` or ``step_<N>`` directories): its newest verified checkpoint (``--step N``);
* a consolidated state dict: a ``.safetensors`` / ``torch.save`` file, or a directory holding one.

The model config comes from beside the weights: a checkpoint's ``albert_dist.json``, a final model's
``model.yaml``, else the ``config.yaml`` of the run it lies in (up to three levels up). The tokenizer is the run's
``data.tokenizer_path`` when it is on disk, else the final model's ``hf/`` copy; a transformers directory's own.
This module reads files only: no torch, no DeepSpeed (the weights are read by `albert_dist.runs.weights`).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import yaml

from albert_dist.data.sources.discover import resolve_path
from albert_dist.engine.checkpoint.choose import newest_verified
from albert_dist.engine.checkpoint.layout import (LATEST, META_FILE, CheckpointError, read_meta, step_dirs, step_of,
                                                 tag_for, verify)

#: The run's resolved config, written by the trainer into the run directory.
RUN_CONFIG = "config.yaml"
#: Where a run's end-of-training model lies in its run directory (`albert_dist.apps.pretrain.run_tracking.log_trained_model`).
FINAL_MODEL = "final_model"
#: The model config written beside a consolidated state dict (`albert_dist.runs.weights.write_trained_model`).
MODEL_CONFIG = "model.yaml"
#: The step a final model holds, beside its model.yaml (`albert_dist.runs.weights.STEP_FILE`).
STEP_FILE = "step.json"
#: Files a consolidated state dict is held in (`albert_dist.runs.weights.CHECKPOINT_NAMES`).
STATE_DICT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt")
#: Files of which a directory needs one to hold a tokenizer (sentencepiece's, or transformers 5's `tokenizers` JSON).
TOKENIZER_FILES = ("spiece.model", "tokenizer.json")
#: How the files DeepSpeed writes into every checkpoint tag directory end.
_DEEPSPEED_MARKER = "model_states.pt"


class SourceNotFound(FileNotFoundError):
    """A reference that names nothing readable (no such path, no checkpoint nor final model, no step N)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One reference resolved: which weights, at which step, why, and what lies beside them."""

    ref: str
    """The reference as given (a path or an MLflow run id)."""
    kind: str
    """"checkpoint" (a DeepSpeed tag directory), "state_dict" (a consolidated state dict: a final model's
    ``fp32/``, a file or a directory holding one) or "hf" (a transformers directory)."""
    weights: Path
    """The tag directory, the state dict (file or directory), or the transformers directory."""
    step: Optional[int]
    """The optimizer step the weights hold; None when unknown (a transformers directory, an unrecorded file)."""
    why: str
    """Which rule picked them, for the line each command prints ("newest verified checkpoint", "--step 20")."""
    model: Optional[dict] = None
    """The model section found beside the weights (albert_dist's field names), None when none was found."""
    tokenizer: Optional[Path] = None
    """The tokenizer (a sentencepiece file or a tokenizer directory); None when none was found."""
    config_source: str = ""
    """The file `model` came from, for messages."""
    run_dir: Optional[Path] = None
    """The run directory the weights belong to, when known."""
    run_id: Optional[str] = None
    """The MLflow run of an MLflow reference."""

    def took(self) -> str:
        """The line a command prints: ``runs/x -> step_41, newest verified checkpoint``."""
        name = (tag_for(self.step) if self.kind == "checkpoint" and self.step is not None
                else f"final model (step {self.step})" if self.step is not None and self.kind == "state_dict"
                else str(self.weights))
        return f"{self.ref} -> {name}, {self.why}"


def choose(newest: Optional[int], final: Optional[int], has_final: bool, step: Optional[int]) -> Optional[str]:
    """The rule, on what a run holds: `newest` its newest verified (or complete) checkpoint's step (None: none),
    `final` the step its final model records (None: unrecorded), `has_final` whether it has a final model,
    `step` the step asked for (None: the newest). Returns "final", "checkpoint" or None (nothing fits)."""
    if step is not None:
        return "final" if has_final and final == step else None  # the caller looks for checkpoint step_<step>
    if has_final and (newest is None or final == newest):
        return "final"
    return "checkpoint" if newest is not None else None


def read_run_config(run_dir: Path) -> Optional[dict]:
    """The resolved TrainConfig of a run directory as plain dicts (its config.yaml), or None."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) and isinstance(data.get("model"), dict) else None


def checkpoint_dir(run_dir: Path, config: dict) -> Path:
    """A run's checkpoint directory: its config's ``checkpoint.dir``, else ``<run>/checkpoints``."""
    return Path((config.get("checkpoint") or {}).get("dir") or run_dir / "checkpoints")


def final_step(final_dir: Path) -> Optional[int]:
    """The step a final model directory (or its ``fp32/``) records; None when it records none."""
    fp32 = final_dir if (final_dir / MODEL_CONFIG).is_file() else final_dir / "fp32"
    try:
        return int(json.loads((fp32 / STEP_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def has_tokenizer(path: Path) -> bool:
    """Whether directory `path` holds a tokenizer (`TOKENIZER_FILES`)."""
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _tokenizer(run_config: dict, hf_dir: Optional[Path] = None) -> Optional[Path]:
    path = (run_config.get("data") or {}).get("tokenizer_path")
    if path and resolve_path(path).exists():
        return resolve_path(path)
    if hf_dir is not None and hf_dir.is_dir() and has_tokenizer(hf_dir):
        return hf_dir
    return resolve_path(path) if path else None  # not on disk: the caller says so


def is_deepspeed_checkpoint(path: Path) -> bool:
    """A DeepSpeed tag directory (its ``*model_states.pt``)."""
    return path.is_dir() and any(p.name.endswith(_DEEPSPEED_MARKER) for p in path.iterdir())


def _checkpoint(path: Path, ref: str, why: str, run_dir: Optional[Path] = None) -> Source:
    """The DeepSpeed checkpoint `path`: its config from its albert_dist.json, else the run's config.yaml."""
    meta = read_meta(path) if (path / META_FILE).is_file() else {}
    config, where = meta.get("config") or {}, str(path / META_FILE)
    run_dir = run_dir or path.parent.parent
    if not config.get("model"):
        config, where = read_run_config(run_dir) or {}, str(run_dir / RUN_CONFIG)
    step = int(meta["step"]) if "step" in meta else step_of(path.name)
    return Source(ref, "checkpoint", path, step, why, config.get("model") or None,
                  _tokenizer(config, run_dir / FINAL_MODEL / "hf") if config else None,
                  where if config else "", run_dir if (run_dir / RUN_CONFIG).is_file() else None)


def _final(path: Path, ref: str, why: str, run_dir: Optional[Path], step: Optional[int] = None) -> Source:
    """The final model directory `path` (``fp32/`` + ``hf/``)."""
    fp32 = path / "fp32"
    model = yaml.safe_load((fp32 / MODEL_CONFIG).read_text()) if (fp32 / MODEL_CONFIG).is_file() else None
    run_config = (read_run_config(run_dir) if run_dir is not None else None) or {}
    return Source(ref, "state_dict", fp32, final_step(path) if step is None else step, why,
                  model if isinstance(model, dict) else None, _tokenizer(run_config, path / "hf"),
                  str(fp32 / MODEL_CONFIG), run_dir)


def _from_run(run_dir: Path, ref: str, step: Optional[int]) -> Source:
    """A run directory, by the rule (`choose`)."""
    config = read_run_config(run_dir) or {}
    ckpt_dir = checkpoint_dir(run_dir, config)
    final_dir = run_dir / FINAL_MODEL
    has_final = (final_dir / "fp32" / MODEL_CONFIG).is_file()
    recorded = final_step(final_dir) if has_final else None
    if step is not None:
        if choose(None, recorded, has_final, step) == "final":
            return _final(final_dir, ref, f"--step {step}, the final model", run_dir)
        tag_dir = ckpt_dir / tag_for(step)
        if not tag_dir.is_dir():
            kept = [s for s, _ in step_dirs(ckpt_dir)] if ckpt_dir.is_dir() else []
            raise SourceNotFound(f"--step {step}: no checkpoint {tag_dir} (retained steps: "
                                 f"{sorted(kept) or 'none'})")
        reason = verify(tag_dir)
        if reason is not None:
            raise CheckpointError(f"--step {step}: checkpoint {tag_dir} does not verify: {reason}")
        return _checkpoint(tag_dir, ref, f"--step {step}", run_dir)
    point = newest_verified(ckpt_dir, log=True) if ckpt_dir.is_dir() else None
    picked = choose(point.step if point else None, recorded, has_final, None)
    if picked == "final":
        why = ("the final model, no checkpoint left" if point is None else
               f"the final model, the same step as the newest verified checkpoint")
        # an unrecorded final model with no checkpoint left: the step the run was configured to end at
        at = recorded if recorded is not None else config.get("max_steps") if isinstance(
            config.get("max_steps"), int) and point is None else None
        return _final(final_dir, ref, why, run_dir, at)
    if picked == "checkpoint":
        return _checkpoint(point.path, ref, "newest verified checkpoint", run_dir)
    raise SourceNotFound(f"{ref}: a run directory without a final model and without a checkpoint in {ckpt_dir}")


def _from_transformers(path: Path, ref: str) -> Source:
    return Source(ref, "hf", path, None, "a transformers directory", None, path if has_tokenizer(path) else None,
                  str(path / "config.json"))


def _beside(path: Path, ref: str, why: str) -> Source:
    """A consolidated state dict (file or directory): the model.yaml beside it, else its run's config.yaml."""
    folder = path if path.is_dir() else path.parent
    model = yaml.safe_load((folder / MODEL_CONFIG).read_text()) if (folder / MODEL_CONFIG).is_file() else None
    for run_dir in list(path.parents)[:3]:
        config = read_run_config(run_dir)
        if config is not None:
            hf = folder.parent / "hf" if folder.name == "fp32" else None
            return Source(ref, "state_dict", path, final_step(folder), why,
                          model if isinstance(model, dict) else config["model"], _tokenizer(config, hf),
                          str(folder / MODEL_CONFIG) if isinstance(model, dict) else str(run_dir / RUN_CONFIG),
                          run_dir)
    return Source(ref, "state_dict", path, final_step(folder), why, model if isinstance(model, dict) else None,
                  None, str(folder / MODEL_CONFIG) if isinstance(model, dict) else "")


def find(path: str | Path, ref: Optional[str] = None, step: Optional[int] = None) -> Source:
    """The `Source` a local path means (module docstring: the kinds, first match, and the rule).

    Args:
        path: the path; ref: the reference as the user gave it (default: `path`), for messages;
        step: ``--step N`` (a run or checkpoint directory's checkpoint ``step_N``); None: the rule's newest.

    Raises:
        SourceNotFound: no such path; a run or checkpoint directory with nothing to take; no step `step`; a
            `step` given for a source that holds one model.
        CheckpointError: checkpoints exist but none verifies (each listed with its reason), or step N does not.
    """
    path = Path(path)
    ref = str(path) if ref is None else ref
    if not path.exists():
        raise SourceNotFound(f"{ref}: no such run, checkpoint or file")
    if path.is_dir() and (path / RUN_CONFIG).is_file() and not (path / "config.json").is_file():
        return _from_run(path, ref, step)
    checkpoints = path.is_dir() and ((path / LATEST).is_file() or bool(step_dirs(path)))
    if step is not None and not checkpoints:
        raise SourceNotFound(f"--step {step}: {ref} holds one model, not a run's checkpoints")
    if path.is_dir() and (path / "config.json").is_file():
        return _from_transformers(path, ref)
    if path.is_dir() and (path / "fp32" / MODEL_CONFIG).is_file():
        return _final(path, ref, "a final model", path.parent if (path.parent / RUN_CONFIG).is_file() else None)
    if path.is_dir() and ((path / META_FILE).is_file() or is_deepspeed_checkpoint(path)):
        return _checkpoint(path, ref, "the checkpoint named")
    if checkpoints:
        if step is not None:
            tag_dir = path / tag_for(step)
            if not tag_dir.is_dir():
                raise SourceNotFound(f"--step {step}: no checkpoint {tag_dir} (retained steps: "
                                     f"{sorted(s for s, _ in step_dirs(path)) or 'none'})")
            return _checkpoint(tag_dir, ref, f"--step {step}")
        point = newest_verified(path, log=True)
        if point is None:
            raise SourceNotFound(f"{ref}: a checkpoint directory without a checkpoint")
        return _checkpoint(point.path, ref, "newest verified checkpoint")
    if path.is_dir() and not any((path / name).is_file() for name in STATE_DICT_NAMES):
        raise SourceNotFound(f"{ref}: neither a transformers ALBERT directory (config.json), a run directory "
                             f"({RUN_CONFIG}), a final model (fp32/{MODEL_CONFIG}), a checkpoint ({META_FILE}) nor a "
                             f"state dict ({', '.join(STATE_DICT_NAMES)})")
    return _beside(path, ref, "the state dict named")


__all__ = ["FINAL_MODEL", "RUN_CONFIG", "Source", "SourceNotFound", "checkpoint_dir", "choose", "find",
           "has_tokenizer", "read_run_config"]
