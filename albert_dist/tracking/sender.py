"""The one background thread of a job's MLflow run: open it, then drain one ordered queue into it.

Why not MLflow's own ``synchronous=False`` logging: its queue drops a batch once the HTTP retries for it are
spent (mlflow #14627), and the synchronous API blocks the caller for as long as those retries last. Here
the training thread only appends metrics to ``<run_dir>/metrics.jsonl`` (`albert_dist.tracking.base.JsonlTracker`)
and queues params, tags and artifact uploads in memory; this thread sends them with ``MlflowClient.log_batch``
and ``log_artifact``. The metric file is read from the byte offset already delivered, so an outage, a server
that is down when the job starts, a requeued attempt and `albert-dist tracking sync` are one path: open (or
reopen) the run, then send the file from where the server's data ends.

* Order: the queue is sent in call order; before each upload the metric log is sent to its end (and again
  between the files of an upload, so a long upload does not hold metrics back): an upload arrives after
  every metric logged before it was queued. A checkpoint's ``COMPLETE.json`` marker is its upload's last
  file, so a complete checkpoint artifact is never ahead of the metrics of its steps
  (`albert_dist.tracking.checkpoints`).
* No (key, step) twice: a record whose step is at or below the last step the run holds for that key (a
  resumed job re-running steps after its checkpoint; resume is exact, so the first values stand) is skipped
  and counted in `RunSender.skipped`.
* Retries: `tenacity`, exponential backoff, for as long as the error is transient (`is_transient`) and
  until `close`'s deadline. A permanently rejected batch is sent entry by entry and the bad entries dropped
  (logged), so one bad value never blocks every later metric; a refused artifact file (413) fails that file.
* Only the newest checkpoint matters for resuming, so queuing one drops the older checkpoint uploads waiting
  behind another upload (or for the run to open), and stops the running one at its next retry: uploads never
  fall ever further behind.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from albert_dist.tracking.base import read_metric_log
from albert_dist.tracking.checkpoints import MARKER_NAME, list_files, prune_checkpoints
from albert_dist.tracking.retry import is_transient, retrying

if TYPE_CHECKING:  # mlflow and tenacity are imported where a run is tracked: the GPU image has neither
    import tenacity

log = logging.getLogger(__name__)

#: MLflow's log_batch limits (mlflow/utils/validation.py: MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100


class RunSender:
    """Opens the run (``open_run(client) -> mlflow.entities.Run``, retried) on its own thread, then sends the
    queue (params, tags, uploads, in call order) and the metric log of ``run_dir`` until `close`.

    An upload job is ``{"staging": folder, "dest": artifact folder[, "step", "tag"]}`` (a checkpoint when it
    has a step: `albert_dist.tracking.checkpoints.stage_checkpoint`); the staging folder is deleted once
    uploaded. A checkpoint whose files all arrived gets its marker, then older checkpoint artifacts beyond
    ``keep_last`` (None: all kept) are deleted, except ``keep_steps``.

    Attributes: `run` (the open run, or None), `opened` (Event: the run is open, or opening failed for good:
    then `error` holds the reason), `offset` (bytes of metrics.jsonl delivered), `skipped`, `dropped`,
    `completed` (checkpoint steps uploaded and marked), `failed` (artifacts that will not arrive).
    ``on_open(run)`` is called on the thread once the run is open; ``on_reconnect()`` after an outage ended;
    ``on_pending(jobs)`` whenever the list of uploads not yet done changes (`pending_uploads`).
    """

    def __init__(self, client: Any, run_dir: str, open_run: Callable[[Any], Any], *, flush_interval_s: float,
                 retry_backoff_s: float, max_backoff_s: float, keep_last: Optional[int] = None,
                 keep_steps: tuple = (), on_open: Callable[[Any], None] = lambda run: None,
                 on_reconnect: Callable[[], None] = lambda: None,
                 on_pending: Callable[[list[dict]], None] = lambda jobs: None):
        self._client, self._run_dir, self._open_run = client, run_dir, open_run
        self._flush_interval_s, self._backoff, self._max_backoff = flush_interval_s, retry_backoff_s, max_backoff_s
        self._keep_last, self._keep_steps = keep_last, set(keep_steps)
        self._on_open, self._on_reconnect, self._on_pending = on_open, on_reconnect, on_pending
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Any]] = []  # ("params" | "tags", dict) or ("upload", job), in call order
        self._current: Optional[tuple[str, Any]] = None  # the item being sent (never dropped from the queue)
        self._existing_params: dict[str, str] = {}
        self._last_step: dict[str, int] = {}
        self._newest_step = -1
        self._closing, self._deadline, self._flush = False, float("inf"), False
        self._outage = False
        self.run = None
        self.error: Optional[BaseException] = None
        self.opened = threading.Event()
        self.offset = 0
        self.skipped = 0
        """Metric values not sent because the run already held their (key, step)."""
        self.dropped = 0
        """Entries the server rejected permanently (each logged as an error)."""
        self.completed: list[int] = []
        self.failed: list[str] = []
        self._thread = threading.Thread(target=self._main, name="mlflow-sender", daemon=True)

    def start(self) -> "RunSender":
        """Start the thread (separately from the constructor: the callbacks may use the sender)."""
        self._thread.start()
        return self

    # ---- producer side: never touches the network ----
    def _put(self, item: tuple[str, Any]) -> None:
        with self._cond:
            self._queue.append(item)
            self._flush = True
            self._cond.notify_all()

    def add_params(self, params: dict[str, str]) -> None:
        """Queue flat string params (one already on a resumed run with another value becomes a
        ``param_changed.<name>`` tag: MLflow params are immutable)."""
        self._put(("params", dict(params)))

    def add_tags(self, tags: dict[str, str]) -> None:
        """Queue tags (a later value overwrites an earlier one)."""
        self._put(("tags", dict(tags)))

    def submit(self, job: dict) -> None:
        """Queue an upload job (class docstring); the staging folder is the sender's from now on. A checkpoint
        drops the older checkpoint uploads waiting behind another upload, or for the run to open (logged;
        their staging folders deleted)."""
        with self._cond:
            if job.get("step") is not None:
                self._newest_step = max(self._newest_step, job["step"])
            old, blocked = [], self.run is None
            for item in self._queue:
                if item[0] != "upload":
                    continue
                step = item[1].get("step")
                if blocked and item is not self._current and step is not None and step < self._newest_step:
                    old.append(item)
                else:
                    blocked = True  # whatever queues behind this upload waits for it
            self._queue = [i for i in self._queue if i not in old]
        for _, superseded in old:
            log.warning("checkpoint step %d not uploaded: a newer checkpoint (step %d) is queued",
                        superseded["step"], self._newest_step)
            self.failed.append(superseded["dest"])
            shutil.rmtree(superseded["staging"], ignore_errors=True)
        self._put(("upload", job))
        self._on_pending(self.pending_uploads)

    @property
    def pending_uploads(self) -> list[dict]:
        """Upload jobs not done yet (queued or running), in order (copies)."""
        with self._cond:
            return [dict(job) for kind, job in self._queue if kind == "upload"]

    def unsent(self) -> dict[str, int]:
        """What is not delivered: ``{"params": n, "tags": n, "metric_records": n}`` (uploads: `pending_uploads`)."""
        records = sum(1 for _ in read_metric_log(self._run_dir, self.offset))
        with self._cond:
            left = {kind: {key for k, entries in self._queue if k == kind for key in entries}
                    for kind in ("params", "tags")}
        return {"params": len(left["params"]), "tags": len(left["tags"]), "metric_records": records}

    def close(self, timeout_s: float) -> dict[str, int]:
        """Send what is left, retrying until ``timeout_s`` has passed; returns `unsent` (all zero, and no
        `pending_uploads`: everything arrived). Idempotent."""
        with self._cond:
            self._closing = True
            self._deadline = min(self._deadline, time.monotonic() + timeout_s)
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s + 2.0)
        return self.unsent()

    # ---- the thread ----
    def _stopped(self) -> bool:
        return self._closing and time.monotonic() >= self._deadline

    def _sleep(self, seconds: float) -> None:
        with self._cond:  # close() (and a newer checkpoint) wake the wait to look at the stop condition again
            self._cond.wait(timeout=max(0.0, min(seconds, self._deadline - time.monotonic())))

    def _retry(self, what: str, fn: Callable[[], Any], stop: Optional[Callable[[], bool]] = None) -> Any:
        """``fn()`` retried while its error is transient, until ``stop()`` (default: close's deadline)."""
        def note_outage(state: tenacity.RetryCallState) -> None:
            if not self._outage:
                exc = state.outcome.exception()
                log.warning("MLflow unreachable (%s: %s) while trying to %s; training goes on, metrics stay in "
                            "%s/metrics.jsonl and are sent when it answers", type(exc).__name__, str(exc)[:200],
                            what, self._run_dir)
            self._outage = True

        retry = retrying(what, backoff_s=self._backoff, max_backoff_s=self._max_backoff,
                         stop=stop or self._stopped, sleep=self._sleep)
        retry.before_sleep = note_outage  # one line per outage, not one per attempt
        result = retry(fn)
        if self._outage:
            self._outage = False
            log.warning("MLflow reachable again; sending what was logged meanwhile")
            if self.run is not None:
                self._on_reconnect()
        return result

    def _main(self) -> None:
        try:
            run = self._retry("open the run", lambda: self._open_run(self._client))
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor / at close
            if not is_transient(exc):
                self.error = exc
            self.opened.set()
            return
        self._existing_params = dict(run.data.params)
        # Run.data keeps, per key, the value at the largest step (what MLflow's SystemMetricsMonitor reads too).
        self._last_step = {m.key: m.step for m in run.data._metric_objs}
        self.run = run
        self._on_open(run)
        self.opened.set()
        while True:
            with self._cond:
                if not self._closing and not self._flush:
                    self._cond.wait(timeout=self._flush_interval_s)
                self._flush = False
                closing = self._closing
            try:
                self._drain()
            except Exception as exc:  # noqa: BLE001 - a transient error escapes a retry only at the deadline
                log.error("MLflow run %s: sending stopped (%s: %s)", run.info.run_id, type(exc).__name__, exc)
                return
            if closing:
                return

    def _drain(self) -> None:
        """Send each queued item in order, the metric log to its end before each upload and at the end."""
        while True:
            with self._cond:
                self._current = item = self._queue[0] if self._queue else None
            if item is None or item[0] == "upload":
                self._send_metrics()
            if item is None:
                return
            kind, payload = item
            if kind == "upload":
                self._upload(payload)
            else:
                self._send_entries(kind, payload)
            with self._cond:
                self._queue.remove(item)
                self._current = None
                self._cond.notify_all()
            if kind == "upload":
                self._on_pending(self.pending_uploads)

    def _log_batch(self, kind: str, entries: list) -> None:
        """Send ``entries``; if the server rejects the batch for good, send them one by one and drop the bad."""
        def send(batch: list) -> None:
            self._retry(f"send {kind}", lambda: self._client.log_batch(self.run.info.run_id, **{kind: batch},
                                                                       synchronous=True))
        try:
            send(entries)
            return
        except Exception as exc:  # noqa: BLE001
            if is_transient(exc):
                raise
        for entry in entries:
            try:
                send([entry])
            except Exception as exc:  # noqa: BLE001
                if is_transient(exc):
                    raise
                self.dropped += 1
                log.error("MLflow rejected %s entry %r, dropped: %s", kind, entry, exc)

    def _send_entries(self, kind: str, entries: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        if kind == "params":
            changed = {k: v for k, v in entries.items() if self._existing_params.get(k, v) != v}
            if changed:
                log.warning("resumed with changed params (kept as tags param_changed.*): %s",
                            {k: (self._existing_params[k], v) for k, v in changed.items()})
                self._send_entries("tags", {f"param_changed.{k}": v for k, v in changed.items()})
            entries = {k: v for k, v in entries.items() if k not in self._existing_params}
        from mlflow.entities import Param, RunTag  # here: see _send_metrics

        items = sorted(entries.items())
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + MAX_PARAMS_TAGS_PER_BATCH]
            self._log_batch(kind, [(Param if kind == "params" else RunTag)(k, v) for k, v in chunk])
            if kind == "params":
                self._existing_params.update(chunk)

    def _send_metrics(self) -> None:
        """Send the metric log from `offset` to its end, in whole records, <= one log_batch at a time."""
        # Imported here (on the sender's thread): MLflow's import costs ~3 CPU-s, which a run without tracking
        # (the trainer imports this module) should not pay.
        from mlflow.entities import Metric

        while True:
            batch, last, skipped, end = [], {}, 0, self.offset
            for record in read_metric_log(self._run_dir, self.offset):
                step, end = int(record.pop("step")), record.pop("_end")
                ts = int(record.pop("timestamp_ms", time.time() * 1000))
                for key, value in record.items():
                    if step <= last.get(key, self._last_step.get(key, -1)):
                        skipped += 1
                        continue
                    batch.append(Metric(key, float(value), ts, step))
                    last[key] = step
                if len(batch) >= MAX_METRICS_PER_BATCH - 100:
                    break
            if end == self.offset:
                return
            if batch:
                self._log_batch("metrics", batch)
            self.offset = end
            self._last_step.update(last)
            self.skipped += skipped

    def _upload(self, job: dict) -> None:
        """Upload a job's files (its marker last, for a checkpoint); a superseded checkpoint is dropped."""
        run_id, step = self.run.info.run_id, job.get("step")
        files, failed, t0 = list_files(job["staging"]), [], time.monotonic()
        # A few plain files are named (config.yaml and ds_config.json both go to `config/`: one line each).
        what = (f"checkpoint step {step}" if step is not None else
                f"artifact {', '.join(sorted(files))}" if 0 < len(files) <= 3 else f"artifacts {job['dest'] or '/'}")

        def superseded() -> bool:
            return self._stopped() or (step is not None and self._newest_step > step)

        def put(path: str, dest: Optional[str], name: str) -> None:
            self._retry(f"upload of {job['dest']}/{name}", lambda: self._client.log_artifact(run_id, path, dest),
                        stop=superseded)
        try:
            for rel, size in files.items():
                try:
                    put(os.path.join(job["staging"], rel),
                        "/".join(p for p in (job["dest"], os.path.dirname(rel)) if p) or None, rel)
                except Exception as exc:  # noqa: BLE001
                    if is_transient(exc):
                        raise  # superseded or out of time
                    failed.append(rel)
                    log.error("MLflow refused %s/%s (%d bytes): %s; not retried", job["dest"], rel, size,
                              str(exc)[:300])
                self._send_metrics()
            if step is not None and not failed:
                with tempfile.TemporaryDirectory() as tmp:
                    marker = os.path.join(tmp, MARKER_NAME)
                    with open(marker, "w") as f:
                        json.dump({"step": step, "tag": job["tag"], "files": files}, f, indent=1)
                    put(marker, job["dest"], MARKER_NAME)
        except Exception as exc:  # noqa: BLE001 - an upload failure never stops training
            if self._stopped() or step is None or self._newest_step <= step:
                log.error("%s not uploaded (%s: %s); kept for the next attempt / albert-dist tracking sync",
                          what, type(exc).__name__, str(exc)[:200])
                raise
            log.error("%s not uploaded (%s: %s)", what, type(exc).__name__, str(exc)[:200])
            self.failed.append(job["dest"])
            shutil.rmtree(job["staging"], ignore_errors=True)
            return
        self.failed += [f"{job['dest']}/{rel}" for rel in failed]
        if step is not None and not failed:
            self.completed.append(step)
            if self._keep_last is not None:
                prune_checkpoints(self._client, self.run, step, self._keep_last, self._keep_steps)
        log.info("%s uploaded to %s (%d files, %.1f MB, %.1f s)%s", what, job["dest"] or "/", len(files) - len(failed),
                 sum(files.values()) / 1e6, time.monotonic() - t0, f"; refused: {failed}" if failed else "")
        shutil.rmtree(job["staging"], ignore_errors=True)
