"""Which failed MLflow calls are worth retrying, and the one retry policy of the tracker's calls (tenacity)."""
from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger(__name__)


def http_status(exc: BaseException) -> Optional[int]:
    """The HTTP status a failed MLflow call answered with (MlflowException or requests' HTTPError), else None."""
    # Not imported here: MLflow's import costs ~3 CPU-s that a run without tracking should not pay (the trainer
    # imports this module); an MlflowException exists only once mlflow.exceptions is imported.
    exceptions = sys.modules.get("mlflow.exceptions")
    if exceptions is not None and isinstance(exc, exceptions.MlflowException):
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
    import tenacity  # here, as mlflow above: a run without tracking (the GPU image) has neither

    def should_stop(state: tenacity.RetryCallState) -> bool:
        return stop() or (attempts is not None and state.attempt_number >= attempts)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        log.warning("%s failed (attempt %d: %s: %s); retrying in %.1f s", what, state.attempt_number,
                    type(exc).__name__, str(exc)[:200], state.upcoming_sleep)

    return tenacity.Retrying(retry=tenacity.retry_if_exception(is_transient), stop=should_stop,
                             wait=tenacity.wait_exponential(multiplier=backoff_s, max=max_backoff_s),
                             sleep=sleep, before_sleep=before_sleep, reraise=True)
