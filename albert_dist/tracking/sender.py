"""Buffered, ordered, retried delivery of params, tags and metrics to one MLflow run.

Why not MLflow's own ``synchronous=False`` logging: its queue gives up on a batch whose request failed
(the data is lost), and the synchronous API blocks the caller for as long as MLflow's HTTP retries last
(minutes with the default ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=7``). Here the training thread only appends to
an in-memory buffer; one background thread sends it with ``MlflowClient.log_batch`` in order and retries a
failed batch with exponential backoff for as long as it takes (or until `close`'s deadline), so a tracking
server outage delays metrics but loses none.

Re-sending a batch whose response was lost is harmless: every metric keeps the timestamp it was given when
logged, and MLflow's SQL store drops a metric identical in (key, timestamp, step, value) to a stored one.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Optional

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

#: MLflow's log_batch limits (mlflow/utils/validation.py: MAX_METRICS_PER_BATCH etc.).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100


def is_transient(exc: BaseException) -> bool:
    """True when a failed request may succeed later: no answer at all, a timeout, 429 or a 5xx.

    A 4xx answer (bad value, unknown run, a param logged with a second value) is permanent: retrying
    would block every later metric behind it.
    """
    if isinstance(exc, MlflowException):
        status = exc.get_http_status_code()
        return status >= 500 or status in (408, 429)
    return True  # requests/urllib3/OS errors: connection refused, reset, DNS


class BatchSender:
    """Background sender of one run's params, tags and metrics.

    Args:
        client: an ``mlflow.MlflowClient`` (thread-safe for this use; only this thread calls log_batch).
        run_id: the run to log into.
        flush_interval_s: seconds between sends while nothing asks for a flush.
        retry_backoff_s, max_backoff_s: first and largest wait after a failed send (doubling in between).

    Metrics are sent in the order they were added (params and tags first); a permanently rejected batch is
    split to isolate the rejected entries, which are counted in `dropped` and logged as errors.
    """

    def __init__(self, client: Any, run_id: str, *, flush_interval_s: float = 5.0,
                 retry_backoff_s: float = 1.0, max_backoff_s: float = 30.0, name: str = "mlflow-sender"):
        self._client = client
        self._run_id = run_id
        self._flush_interval_s = flush_interval_s
        self._retry_backoff_s = retry_backoff_s
        self._max_backoff_s = max_backoff_s
        self._cond = threading.Condition()
        self._params: collections.deque[Param] = collections.deque()
        self._tags: collections.deque[RunTag] = collections.deque()
        self._metrics: collections.deque[Metric] = collections.deque()
        self._added = 0  # metrics ever added
        self._sent = 0  # metrics ever delivered (or dropped as permanently rejected)
        self._flush_requested = False
        self._closing = False
        self._deadline: Optional[float] = None
        self.dropped = 0
        """Entries the server rejected permanently (each logged as an error)."""
        self.failures = 0
        """Failed send attempts (transient errors, each followed by a retry)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- producer side (training thread): never blocks on the network ----
    def add_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: Optional[int] = None) -> int:
        """Queue ``metrics`` at optimizer step ``step``; returns the sequence number of the last one queued."""
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        with self._cond:
            for key, value in metrics.items():
                self._metrics.append(Metric(key=key, value=float(value), timestamp=ts, step=int(step)))
                self._added += 1
            return self._added

    def add_params(self, params: dict[str, str]) -> None:
        """Queue params (string values; MLflow rejects a second, different value for a key)."""
        with self._cond:
            self._params.extend(Param(k, str(v)) for k, v in params.items())
            self._flush_requested = True
            self._cond.notify_all()

    def add_tags(self, tags: dict[str, str]) -> None:
        """Queue tags (a later value overwrites an earlier one)."""
        with self._cond:
            self._tags.extend(RunTag(k, str(v)) for k, v in tags.items())
            self._flush_requested = True
            self._cond.notify_all()

    @property
    def added(self) -> int:
        """Number of metrics queued so far (a sequence number for `wait_sent`)."""
        with self._cond:
            return self._added

    @property
    def pending(self) -> int:
        """Entries (params + tags + metrics) not delivered yet."""
        with self._cond:
            return len(self._params) + len(self._tags) + len(self._metrics)

    def request_flush(self) -> None:
        """Ask the thread to send now instead of at the next interval (returns at once)."""
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()

    def wait_sent(self, seq: int, timeout_s: Optional[float] = None) -> bool:
        """Block until the first ``seq`` metrics and all params/tags are delivered; False on timeout or when
        the sender was closed before."""
        self.request_flush()
        end = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._sent < seq or self._params or self._tags:
                if not self._thread.is_alive():
                    return False
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))
            return True

    def close(self, timeout_s: float) -> int:
        """Send what is buffered, retrying until ``timeout_s`` has passed; returns the number of entries that
        could not be delivered (0 = everything arrived). Idempotent."""
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s + 5.0)
        left = self.pending
        if left:
            log.error("MLflow run %s: %d params/tags/metrics could not be delivered within %.0f s",
                      self._run_id, left, timeout_s)
        return left

    def unsent_metrics(self) -> list[Metric]:
        """The metrics still buffered (e.g. to save them locally after a failed close)."""
        with self._cond:
            return list(self._metrics)

    # ---- the sending thread ----
    def _take(self) -> tuple[str, list[Any]]:
        with self._cond:
            if self._params:
                return "params", list(self._params)[:MAX_PARAMS_TAGS_PER_BATCH]
            if self._tags:
                return "tags", list(self._tags)[:MAX_PARAMS_TAGS_PER_BATCH]
            return "metrics", list(self._metrics)[:MAX_METRICS_PER_BATCH]

    def _done(self, kind: str, n: int) -> None:
        with self._cond:
            queue = {"params": self._params, "tags": self._tags, "metrics": self._metrics}[kind]
            for _ in range(n):
                queue.popleft()
            if kind == "metrics":
                self._sent += n
            self._cond.notify_all()

    def _send(self, kind: str, batch: list[Any]) -> None:
        self._client.log_batch(self._run_id, **{kind: batch}, synchronous=True)

    def _send_isolating(self, kind: str, batch: list[Any]) -> None:
        """Send a permanently rejected batch one entry at a time, dropping (and logging) only the bad ones."""
        for entry in batch:
            try:
                self._send(kind, [entry])
            except Exception as exc:  # noqa: BLE001
                if is_transient(exc):
                    raise
                self.dropped += 1
                log.error("MLflow rejected %s entry %r, dropped: %s", kind, entry, exc)
            self._done(kind, 1)

    def _drain(self) -> None:
        while True:
            kind, batch = self._take()
            if not batch:
                return
            try:
                self._send(kind, batch)
            except Exception as exc:  # noqa: BLE001
                if is_transient(exc):
                    raise
                self._send_isolating(kind, batch)
                continue
            self._done(kind, len(batch))

    def _run(self) -> None:
        backoff = self._retry_backoff_s
        outage_since: Optional[float] = None
        while True:
            with self._cond:
                if not self._closing:
                    self._cond.wait_for(lambda: self._flush_requested or self._closing,
                                        timeout=self._flush_interval_s)
                self._flush_requested = False
                closing, deadline = self._closing, self._deadline
            try:
                self._drain()
            except Exception as exc:  # noqa: BLE001 - every transient error is retried
                self.failures += 1
                if outage_since is None:
                    outage_since = time.monotonic()
                    log.warning("MLflow unreachable (%s: %s); %d entries buffered, retrying",
                                type(exc).__name__, str(exc)[:200], self.pending)
                wait = backoff
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                    if wait <= 0:
                        return
                with self._cond:  # a close() wakes us to try once more before its deadline
                    self._cond.wait(timeout=wait)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            if outage_since is not None:
                log.warning("MLflow reachable again after %.1f s; buffered entries delivered",
                            time.monotonic() - outage_since)
                outage_since = None
            backoff = self._retry_backoff_s
            if closing and self.pending == 0:
                return
