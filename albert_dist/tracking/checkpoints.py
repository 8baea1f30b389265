"""Run artifacts: background uploads (checkpoints with a completeness marker, plain files), retention of
checkpoint artifacts, and download for resume.

Layout in the run's artifacts::

    checkpoints/step_<N>/<files of the DeepSpeed tag directory, e.g. mp_rank_00_model_states.pt, ...>
    checkpoints/step_<N>/COMPLETE.json     {"step": N, "tag": "<tag dir name>", "files": {relpath: bytes}}

``COMPLETE.json`` is uploaded last, after every file and after every metric logged before the checkpoint
arrived, so a checkpoint without it (the job died mid-upload) is never taken for complete; a reader also
checks every listed file's size. The uploader works on a snapshot of hard links (taken on the training
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
import queue
import re
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Optional

from albert_dist.engine.checkpoint.layout import list_files, step_of, tag_for, write_latest
from albert_dist.tracking.sender import is_transient, retrying

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


class Uploader:
    """One background thread uploading a run's artifacts in order; of several queued checkpoints only the
    newest is uploaded (only the latest matters for resuming, and uploads must not fall ever further behind).

    Args:
        client: ``mlflow.MlflowClient``.
        sender: the run's `RunSender` (uploads start once its run is open; markers wait for its metrics).
        keep_last: checkpoint artifacts kept after a newer one is complete (None: all).
        keep_steps: steps never deleted (the checkpoint the job resumed from).
        on_pending: called with the list of not-yet-uploaded jobs (dicts) whenever it changes.
        retry_backoff_s, max_backoff_s: waits between attempts of a transient failure.

    A transient failure is retried until a newer checkpoint supersedes the job or `close`'s deadline; a
    final one (`is_transient` false: e.g. 413 too large) fails that file at once (logged with its name and
    size) and the other files and jobs go on; a checkpoint with a failed file is not marked complete.
    """

    def __init__(self, client: Any, sender: Any, *, keep_last: Optional[int] = None, keep_steps: tuple = (),
                 on_pending: Callable[[list[dict]], None] = lambda jobs: None, retry_backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0):
        self._client, self._sender = client, sender
        self._keep_last, self._keep_steps = keep_last, set(keep_steps)
        self._on_pending = on_pending
        self._backoff, self._max_backoff = retry_backoff_s, max_backoff_s
        self._queue: queue.Queue[Optional[dict]] = queue.Queue()
        self._jobs: list[dict] = []  # queued or running, in order
        self._current: Optional[dict] = None
        self._lock = threading.Lock()
        self._newest_step = -1
        self._deadline = float("inf")
        self.completed: list[int] = []
        """Steps whose checkpoint was uploaded and marked complete."""
        self.failed: list[str] = []
        """Artifacts that will not arrive (final errors, superseded checkpoints)."""
        self._thread = threading.Thread(target=self._main, name="mlflow-upload", daemon=True)
        self._thread.start()

    def submit_checkpoint(self, local_dir: str, step: int, metrics_offset: int) -> None:
        """Snapshot a finished checkpoint directory and queue it; returns at once. Its marker waits until
        metrics.jsonl up to byte ``metrics_offset`` is delivered.

        Raises:
            ValueError: ``local_dir`` is not a directory or holds no file.
        """
        if not os.path.isdir(local_dir) or not list_files(local_dir):
            raise ValueError(f"checkpoint dir {local_dir!r} does not exist or is empty")
        local_dir = os.path.abspath(local_dir).rstrip(os.sep)
        staging = os.path.join(os.path.dirname(local_dir), f".mlflow_upload_{os.path.basename(local_dir)}")
        shutil.rmtree(staging, ignore_errors=True)
        snapshot(local_dir, staging)
        self.submit({"staging": staging, "dest": checkpoint_artifact_path(step), "step": int(step),
                     "tag": os.path.basename(local_dir), "metrics_offset": int(metrics_offset)})

    def submit(self, job: dict) -> None:
        """Queue a job (``{"staging", "dest"[, "step", "tag", "metrics_offset"]}``; the staging folder is the
        uploader's from now on)."""
        superseded = []
        with self._lock:
            if job.get("step") is not None:
                self._newest_step = max(self._newest_step, job["step"])
                superseded = [j for j in self._jobs if j.get("step") is not None and j["step"] < self._newest_step
                              and j is not self._current]
            self._jobs = [j for j in self._jobs if j not in superseded] + [job]
        for old in superseded:  # waiting behind a running upload: only the newest checkpoint matters
            log.warning("checkpoint step %d not uploaded: a newer checkpoint (step %d) is queued", old["step"],
                        self._newest_step)
            self.failed.append(old["dest"])
            shutil.rmtree(old["staging"], ignore_errors=True)
        self._pending_changed()
        self._queue.put(job)

    def close(self, timeout_s: float) -> list[dict]:
        """Finish queued uploads within ``timeout_s``; returns the jobs left (their staging folders kept)."""
        self._deadline = time.monotonic() + timeout_s
        self._queue.put(None)
        self._thread.join(timeout=timeout_s + 2.0)
        with self._lock:
            return list(self._jobs)

    def _pending_changed(self) -> None:
        with self._lock:
            jobs = [{k: v for k, v in j.items()} for j in self._jobs]
        self._on_pending(jobs)

    def _finish(self, job: dict, keep_staging: bool = False) -> None:
        with self._lock:
            self._jobs.remove(job)
        if not keep_staging:
            shutil.rmtree(job["staging"], ignore_errors=True)
        self._pending_changed()

    def _main(self) -> None:
        while not self._sender.opened.wait(timeout=0.5):
            if time.monotonic() >= self._deadline:
                return
        if self._sender.run is None:  # the run could not be opened: everything stays pending
            return
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                if job not in self._jobs:  # superseded while waiting
                    continue
                self._current = job
            if time.monotonic() >= self._deadline:
                return
            self._upload(job)
            self._current = None

    def _stop(self, job: dict) -> bool:
        return time.monotonic() >= self._deadline or (job.get("step") is not None and
                                                      self._newest_step > job["step"])

    def _upload(self, job: dict) -> None:
        run_id = self._sender.run.info.run_id
        files, failed, t0 = list_files(job["staging"]), [], time.monotonic()
        # A few plain files are named (config.yaml and ds_config.json both go to `config/`: one line each).
        what = (f"checkpoint step {job['step']}" if job.get("step") is not None else
                f"artifact {', '.join(sorted(files))}" if 0 < len(files) <= 3 else f"artifacts {job['dest'] or '/'}")
        try:
            for rel, size in files.items():
                dest = "/".join(p for p in (job["dest"], os.path.dirname(rel)) if p) or None
                try:
                    retrying(f"upload of {job['dest']}/{rel}", backoff_s=self._backoff, max_backoff_s=self._max_backoff,
                             stop=lambda: self._stop(job))(
                        self._client.log_artifact, run_id, os.path.join(job["staging"], rel), dest)
                except Exception as exc:  # noqa: BLE001
                    if is_transient(exc):
                        raise  # superseded or out of time: the job stays pending
                    failed.append(rel)
                    log.error("MLflow refused %s/%s (%d bytes): %s; not retried", job["dest"], rel, size,
                              str(exc)[:300])
            if job.get("step") is not None and not failed:
                self._write_marker(job, files)
        except Exception as exc:  # noqa: BLE001 - an upload failure never stops training
            superseded = job.get("step") is not None and self._newest_step > job["step"]
            log.error("%s not uploaded (%s: %s)%s", what, type(exc).__name__, str(exc)[:200],
                      "" if superseded else "; kept for the next attempt / albert-dist tracking sync")
            if superseded:
                self.failed.append(job["dest"])
                self._finish(job)
            return
        self.failed += [f"{job['dest']}/{rel}" for rel in failed]
        if job.get("step") is not None and not failed:
            self.completed.append(job["step"])
            self._prune(run_id, job["step"])
        log.info("%s uploaded to %s (%d files, %.1f MB, %.1f s)%s", what, job["dest"] or "/", len(files) - len(failed),
                 sum(files.values()) / 1e6, time.monotonic() - t0, f"; refused: {failed}" if failed else "")
        self._finish(job)

    def _write_marker(self, job: dict, files: dict[str, int]) -> None:
        if not self._sender.wait_sent(job.get("metrics_offset", 0),
                                      timeout_s=max(0.0, self._deadline - time.monotonic())):
            raise TimeoutError("metrics up to this step were not delivered")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, MARKER_NAME)
            with open(path, "w") as f:
                json.dump({"step": job["step"], "tag": job["tag"], "files": files}, f, indent=1)
            retrying(f"marker of checkpoint step {job['step']}", backoff_s=self._backoff,
                     max_backoff_s=self._max_backoff, stop=lambda: self._stop(job))(
                self._client.log_artifact, self._sender.run.info.run_id, path, job["dest"])

    def _prune(self, run_id: str, newest: int) -> None:
        """Delete checkpoint artifacts older than ``newest`` beyond the newest ``keep_last`` complete ones,
        except `keep_steps`. A failure is logged (retention is never worth failing the job for)."""
        if self._keep_last is None:
            return
        try:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            complete = [s for s, _ in complete_checkpoints(self._client, run_id)]
            keep = set(complete[:self._keep_last]) | self._keep_steps | {newest}
            repo = get_artifact_repository(self._sender.run.info.artifact_uri,
                                           tracking_uri=self._client.tracking_uri)
            for info in self._client.list_artifacts(run_id, CHECKPOINTS_ARTIFACT_DIR):
                step = step_of(info.path)
                if info.is_dir and step is not None and step < newest and step not in keep:
                    repo.delete_artifacts(info.path)
                    log.info("deleted checkpoint artifact %s (tracking.keep_last_checkpoints=%d)", info.path,
                             self._keep_last)
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
    candidates = [c for c in complete_checkpoints(client, run_id) if step is None or c[0] == step]
    if not candidates:
        raise FileNotFoundError(f"MLflow run {run_id} has no complete checkpoint "
                                f"({'any' if step is None else f'step {step}'}) under {CHECKPOINTS_ARTIFACT_DIR}/")
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
