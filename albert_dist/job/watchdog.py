"""The hang watchdog: a rank that stops making progress ends the job within a bound, naming who stopped, with stacks.

Every rank runs one `Watchdog` thread (from `Trainer.setup` to the end of `Trainer.train`). The training loop marks
its phase (`mark`: data, forward_backward, optimizer_step, logging, evaluation, checkpoint_save, stop_agreement; a
plain attribute write, no I/O, no collective) and each finished step (`step_done`). The thread, every `poll_s`:

* publishes this rank's report (rank, host, pid, step, phase, when the phase began, its allowance, the time now) as
  ``<run_dir>/watchdog/<job>/rank<r>.json`` (written whole and renamed: a reader never sees half a file);
* fires when this rank has stayed in one phase longer than the phase's allowance (`Allowances`), when the rank it
  watches (its successor, (rank + 1) % world: one report read per period) has stopped reporting for longer than
  the step timeout (`silent_too_long`: a stopped rank is found even while the others wait in a long phase, a
  save), or when another rank fired (its ``hang.json`` is there). In synchronous training a rank that stops holds
  every other rank in the step's next collective, so every live rank sees its own progress stop and fires on its
  own: no rank needs another's answer, and a stopped rank cannot keep the others from deciding.

Firing: every live rank writes all its threads' Python stacks (`faulthandler`) to ``stacks.rank<r>.txt`` beside the
reports; the lowest rank still reporting reads every report once and logs the one line naming the ranks (and
hosts) that stopped reporting, or, when every rank still reports, the ranks furthest behind, with their last step
and phase (`name_stalled`, `hang_line`), and writes ``hang.json`` (what the launch scripts look for). The main
thread, if it runs Python again (its collective failed because the launcher killed the stopped rank), raises
`JobHung` at its next mark and `albert_dist.apps.pretrain.main` exits `EXIT_HUNG` (76) the normal way; if it is still blocked in a
collective after `EXIT_GRACE_S`, the thread ends the process itself: DataLoader workers killed, `os._exit(76)`.
The launcher then ends the rest (DeepSpeed's launch.py, torchrun and srun SIGTERM the other ranks when one exits
non-zero, and SIGKILL a stopped one 30 s later).

Why files in the run directory and not the rendezvous store (`albert_dist.distributed.rendezvous`): the store is
served by rank 0's process, so a SIGSTOP'd rank 0 would block every other rank's store call (for the store's
timeout) and with it their watchdogs and their exit; a file write or read blocks on nobody. The run directory is
already on a filesystem every rank writes (checkpoints), and the cost is one small write and one small read (the
successor's report) per rank per `poll_s` (5 s at the default timeouts); every report is read only when a rank
fires. The successor's silence is timed on the watcher's own clock; the line's "stopped reporting" compares the
reports' wall-clock times, so hosts' clocks must agree to a few seconds (NTP), far below the timeouts.
"""
from __future__ import annotations

import faulthandler
import json
import logging
import multiprocessing
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from albert_dist.exit_codes import EXIT_HUNG

logger = logging.getLogger(__name__)

#: The loop's phases, in the order a step passes through them ("startup" until the first mark, "done" after the loop).
PHASES = ("startup", "data", "forward_backward", "optimizer_step", "logging", "evaluation", "checkpoint_save",
          "stop_agreement", "done")
#: Phases whose work is not bounded by a step's: they get the start-up allowance (`Allowances.for_phase`).
LONG_PHASES = ("evaluation", "checkpoint_save")
#: Seconds the process-group timeout exceeds the longest allowance: the watchdog fires first, the collective's own
#: timeout is the backstop.
BACKSTOP_S = 120.0
#: Seconds a fired rank waits for its main thread to take the normal exit path before it `os._exit`s.
EXIT_GRACE_S = 5.0
#: The shortest time between two reports of a rank that is moving on: its report follows its step and phase within
#: this (a rank stopped from outside is named where it stopped, not where it was a period earlier) at <= 4 small
#: file writes a second, from the watchdog's thread (the training thread never writes).
PUBLISH_MIN_S = 0.25
#: The reports' folder under the run directory.
FOLDER = "watchdog"


@dataclass(frozen=True)
class Allowances:
    """How long a rank may stay in one phase, seconds (``engine.init_timeout_s``, ``engine.step_timeout_s``).

    Until the rank's first finished step every phase has `init_timeout_s` (process group, resume, the first batch,
    compile). After it: `step_timeout_s` for a step's phases; the data phase `step_timeout_s + store_retry_s` when
    the training data is in an object store (a loader riding out an outage for ``data.store_retry_s`` is retrying,
    not hung; past it the loader gives up and the job stops with 75); evaluation and checkpoint save
    max(init_timeout_s, step_timeout_s), as they read or write as much as a start-up. Raises `ValueError` for a
    timeout <= 0 or a negative `store_retry_s`.
    """

    init_timeout_s: float
    step_timeout_s: float
    store_retry_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("init_timeout_s", "step_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"engine.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.store_retry_s >= 0:
            raise ValueError(f"store_retry_s must be >= 0, got {self.store_retry_s!r}")

    def for_phase(self, phase: str, started: bool) -> float:
        """Seconds allowed in `phase`; `started`: this rank has finished a step since it started."""
        if not started:
            return self.init_timeout_s
        if phase in LONG_PHASES:
            return max(self.init_timeout_s, self.step_timeout_s)
        if phase == "data":
            return self.step_timeout_s + self.store_retry_s
        return self.step_timeout_s

    @property
    def longest_s(self) -> float:
        """The longest allowance of any phase."""
        return max(self.init_timeout_s, self.step_timeout_s + self.store_retry_s)

    @property
    def collective_timeout_s(self) -> float:
        """The process group's timeout (and the rendezvous store's): the longest allowance + `BACKSTOP_S`, so that
        the watchdog, which names the rank, always fires before a collective times out."""
        return self.longest_s + BACKSTOP_S

    @property
    def poll_s(self) -> float:
        """The watchdog's period: a tenth of the shortest timeout, at most 5 s."""
        return min(5.0, self.init_timeout_s / 10, self.step_timeout_s / 10)

    @property
    def silent_after_s(self) -> float:
        """A rank whose report is older than this has stopped reporting (4 periods + 2 s for clocks, at most the
        step timeout)."""
        return min(4 * self.poll_s + 2.0, self.step_timeout_s)


@dataclass(frozen=True)
class Report:
    """What one rank publishes: its place, its last phase and since when (wall-clock seconds, `time.time`)."""

    rank: int
    host: str
    pid: int
    job: str
    step: int
    phase: str
    since: float
    allowance_s: float
    time: float
    started: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Report":
        return cls(**json.loads(text))


class JobHung(RuntimeError):
    """The watchdog fired on this rank: raised by `Watchdog.mark` in the main thread; the message is its line."""


def overdue(phase: str, entered_s: float, now_s: float, allowances: Allowances, started: bool) -> bool:
    """True when a rank that entered `phase` at `entered_s` (monotonic seconds) has been in it past its allowance
    at `now_s`. The rule of `Watchdog`'s own check, apart for tests."""
    return phase != "done" and now_s - entered_s > allowances.for_phase(phase, started)


def silent_too_long(last_change_s: float, now_s: float, neighbour: Optional[Report],
                    allowances: Allowances) -> bool:
    """True when the rank this one watches (its successor) stopped reporting: its report, last seen changing at
    `last_change_s` (this rank's monotonic clock: no clock of another host is compared), has not changed for longer
    than `step_timeout_s` once it had finished a step (`init_timeout_s` before, or never reported). A rank in a long
    save still reports (its watchdog thread writes), so silence, unlike a long phase, needs no phase allowance."""
    if neighbour is not None and neighbour.phase == "done":
        return False
    limit = allowances.step_timeout_s if neighbour is not None and neighbour.started else allowances.init_timeout_s
    return now_s - last_change_s > limit


def name_stalled(reports: Mapping[int, Optional[Report]], world_size: int, now: float,
                 silent_after_s: float, also_silent: tuple[int, ...] = ()) -> tuple[list[int], bool]:
    """Which ranks to name for a hang, from every rank's last report (None: never reported) at wall time `now`:
    (ranks, silent). The ranks that stopped reporting (no report, or one older than `silent_after_s`) when there
    are any (silent = True); else (every rank still reports, e.g. one stuck in its data loader while the others
    wait for it) the ranks furthest behind: the lowest (step, phase in `PHASES` order) (silent = False). Ranks that
    finished ("done") are never named; `also_silent`: ranks known silent otherwise (a watcher saw it on its clock)."""
    live = {r: rep for r, rep in reports.items() if r < world_size}
    silent = [r for r in range(world_size) if live.get(r) is None or r in also_silent
              or (live[r].phase != "done" and now - live[r].time > silent_after_s)]
    if silent:
        return silent, True
    active = {r: rep for r, rep in live.items() if rep is not None and rep.phase != "done"}
    if not active:
        return [], False
    order = {p: i for i, p in enumerate(PHASES)}
    key = {r: (rep.step, order.get(rep.phase, len(PHASES))) for r, rep in active.items()}
    least = min(key.values())
    return sorted(r for r, k in key.items() if k == least), False


def hang_line(reports: Mapping[int, Optional[Report]], named: list[int], silent: bool, world_size: int,
              now: float, timeout_s: float) -> str:
    """The one line of a hang: who stopped, where, since when; `timeout_s` the allowance that was exceeded."""
    parts = []
    for r in named:
        rep = reports.get(r)
        if rep is None:
            parts.append(f"rank {r} (never reported)")
        else:
            parts.append(f"rank {r} (host {rep.host}, pid {rep.pid}) at step {rep.step}, phase {rep.phase} for "
                         f"{now - rep.since:.0f} s, last report {now - rep.time:.0f} s ago")
    what = "stopped reporting" if silent else "furthest behind, still reporting"
    return (f"hang: no progress for over {timeout_s:g} s; {len(named)} of {world_size} rank(s) {what}: "
            + "; ".join(parts))


def read_reports(folder: Path, world_size: int, job: str) -> dict[int, Optional[Report]]:
    """Every rank's last report of job `job` in `folder` (None for a rank with none, or one of another job)."""
    out: dict[int, Optional[Report]] = {}
    for r in range(world_size):
        try:
            rep = Report.from_json((folder / f"rank{r}.json").read_text())
        except (OSError, ValueError, TypeError):
            rep = None
        out[r] = rep if rep is not None and rep.job == job else None
    return out


def rank_report(run_dir: Path, rank: int) -> Optional[Report]:
    """The newest report `rank` published under `run_dir` in any job (``<run_dir>/watchdog/<job>/rank<r>.json``), or
    None when there is none yet or it does not read (being rewritten): what a tool outside the job watches, such as a
    test or bench/hang_stop.py waiting for a step before it stops a rank."""
    reports = []
    for path in Path(run_dir).glob(f"{FOLDER}/*/rank{rank}.json"):
        try:
            reports.append(Report.from_json(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return max(reports, key=lambda rep: rep.time, default=None)


def flight_recorder_env(backend: str, dump_prefix: str, environ: Mapping[str, str] = os.environ,
                        buffer_entries: int = 2000) -> dict[str, str]:
    """PyTorch's NCCL flight recorder for a job on `backend`: the variables to set before the process group starts
    (only those the user has not set in `environ`): a ring of `buffer_entries` collectives
    (TORCH_NCCL_TRACE_BUFFER_SIZE), dumped when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT=1) to
    ``<dump_prefix><rank>`` (TORCH_NCCL_DEBUG_INFO_TEMP_FILE). Empty for any backend but nccl (gloo has none)."""
    if backend != "nccl":
        return {}
    wanted = {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_entries), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix}
    return {k: v for k, v in wanted.items() if k not in environ}


class Watchdog:
    """One rank's hang watchdog (module docstring). `start()` after the run directory is known; `mark(phase)` and
    `step_done(step)` from the loop; `stop()` when the loop ends (idempotent).

    Args: `run_dir` the job's run directory; `job` the id every rank of this job shares (a folder under
    ``<run_dir>/watchdog/``); `rank`, `world_size` this rank's place; `allowances` the timeouts; `step` the step
    the job starts at; `exit` what ends the process after a hang (default: `hard_exit`, tests replace it) when the
    main thread has not seen the hang within `grace_s`.
    """

    def __init__(self, run_dir: Path, job: str, rank: int, world_size: int, allowances: Allowances, step: int = 0,
                 exit: Optional[Callable[[int], None]] = None, grace_s: float = EXIT_GRACE_S):
        self.folder = Path(run_dir) / FOLDER / job
        self.job, self.rank, self.world_size, self.allowances = job, rank, world_size, allowances
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.step, self.phase, self.started = step, "startup", False
        self._entered = time.monotonic()  # when this rank entered its phase (monotonic: immune to clock steps)
        self._since = time.time()  # the same, on the wall clock, for the report
        self.line: Optional[str] = None  # set when fired
        self.fired = threading.Event()
        self.acknowledged = False  # the main thread saw the hang (it raised JobHung, or train.py read `fired`)
        self._stopping = threading.Event()
        self._moved = threading.Event()  # the main thread entered a phase or finished a step: publish it
        self._thread: Optional[threading.Thread] = None
        self._exit, self._grace_s = exit or hard_exit, grace_s
        # the successor's last report text, when this rank saw it change (monotonic), and the report
        self._watched: tuple[Optional[str], float, Optional[Report]] = (None, time.monotonic(), None)
        self._exceeded: Optional[float] = None  # the timeout that made it fire
        self._silent_watched = False  # it fired because its successor stopped reporting

    # ------------------------------------------------------------------------------------- the main thread's side
    def mark(self, phase: str) -> None:
        """This rank enters `phase` (one of `PHASES`). Raises `JobHung` once the watchdog has fired."""
        if self.fired.is_set():
            self.acknowledged = True
            raise JobHung(self.line or "hang")
        self._entered, self._since, self.phase = time.monotonic(), time.time(), phase
        self._moved.set()

    def at_step(self, step: int) -> None:
        """The job is at optimiser step `step` without finishing one (a resume, a rollback): reports name it until the
        next step finishes; the allowances stay what they were (start-up's until the first step of this job)."""
        self.step = step
        self._moved.set()

    def step_done(self, step: int) -> None:
        """This rank finished optimiser step `step`: from now on the step allowances apply."""
        self.step, self.started = step, True
        self._moved.set()

    # ------------------------------------------------------------------------------------------------ the thread
    def start(self) -> "Watchdog":
        self.folder.mkdir(parents=True, exist_ok=True)
        global _CURRENT
        _CURRENT = self
        self._publish()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The job is over on this rank (`Trainer.close`, after the exit code was decided): no more checks; the
        report says "done"; `fired` no longer answers for this watchdog (a later job in the same process is new)."""
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None
        self.acknowledged = True  # the main thread is past the loop: its own path decides the exit, no hard exit
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._moved.set()  # wake the thread: it ends
        if self._thread is not None and self._thread is not threading.current_thread() and not self.fired.is_set():
            self._thread.join(timeout=2.0)  # its last report must not land after "done"
        if not self.fired.is_set():
            self.phase = "done"
            self._publish()

    def report(self) -> Report:
        phase = self.phase
        return Report(rank=self.rank, host=self.host, pid=self.pid, job=self.job, step=self.step, phase=phase,
                      since=self._since, allowance_s=self.allowances.for_phase(phase, self.started), time=time.time(),
                      started=self.started)

    def _publish(self) -> None:
        tmp = self.folder / f".rank{self.rank}.{threading.get_ident()}.json.tmp"  # a writer's own: two never mix
        try:
            tmp.write_text(self.report().to_json())
            os.replace(tmp, self.folder / f"rank{self.rank}.json")
        except OSError as err:  # a full or read-only disk must not kill training: the check goes on
            logger.debug("watchdog report not written: %s", err)

    def check(self, now: Optional[float] = None) -> bool:
        """True when this rank must fire now: past its phase's allowance, its successor silent too long (one report
        read per period: a stopped rank is found even while the others are in a long phase), or another rank
        fired."""
        now = time.monotonic() if now is None else now
        if overdue(self.phase, self._entered, now, self.allowances, self.started):
            self._exceeded = self.allowances.for_phase(self.phase, self.started)
            return True
        if self._watch(now):
            self._silent_watched, neighbour = True, self._watched[2]
            self._exceeded = (self.allowances.step_timeout_s if neighbour is not None and neighbour.started
                              else self.allowances.init_timeout_s)
            return True
        return (self.folder / "hang.json").exists()

    def _watch(self, now: float) -> bool:
        """Read the successor's report ((rank + 1) % world: every rank is watched by one other); True when it has
        been silent too long (`silent_too_long`)."""
        if self.world_size < 2:
            return False
        try:
            text = (self.folder / f"rank{(self.rank + 1) % self.world_size}.json").read_text()
            report = Report.from_json(text)
            report = report if report.job == self.job else None
        except (OSError, ValueError, TypeError):
            text, report = None, None
        if report is not None and text != self._watched[0]:
            self._watched = (text, now, report)
        return silent_too_long(self._watched[1], now, self._watched[2], self.allowances)

    def _run(self) -> None:
        """Publish this rank's report when it moves on (at most every `PUBLISH_MIN_S`) and at least once a period;
        check once a period (`check`), and fire when it says so."""
        due = time.monotonic() + self.allowances.poll_s
        while True:
            self._moved.wait(max(0.0, due - time.monotonic()))
            if self._stopping.is_set():
                return
            self._moved.clear()
            self._publish()
            if time.monotonic() >= due:
                due = time.monotonic() + self.allowances.poll_s
                if self.check():
                    self._fire()
                    return
            if self._stopping.wait(min(PUBLISH_MIN_S, max(0.0, due - time.monotonic()))):
                return

    def _fire(self) -> None:
        if self._stopping.is_set():
            return
        phase = self.phase
        allowance = self._exceeded or self.allowances.for_phase(phase, self.started)
        stacks = self.folder / f"stacks.rank{self.rank}.txt"
        try:
            with open(stacks, "w") as fh:
                fh.write(f"rank {self.rank} (host {self.host}, pid {self.pid}) at step {self.step}, phase {phase}; "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
        except OSError as err:
            logger.error("watchdog: stacks not written to %s: %s", stacks, err)
        dump_flight_recorder(self.folder / f"nccl_trace_rank_{self.rank}")
        now = time.time()
        reports = read_reports(self.folder, self.world_size, self.job)
        reports[self.rank] = self.report()
        watched = (self.rank + 1) % self.world_size
        named, silent = name_stalled(reports, self.world_size, now, self.allowances.silent_after_s,
                                     (watched,) if self._silent_watched else ())
        line = hang_line(reports, named, silent, self.world_size, now, allowance)
        reporter = min((r for r in range(self.world_size) if r not in named or not silent), default=self.rank)
        self.line = f"{line}; stacks of every live rank in {self.folder}; exit {EXIT_HUNG}"
        if self.rank == reporter or not (self.folder / "hang.json").exists():
            try:
                tmp = self.folder / f".hang.rank{self.rank}.tmp"
                tmp.write_text(json.dumps({"line": line, "named": named, "silent": silent, "rank": self.rank,
                                           "time": now}))
                os.replace(tmp, self.folder / "hang.json")
            except OSError:
                pass
        if self.rank == reporter:
            logger.error("%s", self.line)
        else:
            logger.warning("rank %d stopped by the hang watchdog (rank %d's line names who hung); stacks in %s; exit %d",
                           self.rank, reporter, stacks, EXIT_HUNG)
        self.fired.set()
        deadline = time.monotonic() + self._grace_s
        while time.monotonic() < deadline and not self.acknowledged:
            time.sleep(0.1)
        if not self.acknowledged:  # the main thread is blocked (a collective): end the process from here
            self._exit(EXIT_HUNG)


_CURRENT: Optional[Watchdog] = None


def dump_flight_recorder(path: Path, timeout_s: float = 10.0) -> bool:
    """On a job whose process group is nccl: PyTorch's NCCL flight recorder (`flight_recorder_env`) written to `path`
    now (the watchdog fires before any collective times out, so NCCL's own dump on timeout would never come);
    True when written. Nothing on gloo or without a process group. Bounded: the dump runs in a helper thread that is
    abandoned after `timeout_s`, so a recorder stuck behind the hang cannot keep the rank from exiting."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"):
            return False
        from torch._C._distributed_c10d import _dump_nccl_trace  # CUDA builds only
    except Exception:  # noqa: BLE001 - a CPU build, no group: nothing to dump
        return False
    done = threading.Event()

    def dump() -> None:
        try:
            path.write_bytes(_dump_nccl_trace())
            done.set()
        except Exception as err:  # noqa: BLE001 - a dump is a bonus, never a reason not to exit
            logger.warning("watchdog: NCCL flight recorder not dumped to %s: %s", path, err)

    threading.Thread(target=dump, name="flight-recorder-dump", daemon=True).start()
    return done.wait(timeout_s)


def fired() -> Optional[str]:
    """The hang line when this process's watchdog has fired (marking it seen by the main thread), else None:
    `albert_dist.apps.pretrain.main` asks when an error ends the job (a collective failing after the watchdog fired is a hang)."""
    wd = _CURRENT
    if wd is None or not wd.fired.is_set():
        return None
    wd.acknowledged = True
    return wd.line or "hang"


def hard_exit(code: int) -> None:
    """End this process now with `code` from a thread other than the main one: its DataLoader workers killed
    (daemonic children; `albert_dist.job.stop.stop_loader_workers` must run in the main thread), DeepSpeed's
    shared-memory workspace released, logs and stdio flushed, then `os._exit`."""
    from albert_dist.job.stop import release_shm_workspace

    for child in multiprocessing.active_children():
        if child.daemon:
            try:
                os.kill(child.pid, 9)
            except OSError:
                pass
    release_shm_workspace()
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - nothing may stop the exit
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


__all__ = ["Allowances", "BACKSTOP_S", "EXIT_GRACE_S", "JobHung", "LONG_PHASES", "PHASES", "Report", "Watchdog",
           "dump_flight_recorder", "fired", "flight_recorder_env", "hang_line", "hard_exit", "name_stalled", "overdue", "read_reports",
           "silent_too_long"]
