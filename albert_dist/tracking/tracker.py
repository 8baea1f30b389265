"""One MLflow run per job, opened by global rank 0 in the background, never at the cost of training time.

Guarantees (the failure modes this design answers):

* one run per job: only rank 0 creates the run; its id is recorded in ``<run_dir>/mlflow_run.json`` with the
  absolute tracking URI, so a requeued attempt (or `albert-dist tracking sync`) continues the same run from
  any working directory;
* a server that is down costs no training time: the constructor waits at most
  ``tracking.connect_timeout_s`` for the run, then training starts anyway. Metrics are in the local log
  (``metrics.jsonl``) and the background `albert_dist.tracking.sender.RunSender` creates or reopens the run
  when the server answers and sends the log in order with the original steps and timestamps;
* no step logged twice after a resume, none lost (the sender resumes the log where the run's data ends);
* checkpoints become complete artifacts only after their metrics arrived; older checkpoint artifacts are
  deleted beyond ``tracking.keep_last_checkpoints`` (`albert_dist.tracking.checkpoints`);
* bounded exits: `close` waits ``close_timeout_s`` at the end of a job, `PREEMPT_TIMEOUT_S` after a stop
  signal, and names what is left unsent (it stays on disk for the next attempt or ``tracking sync``);
* credentials never logged: params, tags and text artifacts go through `albert_dist.tracking.secrets`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from albert_dist.tracking.base import RUN_STATUSES, JsonlTracker, NullTracker, Tracker
from albert_dist.tracking.checkpoints import stage_artifact, stage_checkpoint
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.params import flatten, hostname, run_tags
from albert_dist.tracking.secrets import redact, scrub_text
from albert_dist.tracking.sender import RunSender

log = logging.getLogger(__name__)

STATE_FILE = "mlflow_run.json"
DEFAULT_STORE_NAME = "mlruns.db"
#: The experiment tag MLflow 3's UI reads to open an experiment on its runs ("Model training") instead of the
#: GenAI traces view (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
#: How long a preempted job's close may take (Slurm's grace period is short; what is left goes next attempt).
PREEMPT_TIMEOUT_S = 5.0
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RunMovedOn(ValueError):
    """``--resume auto`` of a run directory whose MLflow run was continued from another run directory past the
    checkpoint this job resumes from: MLflow keeps the first value of a (metric, step), so this job's records would
    never reach the run. The job is refused (exit 2); the message says what happened and the two ways on."""


def default_store_dir() -> Path:
    """Where the default SQLite store lives: the source checkout albert_dist runs from (the directory with its
    pyproject.toml), else the working directory. One place, so every command of a checkout finds its runs."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local store made absolute against the working directory (``sqlite:///x.db``,
    ``file:x``, a plain path); server and other URIs unchanged."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri[len("sqlite:///"):]
        return uri if path in ("", ":memory:") else f"sqlite:///{os.path.abspath(path)}"
    if uri.startswith("file:"):
        path = uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):]
        return f"file://{os.path.abspath(path)}"
    # a plain directory is MLflow's file store; these three words are not (mlflow/tracking/_tracking_service/registry.py)
    if "://" not in uri and ":" not in uri and uri not in ("databricks", "databricks-uc", "uc"):
        return f"file://{os.path.abspath(uri)}"
    return uri


def artifact_location(uri: str) -> Optional[str]:
    """Where a new experiment of a local SQLite store keeps its artifacts: ``mlruns/`` beside the database file
    (MLflow's own default is ``./mlruns`` of the working directory, so jobs started from different directories
    would scatter one store's artifacts); None for any other store (a server or file store decides)."""
    if uri.startswith("sqlite:////"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
    return None


def resolve_tracking_uri(uri: Optional[str] = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<default_store_dir()>/mlruns.db``; absolute."""
    return absolute_uri(uri or os.environ.get("MLFLOW_TRACKING_URI")
                        or f"sqlite:///{default_store_dir() / DEFAULT_STORE_NAME}")


def local_store_path(uri: str) -> Optional[Path]:
    """The file or directory an absolute local store URI (``sqlite:////x.db``, ``file:///dir``) names; None for a
    server or any other URI."""
    if uri.startswith("sqlite:////"):
        return Path(uri[len("sqlite:///"):])
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    return None


def require_existing_store(uri: str, what: str) -> None:
    """Refuse to read runs from a local store that does not exist: MLflow would create an empty one there (a
    stray ``mlruns.db``) and then answer "Run ... not found".

    Raises:
        ValueError: naming the store's path and ``what`` was looked up in it.
    """
    path = local_store_path(uri)
    if path is not None and not path.exists():
        raise ValueError(f"{what}: no MLflow store at {path} (tracking URI {uri}); pass the store the run logged "
                         "to with --tracking-uri or MLFLOW_TRACKING_URI")


def create_local_store(uri: str) -> None:
    """Create a local SQLite store's tables (if they are not there) under an OS lock on its directory.

    Two jobs starting at once on a new store (e.g. the cells of a job array) otherwise both run MLflow's schema
    creation and the second fails ("table ... already exists"); with the lock the second finds the tables made.
    A no-op for a server or any other URI.
    """
    from albert_dist.job.lock import flock

    path = local_store_path(uri)
    if path is None or not uri.startswith("sqlite:"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)  # the directory: no lock file left beside the store
    try:
        flock(fd)
        from mlflow import MlflowClient

        MlflowClient(uri).search_experiments(max_results=1)
    finally:
        os.close(fd)  # releases the lock


def parse_run_ref(ref: str) -> str:
    """A run id from ``<run_id>`` or ``runs:/<run_id>[/path]``.

    Raises:
        ValueError: ``ref`` is neither (names the value).
    """
    candidate = ref[len("runs:/"):].strip("/").split("/")[0] if ref.startswith("runs:/") else ref.strip()
    if not _RUN_ID.match(candidate):
        raise ValueError(f"not an MLflow run id (32 hex digits) or runs:/<run_id>: {ref!r}")
    return candidate


def read_state(run_dir: str | Path) -> dict:
    """``<run_dir>/mlflow_run.json`` (run id or null, tracking URI, experiment, run name, tags, pending
    uploads, final status), or {} when there is none."""
    try:
        return json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def read_run_id(run_dir: str | Path) -> Optional[str]:
    """The MLflow run id a previous attempt of this job recorded in ``run_dir`` (None if there is none)."""
    return read_state(run_dir).get("run_id")


class MLflowTracker(Tracker):
    """The MLflow run of one training job (module docstring), over a local tracker that writes metrics.jsonl.

    Global rank 0's tracker; no collective inside: the app gathers ``hosts`` and hands the run id (or the
    error) to the other ranks, whose `NodeTracker` runs the system-metrics monitor of their node.

    Args:
        cfg: tracking section of the config.
        run_dir: the job's run directory (state file, metric log).
        hosts: host names of all ranks, duplicates allowed (tags ``hosts``/``num_hosts``; several hosts: the
            system metrics are per node); None: this host only.
        resume_run_id: continue this run; None: a new run (created when the server answers; a job whose
            earlier attempt never reached the server continues that attempt's state and metric log).
        tags: extra run tags (scrubbed of secrets).
        local: the local tracker (default: `JsonlTracker(run_dir)`).
        keep_last_checkpoints: checkpoint artifacts kept (None: all); ``keep_steps``: steps never deleted.
        replay: `albert-dist tracking sync`: tags only from the state file (not this machine's), full close
            timeout whatever the status.
        resumed_step: the step of the local checkpoint a ``--resume auto`` job resumes ``resume_run_id`` from:
            a run that another run directory (its ``run_dir`` tag) took past this step is not continued
            (`RunMovedOn`).

    Raises:
        RuntimeError: the server answered that the run cannot be opened (deleted, unknown id, refused
            credentials); an unreachable server is not an error. RunMovedOn: see ``resumed_step``.
    """

    def __init__(self, cfg: TrackingConfig, *, run_dir: str, hosts: Optional[Sequence[str]] = None,
                 resume_run_id: Optional[str] = None, tags: Optional[dict[str, str]] = None,
                 local: Optional[Tracker] = None, keep_last_checkpoints: Optional[int] = None,
                 keep_steps: tuple = (), replay: bool = False, resumed_step: Optional[int] = None):
        from mlflow import MlflowClient

        self.cfg, self.run_dir, self._replay = cfg, str(run_dir), replay
        self._resumed_step = resumed_step
        self.run_id: Optional[str] = None
        self._closed = False
        self._monitor = None
        self._lock = threading.Lock()  # the state file is written from the training and the sender thread
        hosts = list(hosts or [hostname()])
        self._node_id = hostname() if len(set(hosts)) > 1 else None
        # The sender is the one retry layer: MLflow's own HTTP retries would keep one request going for
        # minutes while the server is down, hiding that it is back. (The request timeout stays MLflow's
        # 120 s: a large checkpoint upload may legitimately wait that long for its answer.)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        # Checkpoint retention downloads each checkpoint's COMPLETE.json, and MLflow draws a tqdm bar for every
        # download: three bars per save in a job's log, between the console lines (house rule: bars only on
        # request). Unless the user asks for them.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        self.local = local if local is not None else JsonlTracker(self.run_dir)
        state = read_state(self.run_dir)
        if resume_run_id != state.get("run_id"):  # another run's state
            state = {}
        self._resuming = resume_run_id is not None
        self.tracking_uri = state.get("tracking_uri") or resolve_tracking_uri(cfg.tracking_uri)
        self._state = {
            "run_id": resume_run_id, "tracking_uri": self.tracking_uri,
            "experiment_name": state.get("experiment_name", cfg.experiment_name),
            "run_name": state.get("run_name") or cfg.run_name or Path(self.run_dir).resolve().name,
            "tags": {**state.get("tags", {}), **({} if replay else redact(run_tags(hosts) | (tags or {})))},
            "pending": [], "status": None,
        }
        os.makedirs(self.run_dir, exist_ok=True)
        self._save_state()
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self._sender = RunSender(self._client, self.run_dir, self._open_run, flush_interval_s=cfg.flush_interval_s,
                                 retry_backoff_s=cfg.retry_backoff_s, max_backoff_s=cfg.max_backoff_s,
                                 keep_last=keep_last_checkpoints, keep_steps=keep_steps, on_open=self._on_open,
                                 on_reconnect=self._on_reconnect, on_pending=self._on_pending)
        for job in state.get("pending", []):  # what an earlier attempt could not upload
            if os.path.isdir(job.get("staging", "")):
                self._sender.submit(job)
        self._sender.start()
        self._sender.opened.wait(timeout=cfg.connect_timeout_s)
        if isinstance(self._sender.error, RunMovedOn):
            raise self._sender.error
        if self._sender.error is not None:
            raise RuntimeError(f"MLflow run could not be opened ({self._public_uri()}): "
                               f"{scrub_text(f'{type(self._sender.error).__name__}: {self._sender.error}')}")
        if self._sender.run is None:
            log.warning("MLflow at %s did not answer within tracking.connect_timeout_s=%g s; training starts "
                        "anyway, the run is created when it answers (or run `albert-dist tracking sync %s`)",
                        self._public_uri(), cfg.connect_timeout_s, self.run_dir)

    def _public_uri(self) -> str:
        return scrub_text(self.tracking_uri)  # no user info, no secret value

    def _open_run(self, client: Any) -> Any:
        """Reopen the recorded run, or create it (sender thread, retried while the server is unreachable)."""
        from mlflow.entities import RunStatus
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_STATE

        create_local_store(self.tracking_uri)
        tags = dict(self._state["tags"])
        if self._state["run_id"] is not None:
            run = client.get_run(self._state["run_id"])
            if run.info.lifecycle_stage != "active":
                raise MlflowException(f"MLflow run {run.info.run_id} is {run.info.lifecycle_stage}; cannot resume it",
                                      error_code=INVALID_STATE)
            self._check_not_moved_on(run)
            client.update_run(run.info.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            tags.pop("mlflow.user", None)  # who started the run stays
            tags["resumed_count"] = str(int(run.data.tags.get("resumed_count", "0")) + 1)
            log.info("continuing MLflow run %s (%s)", run.info.run_id, self._public_uri())
        else:
            name = self._state["experiment_name"]
            exp = client.get_experiment_by_name(name)
            if exp is None:
                try:
                    client.create_experiment(name, artifact_location=artifact_location(self.tracking_uri),
                                             tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
                except MlflowException:  # another job created it meanwhile
                    pass
                exp = client.get_experiment_by_name(name)
            elif EXPERIMENT_KIND_TAG not in exp.tags:
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            run = client.create_run(exp.experiment_id, run_name=self._state["run_name"])
            log.info("created MLflow run %s %r in experiment %r (%s)", run.info.run_id, self._state["run_name"],
                     name, self._public_uri())
        if self.tracking_uri.startswith(("http://", "https://")):  # the ML view; a fresh browser opens on GenAI
            log.info("MLflow UI: %s/#/experiments/%s/runs/%s?workflowType=machine_learning",
                     self._public_uri().rstrip("/"), run.info.experiment_id, run.info.run_id)
        self._sender.add_tags(tags)
        return run

    def _check_not_moved_on(self, run: Any) -> None:
        """`RunMovedOn` when another run directory (the run's ``run_dir`` tag) logged steps past
        ``resumed_step`` (a rerun of this directory's own steps, e.g. a requeue after a kill -9, is exact: its
        first values stand, by design)."""
        if self._resumed_step is None:
            return
        here = str(Path(self.run_dir).resolve())
        there = run.data.tags.get("run_dir")
        last = max((m.step for m in run.data._metric_objs), default=0)
        if there is None or there == here or last <= self._resumed_step:
            return
        raise RunMovedOn(
            f"MLflow run {run.info.run_id} (named in {Path(here) / STATE_FILE}) went on without this directory: "
            f"{there} continued it to step {last} (status {run.info.status}) while this directory's checkpoint is at "
            f"step {self._resumed_step}, and MLflow keeps the first value of a step, so this job's records would never "
            f"reach it; continue that run where it went on (--resume auto in {there}, or --resume-from "
            f"{run.info.run_id}), or train on here into a new MLflow run: remove {Path(here) / STATE_FILE}")

    def _on_open(self, run: Any) -> None:
        self.run_id = run.info.run_id
        with self._lock:
            self._state["run_id"] = self.run_id
            self._save_state()
        self._monitor = start_system_metrics(self.cfg, self.run_id, self.tracking_uri, self._node_id,
                                             resume=self._resuming)

    def _on_reconnect(self) -> None:  # MLflow's monitor stops on an outage
        stop_system_metrics(self._monitor)
        self._monitor = start_system_metrics(self.cfg, self.run_id, self.tracking_uri, self._node_id, resume=True)

    def _on_pending(self, jobs: list[dict]) -> None:
        with self._lock:
            self._state["pending"] = jobs
            self._save_state()

    def _save_state(self) -> None:
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        os.replace(tmp, path)

    # ---- the tracker contract ----
    def log_params(self, params: dict[str, Any]) -> None:
        """Log a (nested) config / dict as dotted params (`albert_dist.tracking.params.flatten`); on a resumed
        run a param with a new value is recorded as the tag ``param_changed.<name>``."""
        self.local.log_params(params)
        self._sender.add_params(flatten(params))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Append to the local log (the sender sends it in the background); never waits on the network."""
        self.local.log_metrics(metrics, step)

    def log_checkpoint(self, local_dir: str, step: int) -> None:
        """Queue the upload of a finished checkpoint (snapshot with hard links; returns at once). It is marked
        complete after its files and every metric logged before this call arrived."""
        self.local.log_checkpoint(local_dir, step)
        if self.cfg.log_checkpoints:
            self._sender.submit(stage_checkpoint(local_dir, step))

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None, redact_keys: bool = True) -> None:
        """Queue a file or directory for upload. Text files (``.json``, ``.yaml``, ...) go as a copy with
        secret environment values scrubbed and, if ``redact_keys``, the values of secret-named keys masked
        (configs; not model exports, whose keys are a library's fixed schema).

        Raises:
            ValueError: ``local_path`` does not exist.
        """
        self._sender.submit(stage_artifact(local_path, self.run_dir, artifact_path, redact_keys))

    def set_tags(self, tags: dict[str, str]) -> None:
        """Queue tags (scrubbed of secrets; also kept in the state file for `tracking sync`)."""
        tags = redact({k: str(v) for k, v in tags.items()})
        with self._lock:
            self._state["tags"].update(tags)
            self._save_state()
        self._sender.add_tags(tags)

    @property
    def skipped_steps(self) -> int:
        """Metric values not sent because the run already held their (key, step) (a resume re-ran them)."""
        return self._sender.skipped

    @property
    def checkpoints_uploaded(self) -> list[int]:
        """Steps whose checkpoint upload completed."""
        return list(self._sender.completed)

    def close(self, status: str = "FINISHED") -> dict:
        """Deliver what is left within ``close_timeout_s`` (``connect_timeout_s`` when the server never
        answered during the job; at most `PREEMPT_TIMEOUT_S` for ``KILLED``: a preempted job must exit before
        its grace period ends), then end the run with ``status``. Whatever did not arrive
        stays on disk (metrics.jsonl, the pending uploads in mlflow_run.json) for the next attempt or
        ``albert-dist tracking sync``; the log says what. Idempotent; never raises on server trouble.

        Returns:
            what is left unsent: ``{"params", "tags", "metric_records", "uploads", "run": bool}``; {} when
            already closed.

        Raises:
            ValueError: unknown ``status``.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"tracker close status must be one of {RUN_STATUSES}, got {status!r}")
        if self._closed:
            return {}
        self._closed = True
        budget = self.cfg.close_timeout_s
        if self._sender.run is None:  # the server never answered during the job: no reason it would now
            budget = min(budget, self.cfg.connect_timeout_s)
        if status == "KILLED" and not self._replay:
            budget = min(budget, PREEMPT_TIMEOUT_S)
        deadline = time.monotonic() + budget
        self.local.close(status)
        left = self._sender.close(max(0.1, deadline - time.monotonic()))
        jobs = self._sender.pending_uploads
        stop_system_metrics(self._monitor, timeout_s=min(2.0, max(0.1, deadline - time.monotonic())))
        ended = self._sender.run is not None and _join_bounded(
            lambda: self._client.set_terminated(self.run_id, status), max(1.0, deadline - time.monotonic()))
        left.update(uploads=len(jobs), run=not ended)
        with self._lock:
            self._state.update(status=status, ended=bool(ended), pending=jobs)
            self._save_state()
        if isinstance(self._sender.error, RunMovedOn):  # the server answered only after the job started
            log.error("%s", self._sender.error)
        if any(left.values()):
            log.error("MLflow (%s): not delivered within %.0f s: %d metric records, %d params, %d tags, uploads %s%s; "
                      "kept in %s: `albert-dist tracking sync %s` sends them", self._public_uri(), budget,
                      left["metric_records"], left["params"], left["tags"], [j["dest"] for j in jobs],
                      "" if ended else f", run end ({status})", self.run_dir, self.run_dir)
        else:
            log.info("MLflow run %s ended %s", self.run_id, status)
        return left


class NodeTracker(NullTracker):
    """The tracker of a rank other than global rank 0 in a tracked job: records nothing; knows the job's
    ``run_id`` (None while the server has not answered) and, given a ``node_id`` (local rank 0 of a job on
    several hosts), runs MLflow's system-metrics monitor for the run under that node's name until `close`."""

    def __init__(self, cfg: TrackingConfig, run_id: Optional[str], node_id: Optional[str] = None):
        self.run_id = run_id
        self._monitor = None
        if node_id and run_id:
            self._monitor = start_system_metrics(cfg, run_id, resolve_tracking_uri(cfg.tracking_uri), node_id,
                                                 resume=True)

    def close(self, status: str) -> None:
        """Stop the monitor (bounded)."""
        stop_system_metrics(self._monitor)
        self._monitor = None


def start_system_metrics(cfg: TrackingConfig, run_id: str, uri: str, node_id: Optional[str], resume: bool) -> Any:
    """MLflow's `SystemMetricsMonitor` for ``run_id``, started, when ``cfg.log_system_metrics``; else None.
    A monitor that cannot start is logged, never an error."""
    if not cfg.log_system_metrics:
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    try:
        monitor = SystemMetricsMonitor(run_id, sampling_interval=cfg.system_metrics_interval_s,
                                       resume_logging=resume, node_id=node_id, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception as exc:  # noqa: BLE001 - system metrics are never worth failing the run for
        log.warning("MLflow system metrics not started: %s", exc)
        return None


def stop_system_metrics(monitor: Any, timeout_s: float = 5.0) -> None:
    """Stop a monitor of `start_system_metrics` (None: nothing); finish() joins a thread that may be inside
    a request, so the wait is bounded."""
    if monitor is not None:
        _join_bounded(monitor.finish, timeout_s)


def _join_bounded(fn: Any, timeout_s: float) -> bool:
    """Run ``fn`` on a daemon thread; True if it returned without error within ``timeout_s``."""
    ok: list[bool] = []

    def call() -> None:
        try:
            fn()
            ok.append(True)
        except Exception as exc:  # noqa: BLE001 - logged; the caller reports what is left
            log.warning("MLflow call failed: %s: %s", type(exc).__name__, str(exc)[:200])

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(ok)
