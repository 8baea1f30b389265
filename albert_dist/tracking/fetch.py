"""An MLflow run's artifacts fetched for a later job (`--resume-from`, `model.init_from`, a fine-tuning MODEL):
MLflow's client and its exceptions stay in tracking/; callers get local paths and `RunReadError`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from albert_dist.tracking.checkpoints import FINAL_MODEL_ARTIFACT_DIR, complete_checkpoints, download_checkpoint

#: The final model's fp32 weights (model.safetensors + model.yaml) in a run's artifacts.
FINAL_FP32_ARTIFACT = f"{FINAL_MODEL_ARTIFACT_DIR}/fp32"


class RunReadError(RuntimeError):
    """MLflow could not read a run or its artifacts (an `MlflowException`: its message, and its `error_code`, ''
    when it has none)."""

    def __init__(self, message: str, error_code: str = ""):
        super().__init__(message)
        self.error_code = error_code

    @property
    def run_not_found(self) -> bool:
        """The server has no such run (MLflow's RESOURCE_DOES_NOT_EXIST naming a run, not an artifact)."""
        return self.error_code == "RESOURCE_DOES_NOT_EXIST" and "Run" in str(self)


def _client(uri: str) -> Any:
    from mlflow import MlflowClient  # here: importing MLflow costs seconds, and only a run's reader needs it

    return MlflowClient(uri)


@contextlib.contextmanager
def _read_errors() -> Iterator[None]:
    """MLflow's exceptions raised inside, as `RunReadError` (the same message)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise RunReadError(str(exc), str(getattr(exc, "error_code", "") or "")) from exc


def download_run_checkpoint(uri: str, run_id: str, save_dir: str, step: Optional[int] = None) -> tuple[int, str]:
    """`albert_dist.tracking.checkpoints.download_checkpoint` of run `run_id` in the store at `uri`
    (`albert_dist.runs.mlflow`: `--resume-from` and a run's weights): ``(step, tag_dir)``.

    Raises:
        as `download_checkpoint`; RunReadError: MLflow cannot read the run or its artifacts.
    """
    with _read_errors():
        return download_checkpoint(_client(uri), run_id, save_dir, step)


@dataclass(frozen=True)
class RunHoldings:
    """What an MLflow run holds of weights (`run_holdings`), read without downloading them."""

    checkpoints: tuple[int, ...]
    """Steps of its complete checkpoint artifacts, newest first."""
    has_final: bool
    """Whether it logged a final model (``model/fp32/model.safetensors``)."""
    final_step: Optional[int]
    """The step its final model records (``model/fp32/step.json``); None when unrecorded or none."""
    max_steps: Optional[int]
    """The run's ``max_steps`` param (the step an unrecorded final model was meant to end at); None without it."""
    run_dir: Optional[str]
    """The run's ``run_dir`` tag (the pretraining job's run directory on its machine), None when untagged."""


def run_holdings(uri: str, run_id: str) -> RunHoldings:
    """Which weights MLflow run `run_id` holds (its complete checkpoints, its final model and the step it records).

    Raises:
        RunReadError: MLflow cannot read the run or its artifacts.
    """
    import json
    import tempfile

    client = _client(uri)
    with _read_errors():
        run = client.get_run(run_id)
        steps = tuple(s for s, _ in complete_checkpoints(client, run_id))
        names = {f.path for f in client.list_artifacts(run_id, FINAL_FP32_ARTIFACT)}
        has_final = f"{FINAL_FP32_ARTIFACT}/model.safetensors" in names
        final_step = None
        if f"{FINAL_FP32_ARTIFACT}/step.json" in names:
            with tempfile.TemporaryDirectory() as tmp:
                path = client.download_artifacts(run_id, f"{FINAL_FP32_ARTIFACT}/step.json", tmp)
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    final_step = int(json.loads(Path(path).read_text())["step"])
    max_steps = run.data.params.get("max_steps")
    return RunHoldings(steps, has_final, final_step, int(max_steps) if max_steps and max_steps.isdigit() else None,
                       run.data.tags.get("run_dir") or None)


def download_run_trained_model(uri: str, run_id: str, dest: str) -> Path:
    """Run `run_id`'s final model (its ``model/`` artifacts: ``fp32/`` and ``hf/``) as the directory `dest`, once
    (a second call, e.g. another rank's, finds it there): downloaded into a temporary directory and renamed, so a
    reader never sees half of one.

    Raises:
        RunReadError: MLflow cannot read the run or its artifacts.
    """
    import os
    import shutil
    import tempfile

    if os.path.isfile(os.path.join(dest, "fp32", "model.safetensors")):
        return Path(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".mlflow_download_", dir=os.path.dirname(dest))
    try:
        with _read_errors():
            _client(uri).download_artifacts(run_id, FINAL_MODEL_ARTIFACT_DIR, tmp)
        try:
            os.rename(os.path.join(tmp, FINAL_MODEL_ARTIFACT_DIR), dest)
        except OSError:  # another process renamed its copy first
            if not os.path.isdir(dest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Path(dest)


def download_run_tokenizer(uri: str, run_id: str, cache_dir: Path) -> Optional[Path]:
    """Run `run_id`'s ``tokenizer/`` artifact (`albert_dist.apps.pretrain.run_tracking`) downloaded into ``cache_dir/tokenizer``:
    its one file (a sentencepiece model), or the directory when it holds several (a tokenizer directory); None when
    the run logged none. Raises `RunReadError` when MLflow cannot list or read it."""
    client = _client(uri)
    with _read_errors():
        if not client.list_artifacts(run_id, "tokenizer"):
            return None
        local = Path(client.download_artifacts(run_id, "tokenizer", str(cache_dir)))
    files = sorted(local.iterdir())
    return files[0] if len(files) == 1 else local


__all__ = ["RunHoldings", "RunReadError", "download_run_checkpoint", "download_run_trained_model",
           "download_run_tokenizer", "run_holdings"]
