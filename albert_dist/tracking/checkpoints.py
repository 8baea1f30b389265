"""Run artifacts: staging of uploads (checkpoints with a completeness marker, plain files scrubbed of
secrets; `albert_dist.tracking.sender` uploads them), retention of checkpoint artifacts, download for resume.

Layout in the run's artifacts::

    checkpoints/step_<N>/<files of the DeepSpeed tag directory, e.g. mp_rank_00_model_states.pt, ...>
    checkpoints/step_<N>/COMPLETE.json     {"step": N, "tag": "<tag dir name>", "files": {relpath: bytes}}

``COMPLETE.json`` is uploaded last, after every file and after every metric logged before the checkpoint
arrived, so a checkpoint without it (the job died mid-upload) is never taken for complete; a reader also
checks every listed file's size. The sender uploads a snapshot of hard links (taken on the training
thread in milliseconds, after the collective save returned), so local retention may delete the original
meanwhile and a failed upload leaves the local checkpoint as DeepSpeed wrote it. A snapshot not uploaded by
the end of the job stays on disk and is listed in ``mlflow_run.json`` ("pending"): the next attempt of the
job, or `albert-dist tracking sync`, uploads it.

Assumes the checkpoint directory is on a file system shared by the ranks (the usual cluster setup): rank
0 uploads what it sees, i.e. every rank's ZeRO shard files.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Optional

from albert_dist.engine.checkpoint.layout import list_files, step_of, tag_for, write_latest
from albert_dist.tracking.retry import retrying
from albert_dist.tracking.secrets import scrub_file

log = logging.getLogger(__name__)

CHECKPOINTS_ARTIFACT_DIR = "checkpoints"
MARKER_NAME = "COMPLETE.json"


def checkpoint_artifact_path(step: int) -> str:
    """Artifact directory of the checkpoint at optimizer step ``step``."""
    return f"{CHECKPOINTS_ARTIFACT_DIR}/{tag_for(int(step))}"


def snapshot(src_dir: str, dst_dir: str) -> None:
    """Mirror ``src_dir`` into ``dst_dir`` with hard links (a copy where links are impossible).

    DeepSpeed writes each checkpoint file once and never rewrites it in place, so a link is an immutable
    view of the finished file.
    """
    for rel in list_files(src_dir):
        src, dst = os.path.join(src_dir, rel), os.path.join(dst_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not permitted
            shutil.copy2(src, dst)


def stage_checkpoint(local_dir: str, step: int) -> dict:
    """Snapshot a finished checkpoint directory beside it (hard links: milliseconds, on the training thread,
    after the collective save returned) as an upload job for `albert_dist.tracking.sender.RunSender.submit`.

    Raises:
        ValueError: ``local_dir`` is not a directory or holds no file.
    """
    if not os.path.isdir(local_dir) or not list_files(local_dir):
        raise ValueError(f"checkpoint dir {local_dir!r} does not exist or is empty")
    local_dir = os.path.abspath(local_dir).rstrip(os.sep)
    staging = os.path.join(os.path.dirname(local_dir), f".mlflow_upload_{os.path.basename(local_dir)}")
    shutil.rmtree(staging, ignore_errors=True)
    snapshot(local_dir, staging)
    return {"staging": staging, "dest": checkpoint_artifact_path(step), "step": int(step),
            "tag": os.path.basename(local_dir)}


def stage_artifact(local_path: str, run_dir: str, dest: Optional[str], redact_keys: bool = True) -> dict:
    """Copy a file or directory into a staging folder under ``run_dir``, text files scrubbed of secrets
    (`albert_dist.tracking.secrets.scrub_file`), as an upload job to artifact folder ``dest``.

    Raises:
        ValueError: ``local_path`` does not exist.
    """
    if not os.path.exists(local_path):
        raise ValueError(f"artifact {local_path!r} does not exist")
    staging = tempfile.mkdtemp(prefix=".mlflow_upload_", dir=run_dir)
    try:
        if os.path.isdir(local_path):
            shutil.copytree(local_path, staging, dirs_exist_ok=True)
        else:
            shutil.copy2(local_path, staging)
        for dirpath, _, names in os.walk(staging):
            for name in names:
                scrub_file(os.path.join(dirpath, name), redact_keys)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"staging": staging, "dest": (dest or "").strip("/")}


def prune_checkpoints(client: Any, run: Any, newest: int, keep_last: int, keep_steps: set[int]) -> None:
    """Delete checkpoint artifacts older than ``newest`` beyond the newest ``keep_last`` complete ones,
    except ``keep_steps``. A failure is logged (retention is never worth failing the job for)."""
    run_id = run.info.run_id
    try:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        keep = {s for s, _ in complete_checkpoints(client, run_id)[:keep_last]} | keep_steps | {newest}
        repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=client.tracking_uri)
        for info in client.list_artifacts(run_id, CHECKPOINTS_ARTIFACT_DIR):
            step = step_of(info.path)
            if info.is_dir and step is not None and step < newest and step not in keep:
                repo.delete_artifacts(info.path)
                log.info("deleted checkpoint artifact %s (tracking.keep_last_checkpoints=%d)", info.path, keep_last)
    except Exception as exc:  # noqa: BLE001
        log.error("checkpoint retention in MLflow failed: %s: %s", type(exc).__name__, exc)


# ---- reading side ----
def complete_checkpoints(client: Any, run_id: str) -> list[tuple[int, dict]]:
    """``(step, marker)`` of every checkpoint of the run that is complete, newest first.

    A checkpoint is complete when its ``COMPLETE.json`` exists and every file it lists is stored with the
    listed size; incomplete ones are logged and skipped.
    """
    out = []
    for info in client.list_artifacts(run_id, CHECKPOINTS_ARTIFACT_DIR):
        step = step_of(info.path)
        if not info.is_dir or step is None:
            continue
        stored = _stored_sizes(client, run_id, info.path)
        if MARKER_NAME not in stored:
            log.warning("checkpoint %s has no %s: incomplete upload, ignored", info.path, MARKER_NAME)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            with open(client.download_artifacts(run_id, f"{info.path}/{MARKER_NAME}", tmp)) as f:
                marker = json.load(f)
        bad = {rel: size for rel, size in marker["files"].items() if stored.get(rel) != size}
        if bad:
            log.warning("checkpoint %s: files missing or of the wrong size %s, ignored", info.path, bad)
            continue
        out.append((step, marker))
    return sorted(out, key=lambda x: -x[0])


def _stored_sizes(client: Any, run_id: str, path: str, prefix: str = "") -> dict[str, Optional[int]]:
    sizes: dict[str, Optional[int]] = {}
    for info in client.list_artifacts(run_id, path):
        rel = f"{prefix}{os.path.basename(info.path)}"
        if info.is_dir:
            sizes.update(_stored_sizes(client, run_id, info.path, rel + "/"))
        else:
            sizes[rel] = info.file_size
    return sizes


def download_checkpoint(client: Any, run_id: str, save_dir: str, step: Optional[int] = None, *,
                        attempts: int = 5, retry_backoff_s: float = 2.0) -> tuple[int, str]:
    """Download a complete checkpoint of a run into ``save_dir`` the way DeepSpeed saved it.

    Args:
        client: ``mlflow.MlflowClient``.
        run_id: run to download from.
        save_dir: DeepSpeed checkpoint directory; receives ``<tag>/`` and a ``latest`` file naming it.
        step: which checkpoint; None = the newest complete one.
        attempts, retry_backoff_s: tries of a transient failure or a size mismatch, first wait between them.

    Returns:
        ``(step, tag_dir)``.

    Raises:
        FileNotFoundError: the run has no complete checkpoint (at ``step``).
        RuntimeError: the downloaded files do not match the marker (sizes) after all attempts.
    """
    complete = complete_checkpoints(client, run_id)
    candidates = [c for c in complete if step is None or c[0] == step]
    if not candidates:
        held = f"; it holds steps {', '.join(str(c[0]) for c in sorted(complete))}" if complete else ""
        raise FileNotFoundError(f"MLflow run {run_id} has no complete checkpoint "
                                f"({'any' if step is None else f'step {step}'}) under {CHECKPOINTS_ARTIFACT_DIR}/"
                                + held)
    step, marker = candidates[0]
    os.makedirs(save_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".mlflow_download_", dir=save_dir)

    def fetch() -> str:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        local = client.download_artifacts(run_id, checkpoint_artifact_path(step), tmp)
        got = list_files(local)
        got.pop(MARKER_NAME, None)
        if got != marker["files"]:  # a ConnectionError, so that it is retried like one
            raise ConnectionError(f"downloaded checkpoint step {step} differs from its marker: "
                                  f"{sorted(set(got.items()) ^ set(marker['files'].items()))[:5]}")
        return local

    try:
        local = retrying(f"download of checkpoint step {step}", backoff_s=retry_backoff_s, max_backoff_s=60.0,
                         stop=lambda: False, attempts=attempts)(fetch)
        os.remove(os.path.join(local, MARKER_NAME))
        tag_dir = os.path.join(save_dir, marker["tag"])
        shutil.rmtree(tag_dir, ignore_errors=True)
        os.replace(local, tag_dir)
        write_latest(save_dir, marker["tag"])  # DeepSpeed's `latest` pointer, as a finished save writes it
    except ConnectionError as exc:
        raise RuntimeError(str(exc)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("downloaded checkpoint step %d of run %s to %s", step, run_id, tag_dir)
    return step, tag_dir


#: Where a run's end-of-training model lies in its artifacts (`albert_dist.apps.pretrain.run_tracking.log_trained_model`:
#: ``fp32/`` model.safetensors + model.yaml, ``hf/`` the transformers directory with the tokenizer).
FINAL_MODEL_ARTIFACT_DIR = "model"
