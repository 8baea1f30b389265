"""What `albert-dist finetune MODEL` fine-tunes: the encoder weights, model config, tokenizer, checkpoint step
and pretraining run of a run directory, an MLflow run id, or a transformers ALBERT directory.

* a run directory (its ``config.yaml``) or an MLflow run id (``<id>`` or ``runs:/<id>``): what `albert_dist.runs`
  says it means, the rule every command follows (its newest verified checkpoint, consolidated, or its final model
  when that holds the same step; ``--step N``: checkpoint ``step_N``), printed as ``RUN -> step_N, why``.
  Tokenizer: the run's ``data.tokenizer_path`` (an MLflow run's ``tokenizer/`` artifact when that is not on this
  machine). Pretraining run: the one its ``mlflow_run.json`` names, in the store recorded there;
* a transformers ALBERT directory (``config.json``, any ALBERT head or none): the encoder weights through
  `albert_dist.model.hf.from_transformers`, the tokenizer the directory's own.

The weights are read only by `ModelSource.encoder_state` (``--init random`` never reads them).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from albert_dist.model.config import AlbertConfig

log = logging.getLogger(__name__)


#: Files of which a transformers directory needs one to hold a tokenizer (sentencepiece's, or a `tokenizers` JSON).
TOKENIZER_FILES = ("spiece.model", "tokenizer.json")


class SourceError(ValueError):
    """A model that cannot be fine-tuned as given (no such run, step or tokenizer): the CLI's exit 2."""


@dataclasses.dataclass
class ModelSource:
    """A resolved `albert-dist finetune` model argument."""

    kind: str
    """"run", "mlflow" or "hf"."""
    description: str
    """What was read (path or run id, checkpoint), for params and messages."""
    config: AlbertConfig
    """The encoder's config."""
    tokenizer: Any
    """A transformers tokenizer giving the ids the model was pretrained on."""
    step: Optional[int]
    """Optimizer step of the checkpoint (None: unknown, e.g. a transformers directory)."""
    load_state: Callable[[], dict[str, torch.Tensor]]
    """Reads the pretraining state dict (`AlbertForPreTraining` names, fp32, CPU)."""
    run_dir: Optional[Path] = None
    """The pretraining run directory, where downstream.json goes; None for other sources."""
    parent_run_id: Optional[str] = None
    """The pretraining run in MLflow (None: not tracked, or unknown)."""
    tracking_uri: Optional[str] = None
    """The store the pretraining run lives in (None: the default store)."""
    identity: str = ""
    """The model whatever named it: ``mlflow:<run id>`` for a tracked run (its directory or its id), else
    ``path:<resolved directory>``; `albert_dist.apps.finetune.run.same_finetune` keys downstream.json entries by it."""

    def encoder_state(self) -> dict[str, torch.Tensor]:
        """The pretraining state dict; `SourceError` when it does not load."""
        try:
            return self.load_state()
        except (OSError, ValueError, RuntimeError) as exc:
            raise SourceError(f"{self.description}: {exc}") from exc


def sentencepiece_tokenizer(path: str | Path) -> Any:
    """transformers' `AlbertTokenizer` over the sentencepiece model ``path`` with the settings the run's
    export writes (`albert_dist.data.tokenizer.write_transformers_config`: the model's own normaliser only),
    so its ids are sentencepiece's, i.e. those of pretraining.

    Raises:
        SourceError: the file is missing or lacks ALBERT's special ids.
    """
    from albert_dist.data.tokenizer import copy_tokenizer, load_tokenizer

    try:
        load_tokenizer(str(path))  # checks ALBERT's special ids
    except ValueError as exc:
        raise SourceError(str(exc)) from exc
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:  # a tokenizer directory (model.init_from's) with its settings
        copy_tokenizer(path, tmp)
        return AutoTokenizer.from_pretrained(tmp)


def _run_tokenizer(tokenizer_path: Optional[Path], where: str) -> Any:
    if tokenizer_path is None:
        raise SourceError(f"{where}: the run's config names no tokenizer (data.tokenizer_path)")
    if not Path(tokenizer_path).exists():
        raise SourceError(f"{where}: the run's tokenizer {tokenizer_path} is not there any more")
    return sentencepiece_tokenizer(tokenizer_path)


def _from_source(found: Any, kind: str, description: str, tokenizer_where: str, **extra: Any) -> ModelSource:
    """A `ModelSource` of an `albert_dist.runs.Source` (a run's checkpoint or final model), its line printed."""
    from albert_dist.config import model_config_of
    from albert_dist.runs.weights import load_state_dict

    if found.model is None:
        raise SourceError(f"{found.ref}: no model config found beside {found.weights}")
    try:
        config = model_config_of({"model": found.model}, found.config_source)
    except ValueError as exc:
        raise SourceError(str(exc)) from exc
    print(found.took(), flush=True)
    return ModelSource(kind, description, config, _run_tokenizer(found.tokenizer, tokenizer_where), found.step,
                       lambda: load_state_dict(found.weights), **extra)


def from_run_dir(run_dir: Path, step: Optional[int]) -> ModelSource:
    """What a run directory means (`albert_dist.runs`: its newest verified checkpoint, or its final model when
    that holds the same step; ``--step N``: checkpoint ``step_N``); see the module docstring.

    Raises:
        SourceError: no such checkpoint step (naming the retained ones), no final model nor checkpoint, no
            tokenizer, a config that is not a model config.
    """
    from albert_dist.engine.checkpoint.layout import CheckpointError
    from albert_dist.runs import find
    from albert_dist.tracking.tracker import read_state

    try:
        found = find(run_dir, str(run_dir), step)
    except (FileNotFoundError, CheckpointError) as exc:
        raise SourceError(str(exc)) from exc
    state = read_state(run_dir)
    where = found.weights.relative_to(run_dir) if found.weights.is_relative_to(run_dir) else found.weights
    return _from_source(found, "run", f"{run_dir} ({where})", str(run_dir), run_dir=run_dir,
                        parent_run_id=state.get("run_id"), tracking_uri=state.get("tracking_uri"),
                        identity=f"mlflow:{state['run_id']}" if state.get("run_id") else f"path:{run_dir.resolve()}")


def from_transformers_dir(path: Path) -> ModelSource:
    """A transformers ALBERT directory: its config and encoder weights, its own tokenizer.

    Raises:
        SourceError: not an ALBERT model, no tokenizer in the directory, or a model albert_dist cannot hold.
    """
    import transformers

    try:
        hf_config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: not a transformers model directory ({exc})") from exc
    if hf_config.model_type != "albert":
        raise SourceError(f"{path}: model_type {hf_config.model_type!r}, not an ALBERT model")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        # transformers 5 builds an empty tokenizer (special tokens only) from a directory without one
        raise SourceError(f"{path}: no tokenizer in the model directory (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise SourceError(f"{path}: no tokenizer in the model directory ({type(exc).__name__}: {exc})") from exc
    from albert_dist.model.hf import HF_FIELDS

    try:
        config = AlbertConfig(**{name: getattr(hf_config, name) for name in HF_FIELDS}, sharing="all")
    except ValueError as exc:
        raise SourceError(f"{path}/config.json: {exc}") from exc

    def load() -> dict[str, torch.Tensor]:
        from albert_dist.runs.weights import load_transformers

        # any ALBERT head loads: the pretraining heads a directory lacks (e.g. run_mlm's AlbertForMaskedLM has
        # no SOP head, nor a pooler) start fresh, as transformers' own AlbertForSequenceClassification does
        state, missing = load_transformers(path)  # silenced: "Loading weights" would sit above finetune's bar
        fresh = sorted({k.rsplit(".", 1)[0] for k in missing})
        if fresh:  # said once, since the pooler feeds the classifier: a fresh one is a different model
            log.warning("%s: no weights for %s in the directory; they start from random init", path,
                        ", ".join(fresh))
        return state

    return ModelSource("hf", str(path), config, tokenizer, None, load, identity=f"path:{path.resolve()}")


def from_mlflow_run(ref: str, step: Optional[int], tracking_uri: Optional[str], cache_dir: Path) -> ModelSource:
    """What MLflow run `ref` means (`albert_dist.runs.mlflow.fetch`: the run directory's rule over its artifacts),
    downloaded into `cache_dir`.

    Raises:
        SourceError: the run or its weights cannot be fetched, or no tokenizer can be found.
    """
    from albert_dist.runs.mlflow import fetch
    from albert_dist.tracking.tracker import parse_run_ref, require_existing_store, resolve_tracking_uri

    run_id = parse_run_ref(ref)
    uri = resolve_tracking_uri(tracking_uri)
    try:
        require_existing_store(uri, f"MLflow run {run_id}")
    except ValueError as exc:
        raise SourceError(str(exc)) from exc
    try:
        found = fetch(ref, run_id, uri, step, cache_dir)
    except (FileNotFoundError, RuntimeError) as exc:  # RuntimeError: RunReadError too
        hint = ("; is this the store the pretraining job logged to? (--tracking-uri or MLFLOW_TRACKING_URI)"
                if getattr(exc, "run_not_found", False) else "")
        raise SourceError(f"MLflow run {run_id} ({uri}): {exc}{hint}") from exc
    what = f"checkpoint step {found.step}" if found.kind == "checkpoint" else "final model"
    return _from_source(found, "mlflow", f"runs:/{run_id} ({what})", f"MLflow run {run_id}",
                        run_dir=found.run_dir, parent_run_id=run_id, tracking_uri=uri, identity=f"mlflow:{run_id}")


def resolve(model: str, step: Optional[int], tracking_uri: Optional[str], cache_dir: Path) -> ModelSource:
    """`albert-dist finetune`'s MODEL: a run directory, a transformers directory or an MLflow run reference.

    Raises:
        SourceError: none of them, or the one it is cannot be read (see the ``from_*`` functions).
    """
    path = Path(model)
    if path.is_dir():
        if (path / "config.yaml").is_file():
            return from_run_dir(path, step)
        if (path / "config.json").is_file():
            if step is not None:
                raise SourceError(f"--step {step}: {path} is a transformers directory, which holds one model")
            return from_transformers_dir(path)
        raise SourceError(f"{path}: neither a run directory (config.yaml) nor a transformers model (config.json)")
    from albert_dist.tracking.tracker import parse_run_ref

    try:
        parse_run_ref(model)
    except ValueError:
        raise SourceError(f"{model}: no such directory, and not an MLflow run id (32 hex digits or runs:/<id>)") from None
    return from_mlflow_run(model, step, tracking_uri, cache_dir)


def check_vocabulary(source: ModelSource) -> None:
    """`SourceError` when the tokenizer has more pieces than the model's `vocab_size` (ids past the embedding
    table, or a tokenizer of another model). Fewer pieces is the run `albert-dist train` warned about and trained
    (the rows past the tokenizer never trained and no id reaches them): accepted, as train accepts it
    (docs/data-tokenizer.md)."""
    size = len(source.tokenizer)
    if size > source.config.vocab_size:
        raise SourceError(f"{source.description}: the tokenizer has {size} pieces but the model's vocab_size is "
                          f"{source.config.vocab_size}")


def describe(source: ModelSource) -> dict[str, Any]:
    """JSON-able summary of a source for downstream.json and MLflow params."""
    return {"kind": source.kind, "model": source.description, "step": source.step,
            "pretraining_run_id": source.parent_run_id,
            "config": json.loads(json.dumps(dataclasses.asdict(source.config)))}
