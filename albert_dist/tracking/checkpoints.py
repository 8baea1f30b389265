"""Checkpoints as run artifacts: background upload with a completeness marker, and download for resume.

Layout in the run's artifacts::

    checkpoints/step_<N>/<files of the DeepSpeed tag directory, e.g. mp_rank_00_model_states.pt, ...>
    checkpoints/step_<N>/COMPLETE.json     {"step": N, "tag": "<tag dir name>", "files": {relpath: bytes}}

``COMPLETE.json`` is uploaded last, only after every file was uploaded, so a checkpoint without it (the
job died mid-upload, or the upload gave up) is never taken for complete; a reader additionally checks
every listed file's size. The local checkpoint is only ever read: the uploader works on a snapshot of
hard links (taken on the training thread in milliseconds, after the collective save returned), so the
engine's "keep the last N" rotation may delete the original meanwhile and a failed upload leaves the local
checkpoint exactly as DeepSpeed wrote it.

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
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

CHECKPOINTS_ARTIFACT_DIR = "checkpoints"
MARKER_NAME = "COMPLETE.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_artifact_path(step: int) -> str:
    """Artifact directory of the checkpoint at optimizer step ``step``."""
    return f"{CHECKPOINTS_ARTIFACT_DIR}/step_{int(step)}"


def _retry(what: str, fn: Callable[[], Any], *, attempts: Optional[int], backoff_s: float, max_backoff_s: float,
           should_stop: Callable[[], bool] = lambda: False) -> Any:
    """Call ``fn`` until it succeeds, with doubling waits; re-raises the last error after ``attempts`` tries
    (None: no limit), on a permanent error (`albert_dist.tracking.sender.is_transient`) or once
    ``should_stop()`` is true."""
    from albert_dist.tracking.sender import is_transient

    wait, attempt = backoff_s, 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any transient failure of an upload/download is retried
            if (attempts is not None and attempt >= attempts) or not is_transient(exc) or should_stop():
                raise
            log.warning("%s failed (attempt %d: %s: %s); retrying in %.1f s", what, attempt,
                        type(exc).__name__, str(exc)[:200], wait)
            end = time.monotonic() + wait
            while time.monotonic() < end and not should_stop():
                time.sleep(min(0.2, wait))
            wait = min(wait * 2, max_backoff_s)


def list_files(root: str) -> dict[str, int]:
    """Relative path (``/``-separated) -> size in bytes of every regular file below ``root``."""
    out: dict[str, int] = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out[os.path.relpath(path, root).replace(os.sep, "/")] = os.path.getsize(path)
    return dict(sorted(out.items()))


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
        except OSError:  # other file system, or links not permitted
            shutil.copy2(src, dst)


@dataclass
class _Job:
    dest: str  # artifact directory
    staging: str  # local snapshot, removed after the upload
    step: Optional[int] = None  # a checkpoint (marked complete at the end); None = plain files
    tag: str = ""
    before_marker: Optional[Callable[[], bool]] = None


class CheckpointUploader:
    """One background thread uploading checkpoints of one run, oldest first, newest never skipped.

    Args:
        client: ``mlflow.MlflowClient``.
        run_id: the run the artifacts go to.
        retry_backoff_s, max_backoff_s: waits between attempts (doubling; MLflow's own HTTP retries happen
            inside each attempt).

    A failed file upload is retried for as long as the error is transient (the server is down, a 5xx),
    until a newer checkpoint is submitted (the older one is then given up: only the latest matters for
    resuming, and uploads must not fall ever further behind training) or `close`'s deadline passes.
    Checkpoints waiting behind a running upload are likewise skipped for the newest one (logged).
    """

    def __init__(self, client: Any, run_id: str, *, retry_backoff_s: float = 1.0, max_backoff_s: float = 30.0):
        self._client = client
        self._run_id = run_id
        self._newest_step = -1
        self._backoff = retry_backoff_s
        self._max_backoff = max_backoff_s
        self._queue: queue.Queue[Optional[_Job]] = queue.Queue()
        self._stop = threading.Event()
        self.completed: list[int] = []
        """Steps whose checkpoint was uploaded and marked complete."""
        self.failed: list[int] = []
        """Steps whose upload gave up or was skipped (never marked complete)."""
        self._thread = threading.Thread(target=self._run, name="mlflow-checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, local_dir: str, step: int, before_marker: Optional[Callable[[], bool]] = None) -> None:
        """Snapshot ``local_dir`` (hard links, on the caller's thread) and queue its upload; returns at once.

        Args:
            local_dir: a finished checkpoint directory (DeepSpeed's ``<save_dir>/<tag>``).
            step: optimizer step of the checkpoint.
            before_marker: called on the upload thread after the files and before the marker; the marker
                is written only if it returns True (used to make sure metrics up to ``step`` arrived first).

        Raises:
            ValueError: ``local_dir`` is not a directory or holds no file.
        """
        if not os.path.isdir(local_dir) or not list_files(local_dir):
            raise ValueError(f"checkpoint dir {local_dir!r} does not exist or is empty")
        local_dir = os.path.abspath(local_dir).rstrip(os.sep)
        staging = os.path.join(os.path.dirname(local_dir), f".mlflow_upload_{os.path.basename(local_dir)}")
        shutil.rmtree(staging, ignore_errors=True)
        snapshot(local_dir, staging)
        self._newest_step = max(self._newest_step, int(step))
        self._queue.put(_Job(checkpoint_artifact_path(step), staging, int(step), os.path.basename(local_dir),
                             before_marker))

    def submit_files(self, local_path: str, artifact_path: Optional[str], take: bool = False) -> None:
        """Queue the upload of a file (to ``artifact_path/<name>``) or of a directory's contents (to
        ``artifact_path/``); no marker. Snapshotted like `submit`, unless ``take``: then ``local_path`` is a
        private directory the uploader uploads the contents of and deletes afterwards.

        Raises:
            ValueError: ``local_path`` does not exist.
        """
        if not os.path.exists(local_path):
            raise ValueError(f"artifact {local_path!r} does not exist")
        if take:
            staging = local_path
        else:
            staging = tempfile.mkdtemp(prefix=".mlflow_upload_",
                                       dir=os.path.dirname(os.path.abspath(local_path)))
            if os.path.isdir(local_path):
                snapshot(local_path, staging)
            else:
                try:
                    os.link(local_path, os.path.join(staging, os.path.basename(local_path)))
                except OSError:
                    shutil.copy2(local_path, staging)
        self._queue.put(_Job((artifact_path or "").strip("/"), staging))

    def close(self, timeout_s: float) -> bool:
        """Finish queued uploads within ``timeout_s``; True when all of them completed."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            self._stop.set()  # ends retries; the running request finishes on its own (daemon thread)
            log.error("checkpoint upload still running after %.0f s; not marked complete", timeout_s)
            return False
        return not self.failed

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            newer = []
            while not self._queue.empty():  # skip older waiting checkpoints in favour of the newest
                nxt = self._queue.get()
                newer.append(nxt)
            jobs = [job] + [j for j in newer if j is not None]
            checkpoints = [j for j in jobs if j.step is not None]
            for old in checkpoints[:-1]:
                log.warning("checkpoint step %d not uploaded: a newer checkpoint (step %d) is waiting",
                            old.step, checkpoints[-1].step)
                self.failed.append(old.step)
                shutil.rmtree(old.staging, ignore_errors=True)
            newest = checkpoints[-1] if checkpoints else None
            for j in jobs:
                if j.step is None or j is newest:
                    self._upload(j)
            if any(j is None for j in newer):
                return

    def _superseded(self, job: _Job) -> bool:
        return self._stop.is_set() or (job.step is not None and self._newest_step > job.step)

    def _write_marker(self, job: _Job, files: dict[str, int]) -> None:
        if job.before_marker is not None and not job.before_marker():
            raise RuntimeError("metrics up to this step were not delivered")
        marker = {"step": job.step, "tag": job.tag, "files": files}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, MARKER_NAME)
            with open(path, "w") as f:
                json.dump(marker, f, indent=1)
            _retry(f"marker of checkpoint step {job.step}",
                   lambda: self._client.log_artifact(self._run_id, path, job.dest),
                   attempts=None, backoff_s=self._backoff, max_backoff_s=self._max_backoff,
                   should_stop=lambda: self._superseded(job))

    def _upload(self, job: _Job) -> None:
        dest = job.dest
        what = f"checkpoint step {job.step}" if job.step is not None else f"artifacts {dest}"
        t0 = time.monotonic()
        try:
            files = list_files(job.staging)
            for rel, _ in files.items():
                sub = os.path.dirname(rel)
                artifact_path = "/".join(p for p in (dest, sub) if p) or None
                _retry(f"upload of {what} file {rel}",
                       lambda: self._client.log_artifact(self._run_id, os.path.join(job.staging, rel),
                                                         artifact_path),
                       attempts=None, backoff_s=self._backoff, max_backoff_s=self._max_backoff,
                       should_stop=lambda: self._superseded(job))
            if job.step is not None:
                self._write_marker(job, files)
        except Exception as exc:  # noqa: BLE001 - an upload failure never stops training
            self.failed.append(job.step if job.step is not None else dest)
            log.error("%s not uploaded (%s: %s); nothing marked complete, the local copy is untouched",
                      what, type(exc).__name__, exc)
        else:
            if job.step is not None:
                self.completed.append(job.step)
            log.info("%s uploaded to %s (%d files, %.1f MB, %.1f s)", what, dest, len(files),
                     sum(files.values()) / 1e6, time.monotonic() - t0)
        finally:
            shutil.rmtree(job.staging, ignore_errors=True)


# ---- reading side ----
def complete_checkpoints(client: Any, run_id: str) -> list[tuple[int, dict]]:
    """``(step, marker)`` of every checkpoint of the run that is complete, newest first.

    A checkpoint is complete when its ``COMPLETE.json`` exists and every file it lists is stored with the
    listed size; incomplete ones are logged and skipped.
    """
    out = []
    for info in client.list_artifacts(run_id, CHECKPOINTS_ARTIFACT_DIR):
        m = _STEP_DIR.match(os.path.basename(info.path))
        if not info.is_dir or not m:
            continue
        step = int(m.group(1))
        stored = _stored_sizes(client, run_id, info.path)
        if MARKER_NAME not in stored:
            log.warning("checkpoint %s has no %s: incomplete upload, ignored", info.path, MARKER_NAME)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            marker_path = client.download_artifacts(run_id, f"{info.path}/{MARKER_NAME}", tmp)
            with open(marker_path) as f:
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

    Returns:
        ``(step, tag_dir)``.

    Raises:
        FileNotFoundError: the run has no complete checkpoint (at ``step``).
        RuntimeError: the downloaded files do not match the marker (sizes) after all attempts.
    """
    candidates = complete_checkpoints(client, run_id)
    if step is not None:
        candidates = [c for c in candidates if c[0] == step]
    if not candidates:
        which = "any" if step is None else f"step {step}"
        raise FileNotFoundError(f"MLflow run {run_id} has no complete checkpoint ({which}) under "
                                f"{CHECKPOINTS_ARTIFACT_DIR}/")
    step, marker = candidates[0]
    tag = marker["tag"]
    os.makedirs(save_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".mlflow_download_", dir=save_dir)

    def fetch() -> str:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        local = client.download_artifacts(run_id, checkpoint_artifact_path(step), tmp)
        got = list_files(local)
        got.pop(MARKER_NAME, None)
        if got != marker["files"]:
            raise RuntimeError(f"downloaded checkpoint step {step} differs from its marker: "
                               f"{sorted(set(got.items()) ^ set(marker['files'].items()))[:5]}")
        return local

    try:
        local = _retry(f"download of checkpoint step {step}", fetch, attempts=attempts,
                       backoff_s=retry_backoff_s, max_backoff_s=60.0)
        os.remove(os.path.join(local, MARKER_NAME))
        tag_dir = os.path.join(save_dir, tag)
        if os.path.exists(tag_dir):
            shutil.rmtree(tag_dir)
        os.replace(local, tag_dir)
        # DeepSpeed's `latest` pointer, written atomically like a finished save would.
        with open(os.path.join(save_dir, "latest.tmp"), "w") as f:
            f.write(tag)
        os.replace(os.path.join(save_dir, "latest.tmp"), os.path.join(save_dir, "latest"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("downloaded checkpoint step %d of run %s to %s", step, run_id, tag_dir)
    return step, tag_dir
