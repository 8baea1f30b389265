"""What a training job prints: one short line per log interval on rank 0, known third-party noise filtered.

Everything the loop measures goes to metrics.jsonl and MLflow; the console gets the few numbers a person
watches (step, loss, MLM accuracy, lr, tokens/s, MFU, ETA) in one format, under 120 characters with the
logging prefix. The tqdm bar is drawn only on a terminal: in a log file (a launcher's or Slurm's output) its
carriage-return updates interleave with the log lines, so files get the plain lines only.

Noise is removed by exact message at start-up (`install_noise_filters`), never by raising a library logger's
level: a new warning from the same library still shows.
"""
from __future__ import annotations

import logging
import math
import re
import sys
import warnings
from typing import IO, Optional

#: (logger name, exact message) of log records dropped at start-up.
NOISY_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    # deepspeed/accelerator/real_accelerator.py on every CPU process: the expected case here, not a problem
    ("DeepSpeed", "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."),
    # botocore (s3:// sources, MLflow's S3 artifacts) at INFO on its first request, per process: which credential
    # source it used is not a problem, and the console of 64 ranks x loader workers repeated it hundreds of times
    ("botocore.credentials", "Found credentials in environment variables."),
    ("botocore.credentials", "Found credentials in shared credentials file: ~/.aws/credentials"),
)
#: (warning category, exact message) of warnings ignored at start-up.
NOISY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torchdata 0.11's StatefulDataLoader calls torch.set_vital in __init__ (its bug, nothing to act on)
    (UserWarning, "'set_vital' is deprecated, please do not call"),
    # DeepSpeed 0.19's ZeRO calls torch.distributed.all_gather_into_tensor, deprecated in torch 2.13
    (FutureWarning, "`torch.distributed.all_gather_into_tensor` is deprecated. "
                    "Please use `torch.distributed.all_gather_single` instead."),
)


class _DropExact(logging.Filter):
    """Drops the records of one logger whose message is exactly one of `messages`."""

    def __init__(self, messages: set[str]):
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


def install_noise_filters() -> None:
    """Filter `NOISY_LOG_RECORDS` and `NOISY_WARNINGS` in this process (and the loader workers it forks).

    Idempotent; call it before DeepSpeed or torchdata are imported (filters attach to the named loggers,
    which exist before their library configures them).
    """
    by_logger: dict[str, set[str]] = {}
    for name, message in NOISY_LOG_RECORDS:
        by_logger.setdefault(name, set()).add(message)
    for name, messages in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropExact) for f in logger.filters):
            logger.addFilter(_DropExact(messages))
    for category, message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message) + r"\Z", category=category)


class _Formatter(logging.Formatter):
    """``[rank0 11:52:07] message``; records at WARNING and above also name their level and module
    (``[rank1 11:52:07] WARNING trainer: ...``), where finding the source matters more than width."""

    def __init__(self, rank: int):
        super().__init__(f"[rank{rank} %(asctime)s] %(message)s", datefmt="%H:%M:%S")
        self._warning = logging.Formatter(f"[rank{rank} %(asctime)s] %(levelname)s %(module)s: %(message)s",
                                          datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        return self._warning.format(record) if record.levelno >= logging.WARNING else super().format(record)


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is at each record, not the stream it was built with: an
    in-process caller that swaps stderr (pytest's capture, a notebook) never leaves it writing to a closed file."""

    @property
    def stream(self) -> IO:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: IO) -> None:  # StreamHandler.__init__ assigns it; sys.stderr is always used
        pass


def configure_logging(rank: int = 0, stream: Optional[IO] = None, level: Optional[int] = None,
                      replace: bool = True) -> None:
    """The package's one logging set-up, which every command calls (a training rank, `albert-dist data`,
    `tokenizer`, `tracking`, `finetune`, a `data prepare` worker): root logging for one rank, INFO on rank 0,
    WARNING on the others (their INFO lines would repeat rank 0's) unless `level` is given, a short prefix with
    the rank, and `install_noise_filters`. DeepSpeed's and torch.distributed's own loggers stay at WARNING:
    their INFO output (DeepSpeed's whole engine configuration, per rank) is volume, not noise of one known
    message. `replace`: replace a set-up already there (a training rank: a library may have made one first);
    False keeps one there (the tools' commands: an in-process caller's own, e.g. pytest's log capture)."""
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(_Formatter(rank))
    if level is None:
        level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, force=replace, handlers=[handler])
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    install_noise_filters()


def progress_bar_enabled(requested: bool, rank: int, stream: IO) -> bool:
    """Draw the tqdm bar only when asked for (`progress_bar`), on rank 0, and when `stream` is a terminal."""
    return bool(requested) and rank == 0 and stream.isatty()


def si(value: float) -> str:
    """A positive quantity in 3-4 significant characters with an SI suffix: 950, 9.50k, 12.3M, 1.23G."""
    if not math.isfinite(value):
        return str(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def duration(seconds: Optional[float]) -> str:
    """Seconds as 42s, 3m05s, 2h07m (coarser units drop the finest); '?' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _step(step: int, max_steps: int) -> str:
    return f"step {step:>{len(str(max_steps))}}/{max_steps}"


def train_line(step: int, max_steps: int, loss: float, mlm_accuracy: float, lr: float, tokens_per_s: float,
               mfu: Optional[float], eta_s: Optional[float]) -> str:
    """The console line of a log interval: ``step  40/300 | loss 9.142 | mlm acc  3.1% | lr 2.00e-03 |
    tok/s 2.95k | mfu 12.3% | eta 1m05s``. Loss in nats (3 decimals), accuracy and MFU in percent (1
    decimal; ``mfu n/a`` when None: no peak to divide by, `albert_dist.engine.metrics.shown_mfu`), lr in 3
    significant digits, throughput with an SI suffix."""
    parts = [_step(step, max_steps), f"loss {loss:.3f}", f"mlm acc {100 * mlm_accuracy:4.1f}%", f"lr {lr:.2e}",
             f"tok/s {si(tokens_per_s)}"]
    parts.append("mfu n/a" if mfu is None else f"mfu {100 * mfu:.1f}%")
    parts.append(f"eta {duration(eta_s)}")
    return " | ".join(parts)


def val_line(step: int, max_steps: int, loss: float, mlm_accuracy: float,
             over_unigram: Optional[float] = None) -> str:
    """The console line of a validation: ``step 300/300 | val loss 7.041 | val mlm acc  7.3% (1.44x unigram)``."""
    line = " | ".join([_step(step, max_steps), f"val loss {loss:.3f}", f"val mlm acc {100 * mlm_accuracy:4.1f}%"])
    return line + (f" ({over_unigram:.2f}x unigram)" if over_unigram is not None else "")


def eta_s(elapsed_s: float, steps_done: int, steps_left: int) -> Optional[float]:
    """Seconds left at the mean pace of this process so far (evaluations and checkpoints included, since
    they recur); None before the first step."""
    return elapsed_s / steps_done * steps_left if steps_done > 0 else None
