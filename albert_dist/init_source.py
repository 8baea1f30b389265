"""Where `model.init_from` points, read torch-free (the config loader takes the source's architecture and tokenizer
from it; `albert_dist.init_from` checks the job against it and loads its weights).

A source is, first match:

* a transformers ALBERT directory (``config.json``; `AlbertForPreTraining`, `AlbertModel` or `AlbertForMaskedLM`
  weights as safetensors or bin): its config (transformers' defaults for fields it omits), its own tokenizer;
* a run directory (``config.yaml``): its ``final_model/`` (``fp32/`` weights + model.yaml), else its newest
  verified checkpoint; the tokenizer is the run's ``data.tokenizer_path``, else the final model's ``hf/`` copy;
* a ``final_model/`` directory, or its ``fp32/``: the weights and model.yaml, the tokenizer as for a run;
* a checkpoint directory (``<run>/checkpoints``: its newest verified checkpoint) or a checkpoint
  ``step_<N>``: the config in its ``albert_dist.json``, the run's tokenizer;
* an MLflow run id (``<id>`` or ``runs:/<id>``): its final model or newest checkpoint artifact, downloaded once
  into ``$XDG_CACHE_HOME/albert_dist/init_from/<id>`` (`albert_dist.tracking.checkpoints.download_model`), then as
  above.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import yaml

from albert_dist.data.sources.discover import resolve_path
from albert_dist.data.tokenizer import SPIECE
from albert_dist.engine.checkpoint.layout import META_FILE, read_meta
from albert_dist.model.config import HF_FIELDS, AlbertConfig

#: AlbertConfig fields a source's config gives a new run (the architecture); `init_from` and
#: `gradient_checkpointing` (how this run trains) are the recipe's.
ARCHITECTURE = tuple(f.name for f in dataclasses.fields(AlbertConfig)
                     if f.name not in ("init_from", "gradient_checkpointing"))


@dataclasses.dataclass(frozen=True)
class InitSource:
    """A resolved `model.init_from`."""

    ref: str
    """`model.init_from` as given."""
    kind: str
    """"hf" (a transformers directory), "run" (a run's final model or checkpoint) or "mlflow" (downloaded)."""
    weights: Path
    """The transformers directory, a consolidated state dict's directory (``fp32/``) or a DeepSpeed checkpoint."""
    model: dict
    """The source's `ARCHITECTURE` fields (albert_dist's names; a transformers model's sharing is "all")."""
    tokenizer: Optional[Path]
    """A tokenizer directory (spiece.model + tokenizer_config.json) or a sentencepiece file; None: none found."""
    run_id: Optional[str] = None
    """The MLflow run of an MLflow source."""


def _fail(ref: str, why: str) -> ValueError:
    return ValueError(f"model.init_from={ref!r}: {why}")


def _architecture(fields: dict, ref: str, where: str) -> dict:
    missing = [f for f in ARCHITECTURE if f not in fields]
    if missing:
        raise _fail(ref, f"{where} lacks the model fields {missing}")
    return {f: fields[f] for f in ARCHITECTURE}


def _read_yaml(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else {}


def _tokenizer_of(run_config: dict, hf_dir: Optional[Path] = None) -> Optional[Path]:
    """The run's data.tokenizer_path when it is there (the ids the source was trained on, exactly), else a final
    model's ``hf/`` tokenizer directory (another machine's run: the exported copy)."""
    path = (run_config.get("data") or {}).get("tokenizer_path")
    if path and resolve_path(path).exists():
        return resolve_path(path)
    return hf_dir if hf_dir is not None and (hf_dir / SPIECE).is_file() else None


def _from_transformers(path: Path, ref: str) -> InitSource:
    import json

    try:
        raw = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise _fail(ref, f"{path / 'config.json'} is not JSON ({err})") from None
    if raw.get("model_type") != "albert":
        raise _fail(ref, f"model_type {raw.get('model_type')!r} in {path / 'config.json'}: not an ALBERT model")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise _fail(ref, f"position_embedding_type {raw['position_embedding_type']!r}: albert_dist has absolute "
                         "positions only")
    from transformers import AlbertConfig as HFConfig  # here: only a transformers source needs it

    hf = HFConfig.from_dict(raw)  # transformers' defaults for what save_pretrained left out
    model = {**{f: getattr(hf, f) for f in HF_FIELDS}, "sharing": "all"}
    tokenizer = path if (path / SPIECE).is_file() else None
    return InitSource(ref, "hf", path, _architecture(model, ref, str(path / "config.json")), tokenizer)


def _from_final_model(path: Path, ref: str, run_config: dict) -> InitSource:
    """`path` is a final_model/ directory (fp32/ + hf/)."""
    fp32 = path / "fp32"
    model = _read_yaml(fp32 / "model.yaml")
    return InitSource(ref, "run", fp32, _architecture(model, ref, str(fp32 / "model.yaml")),
                      _tokenizer_of(run_config, path / "hf"))


def _from_checkpoint(path: Path, ref: str) -> InitSource:
    config = read_meta(path).get("config") or {}
    if not config.get("model"):
        raise _fail(ref, f"{path / META_FILE} carries no config")
    return InitSource(ref, "run", path, _architecture(config["model"], ref, str(path / META_FILE)),
                      _tokenizer_of(config))


def _newest_checkpoint(ckpt_dir: Path, ref: str) -> Path:
    from albert_dist.engine.checkpoint.choose import newest_verified

    point = newest_verified(ckpt_dir, log=True) if ckpt_dir.is_dir() else None
    if point is None:
        raise _fail(ref, f"no final_model/ and no verified checkpoint in {ckpt_dir}")
    return Path(point.path)


def resolve_local(path: Path, ref: str) -> InitSource:
    """The source a local directory is (module docstring's rules). Raises ValueError naming `ref` and why."""
    if not path.is_dir():
        raise _fail(ref, "no such directory (nor an MLflow run id: 32 hex digits or runs:/<id>)")
    if (path / "config.json").is_file():
        return _from_transformers(path, ref)
    if (path / "config.yaml").is_file():  # a run directory
        run_config = _read_yaml(path / "config.yaml")
        if (path / "final_model" / "fp32" / "model.yaml").is_file():
            return _from_final_model(path / "final_model", ref, run_config)
        ckpt_dir = (run_config.get("checkpoint") or {}).get("dir") or path / "checkpoints"
        return _from_checkpoint(_newest_checkpoint(Path(ckpt_dir), ref), ref)
    if (path / "fp32" / "model.yaml").is_file():
        return _from_final_model(path, ref, _read_yaml(path.parent / "config.yaml"))
    if (path / "model.yaml").is_file() and path.name == "fp32":
        return _from_final_model(path.parent, ref, _read_yaml(path.parent.parent / "config.yaml"))
    if (path / META_FILE).is_file():
        return _from_checkpoint(path, ref)
    if (path / "latest").is_file() or any(p.name.startswith("step_") for p in path.iterdir()):
        return _from_checkpoint(_newest_checkpoint(path, ref), ref)
    raise _fail(ref, "neither a transformers ALBERT directory (config.json), a run directory (config.yaml), a "
                     "final model (fp32/model.yaml) nor a checkpoint (albert_dist.json)")


def cache_dir(run_id: str) -> Path:
    """Where an MLflow source is downloaded: ``$XDG_CACHE_HOME/albert_dist/init_from/<run_id>`` (per user)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "albert_dist" / "init_from" / run_id


def resolve(ref: str, tracking_uri: Optional[str] = None) -> InitSource:
    """The source `model.init_from` = `ref` names: a local directory (relative: to the working directory, else
    the checkout) or an MLflow run id in the store `tracking_uri` (None: MLFLOW_TRACKING_URI or the default).

    Raises:
        ValueError: naming `model.init_from`, the value and why (no such directory or run, not an ALBERT, no
            model config, no final model or checkpoint in the run).
    """
    path = resolve_path(ref)
    if path.exists():
        return resolve_local(path, ref)
    from albert_dist.tracking.tracker import parse_run_ref

    try:
        run_id = parse_run_ref(ref)
    except ValueError:
        raise _fail(ref, "no such directory, and not an MLflow run id (32 hex digits or runs:/<id>)") from None
    local = _download(run_id, tracking_uri, ref)
    found = resolve_local(local, ref)
    tokenizer = found.tokenizer
    if tokenizer is None and (cache_dir(run_id) / "tokenizer").is_dir():  # the run's logged tokenizer artifact
        files = sorted((cache_dir(run_id) / "tokenizer").iterdir())
        tokenizer = files[0] if len(files) == 1 else cache_dir(run_id) / "tokenizer"
    return dataclasses.replace(found, kind="mlflow", tokenizer=tokenizer, run_id=run_id)


def _download(run_id: str, tracking_uri: Optional[str], ref: str) -> Path:
    from albert_dist.tracking.fetch import download_run_model
    from albert_dist.tracking.tracker import require_existing_store, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    try:
        require_existing_store(uri, f"MLflow run {run_id}")
        return download_run_model(uri, run_id, str(cache_dir(run_id)))
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: MLflow's errors too (RunReadError)
        raise _fail(ref, f"MLflow run {run_id} ({uri}): {exc}") from None

