"""The background thread that opens a job's MLflow run and sends its params, tags and metric log, in order.

Why not MLflow's own ``synchronous=False`` logging: its queue drops a batch once the HTTP retries for it are
spent (mlflow #14627), and the synchronous API blocks the caller for as long as those retries last. Here
the training thread only appends to ``<run_dir>/metrics.jsonl`` (`albert_dist.tracking.base.JsonlTracker`);
this thread tails that file from the byte offset it has delivered and sends records with
``MlflowClient.log_batch``. The file is the queue, so nothing is held in memory, and an outage, a server
that is down when the job starts, a requeued attempt and `albert-dist tracking sync` are one path: open (or
reopen) the run, then send the file from where the server's data ends.

* No (key, step) twice: a record whose step is at or below the last step the run holds for that key (a
  resumed job re-running steps after its checkpoint; resume is exact, so the first values stand) is skipped
  and counted in `RunSender.skipped`.
* Retries: `tenacity`, exponential backoff, for as long as the error is transient (`is_transient`) and
  until `close`'s deadline. A permanently rejected batch is sent entry by entry and the bad entries dropped
  (logged), so one bad value never blocks every later metric.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

import tenacity
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from albert_dist.tracking.base import read_metric_log

log = logging.getLogger(__name__)

#: MLflow's log_batch limits (mlflow/utils/validation.py: MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100


def http_status(exc: BaseException) -> Optional[int]:
    """The HTTP status a failed MLflow call answered with (MlflowException or requests' HTTPError), else None."""
    if isinstance(exc, MlflowException):
        return exc.get_http_status_code()
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def is_transient(exc: BaseException) -> bool:
    """True when a failed request may succeed later: no answer (connection refused/reset, DNS, timeout: OSError
    and requests' errors, which MLflow wraps as a 500), 408, 429 or a 5xx. Any other 4xx (a bad value, an
    unknown run, 413 payload too large) is final: retrying it would block everything queued behind it."""
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(exc, OSError)  # requests.RequestException is an OSError


def retrying(what: str, *, backoff_s: float, max_backoff_s: float, stop: Callable[[], bool],
             sleep: Callable[[float], None] = time.sleep, attempts: Optional[int] = None) -> tenacity.Retrying:
    """A `tenacity.Retrying` for MLflow calls: transient errors only, doubling waits from ``backoff_s`` to
    ``max_backoff_s``, until ``stop()`` is true or after ``attempts`` tries; the last error is re-raised."""
    def should_stop(state: tenacity.RetryCallState) -> bool:
        return stop() or (attempts is not None and state.attempt_number >= attempts)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        log.warning("%s failed (attempt %d: %s: %s); retrying in %.1f s", what, state.attempt_number,
                    type(exc).__name__, str(exc)[:200], state.upcoming_sleep)

    return tenacity.Retrying(retry=tenacity.retry_if_exception(is_transient), stop=should_stop,
                             wait=tenacity.wait_exponential(multiplier=backoff_s, max=max_backoff_s),
                             sleep=sleep, before_sleep=before_sleep, reraise=True)


class RunSender:
    """Opens the run (``open_run(client) -> mlflow.entities.Run``, retried) on its own thread, then sends
    queued params and tags and the metric log of ``run_dir`` until `close`.

    Attributes: `run` (the open run, or None), `opened` (Event: the run is open, or opening failed for good:
    then `error` holds the reason), `offset` (bytes of metrics.jsonl delivered), `skipped`, `dropped`.
    ``on_open(run)`` is called on the thread once the run is open; ``on_reconnect()`` after an outage ended.
    """

    def __init__(self, client: Any, run_dir: str, open_run: Callable[[Any], Any], *, flush_interval_s: float,
                 retry_backoff_s: float, max_backoff_s: float, on_open: Callable[[Any], None] = lambda run: None,
                 on_reconnect: Callable[[], None] = lambda: None):
        self._client, self._run_dir, self._open_run = client, run_dir, open_run
        self._flush_interval_s, self._backoff, self._max_backoff = flush_interval_s, retry_backoff_s, max_backoff_s
        self._on_open, self._on_reconnect = on_open, on_reconnect
        self._cond = threading.Condition()
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._existing_params: dict[str, str] = {}
        self._last_step: dict[str, int] = {}
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
        self._thread = threading.Thread(target=self._main, name="mlflow-sender", daemon=True)

    def start(self) -> "RunSender":
        """Start the thread (separately from the constructor: the callbacks may use the sender)."""
        self._thread.start()
        return self

    # ---- producer side: never touches the network ----
    def add_params(self, params: dict[str, str]) -> None:
        """Queue flat string params (one already on a resumed run with another value becomes a
        ``param_changed.<name>`` tag: MLflow params are immutable)."""
        with self._cond:
            self._params.update(params)
            self._flush = True
            self._cond.notify_all()

    def add_tags(self, tags: dict[str, str]) -> None:
        """Queue tags (a later value overwrites an earlier one)."""
        with self._cond:
            self._tags.update(tags)
            self._flush = True
            self._cond.notify_all()

    def wait_sent(self, offset: int, timeout_s: Optional[float] = None) -> bool:
        """Block until metrics.jsonl up to byte ``offset`` and every queued param/tag are delivered; False on
        timeout or once the thread has ended without it."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._flush = True
            self._cond.notify_all()
            while self.offset < offset or self._params or self._tags:
                remaining = None if end is None else end - time.monotonic()
                if not self._thread.is_alive() or (remaining is not None and remaining <= 0):  # ended / timeout
                    return False
                self._cond.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))
            return True

    def unsent(self) -> dict[str, int]:
        """What is not delivered: ``{"params": n, "tags": n, "metric_records": n}``."""
        records = sum(1 for _ in read_metric_log(self._run_dir, self.offset))
        with self._cond:
            return {"params": len(self._params), "tags": len(self._tags), "metric_records": records}

    def close(self, timeout_s: float) -> dict[str, int]:
        """Send what is left, retrying until ``timeout_s`` has passed; returns `unsent` (all zero: everything
        arrived). Idempotent."""
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
        with self._cond:  # close() wakes the wait to try once more before its deadline
            self._cond.wait(timeout=max(0.0, min(seconds, self._deadline - time.monotonic())))

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        def note_outage(state: tenacity.RetryCallState) -> None:
            if not self._outage:
                exc = state.outcome.exception()
                log.warning("MLflow unreachable (%s: %s) while trying to %s; training goes on, metrics stay in "
                            "%s/metrics.jsonl and are sent when it answers", type(exc).__name__, str(exc)[:200],
                            what, self._run_dir)
            self._outage = True

        retry = retrying(what, backoff_s=self._backoff, max_backoff_s=self._max_backoff, stop=self._stopped,
                         sleep=self._sleep)
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
                self._retry("send metrics", self._drain)
            except Exception as exc:  # noqa: BLE001 - only a transient error at the close deadline gets here
                log.error("MLflow run %s: sending stopped at the close deadline (%s)", run.info.run_id, exc)
                return
            if closing:
                return

    def _send(self, **batch: list) -> None:
        self._client.log_batch(self.run.info.run_id, **batch, synchronous=True)

    def _send_isolating(self, kind: str, entries: list) -> None:
        """Send ``entries``; if the server rejects the batch for good, send them one by one and drop the bad."""
        try:
            self._send(**{kind: entries})
            return
        except Exception as exc:  # noqa: BLE001
            if is_transient(exc):
                raise
        for entry in entries:
            try:
                self._send(**{kind: [entry]})
            except Exception as exc:  # noqa: BLE001
                if is_transient(exc):
                    raise
                self.dropped += 1
                log.error("MLflow rejected %s entry %r, dropped: %s", kind, entry, exc)

    def _drain(self) -> None:
        with self._cond:
            params, tags = dict(self._params), dict(self._tags)
        new = {k: v for k, v in params.items() if k not in self._existing_params}
        changed = {k: v for k, v in params.items() if self._existing_params.get(k, v) != v}
        if changed:
            log.warning("resumed with changed params (kept as tags param_changed.*): %s",
                        {k: (self._existing_params[k], v) for k, v in changed.items()})
            tags.update({f"param_changed.{k}": v for k, v in changed.items()})
        items = sorted(new.items())
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self._send_isolating("params", [Param(k, v) for k, v in items[i:i + MAX_PARAMS_TAGS_PER_BATCH]])
            self._existing_params.update(items[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        items = sorted(tags.items())
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self._send_isolating("tags", [RunTag(k, v) for k, v in items[i:i + MAX_PARAMS_TAGS_PER_BATCH]])
        with self._cond:
            for queue, sent in ((self._params, params), (self._tags, tags)):
                for k, v in sent.items():
                    if queue.get(k) == v:
                        del queue[k]
            self._cond.notify_all()
        while self._send_metric_batch():
            pass

    def _send_metric_batch(self) -> bool:
        """Send the next records of the metric log (whole records, <= one log_batch); False at its end."""
        batch, last, skipped, end = [], {}, 0, self.offset
        for record in read_metric_log(self._run_dir, self.offset):
            step, ts, end = int(record.pop("step")), int(record.pop("timestamp_ms", time.time() * 1000)), record.pop("_end")
            for key, value in record.items():
                if step <= last.get(key, self._last_step.get(key, -1)):
                    skipped += 1
                    continue
                batch.append(Metric(key, float(value), ts, step))
                last[key] = step
            if len(batch) >= MAX_METRICS_PER_BATCH - 100:
                break
        if end == self.offset:
            return False
        if batch:
            self._send_isolating("metrics", batch)
        with self._cond:
            self.offset = end
            self._last_step.update(last)
            self.skipped += skipped
            self._cond.notify_all()
        return True
