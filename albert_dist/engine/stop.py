"""How the training loop learns it must stop: SIGTERM/SIGUSR1 set a flag it polls after every optimiser step.

Slurm's `--signal=B:USR1@T`, `scancel --signal`, and the deepspeed launcher forwarding a SIGTERM all arrive
here. DataLoader workers ignore both signals (`IgnoreStopSignals`), so a signal to the whole process group
does not kill them in the middle of the step the trainer finishes.
"""
from __future__ import annotations

import logging
import signal
from typing import Any, Optional

from albert_dist.exit_codes import EXIT_PREEMPTED

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopFlag:
    """Records the first SIGTERM/SIGUSR1; the loop polls it after every optimiser step."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if not self.signum:
            self.signum = signum
            logger.warning("received %s: finishing this step, then checkpoint and exit %d",
                           signal.Signals(signum).name, EXIT_PREEMPTED)

    def install(self) -> None:
        if self._previous:
            return
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class IgnoreStopSignals:
    """DataLoader `worker_init_fn`: stop signals are the training process's business, workers ignore them."""

    def __init__(self, then: Optional[Any] = None):
        self.then = then

    def __call__(self, worker_id: int) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)


__all__ = ["STOP_SIGNALS", "StopFlag", "IgnoreStopSignals"]
