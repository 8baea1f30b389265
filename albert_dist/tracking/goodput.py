"""Goodput of a run across every restart: its wall time split into productive step time and badput by cause, from
an append-only events file in the run directory (`albert-dist goodput RUN_DIR [--json]`, front end
`albert_dist.cli.goodput`; the trainer's rank 0 records through `GoodputRecorder`).

The events file ``<run_dir>/goodput.jsonl``: one JSON object a line, appended and never rewritten, so an attempt
killed at any point leaves every event it wrote. Every event has ``event`` and ``t`` (unix seconds, the wall clock).

- ``start`` (rank 0, when the loop is about to run): ``step`` (the step resumed from, 0 for a fresh run),
  ``begin_t`` (when the attempt began: the launch script's ``ALBERT_LAUNCH_TIME``, else this process's start),
  ``launch_t`` (``ALBERT_LAUNCH_TIME`` or null), ``load_s`` (the checkpoint load's seconds).
- ``interval`` (rank 0, every log interval, before the console line), ``save`` (after each checkpoint save),
  ``end`` (when the job closes, with ``status``: FINISHED, KILLED or FAILED): ``step`` (steps done),
  ``from_step`` (steps done at the previous event), ``elapsed_s`` (seconds since the previous event, a monotonic
  clock) and ``phases`` (``data_wait``, ``evaluation``, ``checkpoint_save``: seconds of it spent there).
- ``exit`` (the launch script, after the ranks are gone; `launch/pretrain_local.sh`, `slurm/common.sh`): ``status``
  (the job's exit code, `albert_dist.exit_codes`), ``launch_t``. Not written after exit 2 (the ranks refused the
  job: another job may hold this run directory and its file).

Accounting (`goodput`), attempt by attempt (an attempt opens at its ``start``; an ``exit`` whose ``launch_t`` no
``start`` carries is an attempt that died in start-up): start-up = ``start.t - begin_t - load_s``; each later
event's ``elapsed_s`` less its phases is step time when steps advanced since the previous event (productive, or
``recomputed`` for the share of steps an earlier attempt had already recorded, in proportion), else ``other``
(e.g. the final model's export; ``lost`` in the ``end`` of a FAILED job: the time it took to notice the failure).
After the last event: ``other`` when it was the ``end`` of a job that did not fail; else the time to the launch
script's ``exit`` is ``hung`` after `EXIT_HUNG` (the watchdog's time to detection) and ``lost`` otherwise (a kill, a
crash: what the attempt did after its last event is unknown, or was its failure). Without an ``exit`` (no launch script) a killed attempt
ends at its last event. Steps are known to a log interval: a kill between two events counts the steps after the
last one as ``lost`` time, and their recomputation as productive. ``wall_s`` is the sum over attempts, so
``productive_s + sum(badput_s.values()) == wall_s``; time a requeued job waits in the queue is not in it.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from albert_dist.exit_codes import EXIT_HUNG

logger = logging.getLogger(__name__)

EVENTS_FILE = "goodput.jsonl"
#: the launch scripts' time of this attempt's launch (unix seconds), read by the trainer's rank 0
LAUNCH_TIME_ENV = "ALBERT_LAUNCH_TIME"

DATA_WAIT, EVALUATION, CHECKPOINT_SAVE = "data_wait", "evaluation", "checkpoint_save"
#: the badput causes, in the order they are printed
CAUSES = ("startup", "checkpoint_load", CHECKPOINT_SAVE, EVALUATION, DATA_WAIT, "recomputed", "hung", "lost", "other")
#: MLflow / metrics.jsonl names of the report (`GoodputReport.metrics`)
METRIC_PREFIX = "goodput/"


def process_start_time() -> Optional[float]:
    """This process's start, unix seconds (Linux: /proc/self/stat's start time after boot + /proc/stat's btime);
    None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class GoodputRecorder:
    """Rank 0's writer of ``<run_dir>/goodput.jsonl`` (module docstring); on other ranks (``run_dir`` None) every
    call does nothing. Cheap: a few float additions per step, one small append per log interval or save.

    Use: `start(step, load_s)` when the loop is about to run; `add(phase, seconds)` for data waits, evaluations and
    saves; `mark("interval" | "save", step)` after them; `end(step, status)` when the job closes.
    """

    def __init__(self, run_dir: Optional[str | Path] = None, clock: Callable[[], float] = time.perf_counter):
        self.path = None if run_dir is None else Path(run_dir) / EVENTS_FILE
        self._clock = clock  # monotonic seconds: the events' elapsed_s
        self._last = clock()
        self._step = 0
        self._phases: dict[str, float] = {}
        self.started = False

    def _write(self, event: dict) -> None:
        try:
            with open(self.path, "a") as fh:  # one write of one line
                fh.write(json.dumps(event) + "\n")
        except OSError as err:  # accounting must never end a job
            logger.warning("goodput: cannot append to %s: %s", self.path, err)

    def start(self, step: int, load_s: float = 0.0) -> None:
        """The loop is about to run from `step`, after a checkpoint load of `load_s` seconds (0: fresh start)."""
        if self.path is None:
            return
        now, launch = time.time(), os.environ.get(LAUNCH_TIME_ENV)
        try:
            launch_t = float(launch) if launch else None
        except ValueError:
            launch_t = None
        begin = launch_t if launch_t is not None and launch_t <= now else process_start_time()
        self._last, self._step, self._phases, self.started = self._clock(), step, {}, True
        self._write({"event": "start", "t": now, "step": step, "begin_t": now if begin is None else begin,
                     "launch_t": launch_t, "load_s": float(load_s), "pid": os.getpid()})

    def add(self, phase: str, seconds: float) -> None:
        """`seconds` of the time since the last event went to `phase` (DATA_WAIT, EVALUATION, CHECKPOINT_SAVE)."""
        if self.started:
            self._phases[phase] = self._phases.get(phase, 0.0) + seconds

    def mark(self, event: str, step: int, **extra: Any) -> None:
        """Append `event` at `step` with the time since the previous event and its phases."""
        if not self.started:
            return
        now = self._clock()
        self._write({"event": event, "t": time.time(), "step": step, "from_step": self._step,
                     "elapsed_s": now - self._last, "phases": self._phases, **extra})
        self._last, self._step, self._phases = now, step, {}

    def end(self, step: int, status: str) -> Optional["GoodputReport"]:
        """The job closes at `step` with MLflow `status`: the ``end`` event, then the run's report so far (None
        where nothing was recorded, or the file does not read)."""
        if not self.started:
            return None
        self.mark("end", step, status=status)
        self.started = False
        try:
            return goodput(self.path.parent)
        except (OSError, ValueError) as err:
            logger.warning("goodput: %s", err)
            return None


@dataclass
class Attempt:
    """One attempt of the run, as the events tell it."""
    begin_t: float
    start_step: Optional[int] = None  # None: it died in start-up, before its ``start``
    end_step: Optional[int] = None  # the last step an event recorded
    status: Any = None  # the launch script's exit code, else the ``end`` event's status, else None (killed)
    wall_s: float = 0.0
    recomputed_steps: int = 0
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def progressed(self) -> bool:
        """It recorded a step beyond the one it started from (the requeue rule of the launch scripts)."""
        return self.start_step is not None and self.end_step is not None and self.end_step > self.start_step

    def as_dict(self) -> dict:
        return {"begin": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.begin_t)), "wall_s": self.wall_s,
                "start_step": self.start_step, "end_step": self.end_step, "status": self.status,
                "progressed": self.progressed, "recomputed_steps": self.recomputed_steps,
                "badput_s": {c: s for c, s in self.parts.items() if c != "productive"},
                "productive_s": self.parts.get("productive", 0.0)}


@dataclass
class GoodputReport:
    """A run's goodput (`goodput`): seconds by cause; ``productive_s + sum(badput_s.values()) == wall_s``."""
    run_dir: str
    attempts: list[Attempt]
    productive_s: float
    badput_s: dict[str, float]

    @property
    def wall_s(self) -> float:
        return self.productive_s + sum(self.badput_s.values())

    @property
    def restarts(self) -> int:
        return max(0, len(self.attempts) - 1)

    @property
    def recomputed_steps(self) -> int:
        return sum(a.recomputed_steps for a in self.attempts)

    @property
    def goodput(self) -> float:
        """productive_s / wall_s (0 for an empty run)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        """What `albert-dist goodput RUN_DIR --json` prints."""
        return {"run_dir": self.run_dir, "restarts": self.restarts, "recomputed_steps": self.recomputed_steps,
                "steps": max((a.end_step or 0 for a in self.attempts), default=0),
                "wall_s": self.wall_s, "productive_s": self.productive_s, "goodput": self.goodput,
                "badput_s": dict(self.badput_s), "attempts": [a.as_dict() for a in self.attempts]}

    def metrics(self) -> dict[str, float]:
        """The report as metrics (``goodput/*``) for MLflow and metrics.jsonl."""
        out = {f"{METRIC_PREFIX}wall_s": self.wall_s, f"{METRIC_PREFIX}productive_s": self.productive_s,
               f"{METRIC_PREFIX}share": self.goodput, f"{METRIC_PREFIX}restarts": float(self.restarts),
               f"{METRIC_PREFIX}recomputed_steps": float(self.recomputed_steps)}
        out.update({f"{METRIC_PREFIX}badput/{cause}_s": s for cause, s in self.badput_s.items()})
        return out

    def text(self) -> str:
        """Two lines for a console: the share, then seconds by cause (those above 0)."""
        restarts = self.restarts
        head = (f"goodput {100 * self.goodput:.1f}%: {self.productive_s:.1f} s productive of {self.wall_s:.1f} s "
                f"wall, {len(self.attempts)} attempt(s), {restarts} restart(s), {self.recomputed_steps} step(s) "
                f"recomputed")
        causes = ", ".join(f"{c.replace('_', ' ')} {s:.1f} s" for c, s in self.badput_s.items() if s > 0.05)
        return f"{head}\n  badput: {causes or 'none'}"


def read_events(run_dir: str | Path) -> list[dict]:
    """The events of ``<run_dir>/goodput.jsonl``, in order; a torn last line (a kill during its write) is skipped.

    Raises:
        ValueError: `run_dir` is not a directory.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"{run_dir}: no such run directory")
    path = run / EVENTS_FILE
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event and "t" in event:
            events.append(event)
    return events


def _same_launch(a: Optional[float], b: Optional[float]) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) < 1e-3


def goodput(run_dir: str | Path) -> GoodputReport:
    """The goodput of the run in `run_dir` across every attempt its events file records (module docstring).

    Raises:
        ValueError: `run_dir` is not a directory.
    """
    events = read_events(run_dir)
    attempts: list[Attempt] = []
    totals = {c: 0.0 for c in CAUSES}
    productive = 0.0
    done = 0  # the highest step an earlier attempt recorded
    current: Optional[Attempt] = None
    state: dict[str, Any] = {}

    def add(attempt: Attempt, cause: str, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        attempt.parts[cause] = attempt.parts.get(cause, 0.0) + seconds
        attempt.wall_s += seconds

    def close(attempt: Attempt, exit_event: Optional[dict]) -> None:
        nonlocal done
        if exit_event is not None:
            attempt.status = exit_event.get("status")
            tail = float(exit_event["t"]) - state["last_t"]
            if attempt.start_step is None:
                add(attempt, "hung" if attempt.status == EXIT_HUNG else "startup", tail)
            else:
                add(attempt, "other" if state["ended"] else "hung" if attempt.status == EXIT_HUNG else "lost", tail)
        attempts.append(attempt)
        if attempt.end_step is not None:
            done = max(done, attempt.end_step)

    for event in events:
        kind = event["event"]
        if kind == "start":
            if current is not None:
                close(current, None)
            current = Attempt(begin_t=float(event.get("begin_t", event["t"])), start_step=int(event.get("step", 0)))
            current.end_step = current.start_step
            load = float(event.get("load_s", 0.0))
            add(current, "startup", float(event["t"]) - current.begin_t - load)
            add(current, "checkpoint_load", load)
            state = {"last_t": float(event["t"]), "launch_t": event.get("launch_t"), "ended": False,
                     "done_before": done}
        elif kind in ("interval", "save", "end", "rollback") and current is not None:
            phases = {k: float(v) for k, v in (event.get("phases") or {}).items()}
            elapsed = max(float(event.get("elapsed_s", 0.0)), sum(phases.values()))
            for phase, seconds in phases.items():
                add(current, phase if phase in CAUSES else "other", seconds)
            rest = elapsed - sum(phases.values())
            lo, hi = int(event.get("from_step", current.end_step)), int(event["step"])
            if hi > lo:
                # done before: by an earlier attempt, or by this one before a divergence rollback took it back
                again = max(0, min(hi, max(state["done_before"], current.end_step)) - lo)
                add(current, "recomputed", rest * again / (hi - lo))
                add(current, "productive", rest * (hi - lo - again) / (hi - lo))
                current.recomputed_steps += again
                current.end_step = max(current.end_step, hi)
            elif kind == "rollback":  # back to a healthy checkpoint's step: the reload is a checkpoint load
                add(current, "checkpoint_load", rest)
            else:  # no step: an export or a shutdown, or a failed job's time to notice the failure
                failed = kind == "end" and event.get("status") == "FAILED"
                add(current, "lost" if failed else "other", rest)
            state["last_t"] = float(event["t"])
            if kind == "end":
                state["ended"] = event.get("status") != "FAILED"
                current.status = event.get("status")
        elif kind == "exit":
            if current is not None and _same_launch(state.get("launch_t"), event.get("launch_t")):
                close(current, event)
                current = None
                continue
            if current is not None:
                close(current, None)
                current = None
            launch_t = event.get("launch_t")
            died = Attempt(begin_t=float(launch_t if launch_t is not None else event["t"]))
            state = {"last_t": died.begin_t, "ended": False}
            close(died, event)
    if current is not None:
        close(current, None)
    for attempt in attempts:
        for cause, seconds in attempt.parts.items():
            if cause == "productive":
                productive += seconds
            else:
                totals[cause] += seconds
    return GoodputReport(str(run_dir), attempts, productive, totals)


__all__ = ["GoodputRecorder", "GoodputReport", "Attempt", "goodput", "read_events", "process_start_time",
           "EVENTS_FILE", "LAUNCH_TIME_ENV", "CAUSES", "DATA_WAIT", "EVALUATION", "CHECKPOINT_SAVE"]
