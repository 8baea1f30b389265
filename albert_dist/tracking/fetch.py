"""An MLflow run's artifacts fetched for a later job (`--resume-from`, `model.init_from`, a fine-tuning MODEL):
MLflow's client and its exceptions stay in tracking/; callers get local paths and `RunReadError`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from albert_dist.tracking.checkpoints import FINAL_MODEL_ARTIFACT_DIR, download_checkpoint, download_model

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
    """`albert_dist.tracking.checkpoints.download_checkpoint` of run `run_id` in the store at `uri` (`--resume-from`):
    ``(step, tag_dir)``. Raises as it does, and MLflow's own exceptions as MLflow raises them."""
    return download_checkpoint(_client(uri), run_id, save_dir, step)


def download_run_model(uri: str, run_id: str, dest: str) -> Path:
    """`albert_dist.tracking.checkpoints.download_model` of run `run_id` in the store at `uri` (`model.init_from`):
    the final model's directory or the checkpoint's tag directory.

    Raises:
        RunReadError: MLflow cannot read the run or its artifacts. FileNotFoundError: as `download_model`.
    """
    with _read_errors():
        return Path(download_model(_client(uri), run_id, dest))


@dataclass(frozen=True)
class RunWeights:
    """A run's weights on disk (`download_run_weights`)."""

    step: Optional[int]
    """The step they were trained to (the final model's: the run's ``max_steps`` param; None without it)."""
    what: str
    """"checkpoint step <N>" or "final model"."""
    path: Path
    """The checkpoint's tag directory, or the final model's ``fp32/`` directory."""
    run_dir: Optional[str]
    """The run's ``run_dir`` tag (the pretraining job's run directory on its machine), None when untagged."""


def download_run_weights(uri: str, run_id: str, cache_dir: Path, step: Optional[int] = None) -> RunWeights:
    """Run `run_id`'s checkpoint at `step` (None: the newest complete one) into ``cache_dir/checkpoints``; with
    `step` None and no checkpoint artifact (``tracking.log_checkpoints`` off, or pruned), its final model's
    ``fp32/`` artifact into `cache_dir`.

    Raises:
        RunReadError: MLflow cannot read the run or its artifacts. FileNotFoundError: no checkpoint at `step`, or
            neither a checkpoint nor a final model. RuntimeError: as `download_checkpoint`.
    """
    client = _client(uri)
    with _read_errors():
        run = client.get_run(run_id)
        try:
            at, tag_dir = download_checkpoint(client, run_id, str(cache_dir / "checkpoints"), step)
            what = f"checkpoint step {at}"
        except FileNotFoundError:
            if step is not None:
                raise
            tag_dir = _download_final_model(client, run_id, cache_dir)
            max_steps = run.data.params.get("max_steps")
            at, what = (int(max_steps) if max_steps and max_steps.isdigit() else None), "final model"
    return RunWeights(at, what, Path(tag_dir), run.data.tags.get("run_dir") or None)


def _download_final_model(client: Any, run_id: str, cache_dir: Path) -> Path:
    """The run's ``model/fp32`` artifact (`albert_dist.run_tracking.log_final_model`: model.safetensors +
    model.yaml) downloaded into `cache_dir`; `FileNotFoundError` when the run has none."""
    if not any(f.path == f"{FINAL_FP32_ARTIFACT}/model.safetensors"
               for f in client.list_artifacts(run_id, FINAL_FP32_ARTIFACT)):
        raise FileNotFoundError(f"no complete checkpoint under checkpoints/ and no {FINAL_FP32_ARTIFACT}/ artifact")
    return Path(client.download_artifacts(run_id, FINAL_FP32_ARTIFACT, str(cache_dir)))


def download_run_tokenizer(uri: str, run_id: str, cache_dir: Path) -> Optional[Path]:
    """The first file of run `run_id`'s ``tokenizer/`` artifact (`albert_dist.run_tracking`) downloaded into
    `cache_dir`; None when the run logged none. Raises `RunReadError` when MLflow cannot list or read it."""
    client = _client(uri)
    with _read_errors():
        files = [f.path for f in client.list_artifacts(run_id, "tokenizer")]
        return Path(client.download_artifacts(run_id, files[0], str(cache_dir))) if files else None


__all__ = ["RunReadError", "RunWeights", "download_run_checkpoint", "download_run_model", "download_run_tokenizer",
           "download_run_weights"]
