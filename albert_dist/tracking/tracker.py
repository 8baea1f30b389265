"""One MLflow run per job: created (or resumed) by global rank 0, its id broadcast to every rank.

The trainer talks to a tracker with four methods (the contract shared with the engine's console tracker):
``log_params(dict)``, ``log_metrics(dict, step)``, ``log_checkpoint(local_dir, step)``, ``close(status)``.
`MLflowTracker` implements them on global rank 0 and as no-ops elsewhere, so every rank may call them.

Guarantees (the failure modes this design answers):

* one run per job: only rank 0 ever calls ``create_run``; the constructor is collective (all ranks call it;
  the run id, or rank 0's error, is broadcast with ``torch.distributed.broadcast_object_list``) and records
  the id in ``<run_dir>/mlflow_run.json`` so a requeued job continues the same run;
* metrics never stall training and survive an outage: `albert_dist.tracking.sender.BatchSender` buffers and
  retries in the background; each metric is also appended to ``<run_dir>/mlflow_metrics.jsonl`` so that a
  job killed with unsent metrics re-sends them when it resumes;
* no step logged twice after a resume: the constructor reads the last logged step of every metric key and
  `log_metrics` drops a (key, step) at or below it (the resumed job recomputes steps that were logged after
  the checkpoint it restarts from; resume is exact, so the first values stand);
* checkpoints become complete artifacts only after their metrics arrived (no gap between the newest complete
  checkpoint and the logged metrics) — see `albert_dist.tracking.checkpoints`;
* credentials never logged: params, tags and text artifacts go through `albert_dist.tracking.secrets`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Any, Optional

from albert_dist.tracking.config import TrackingConfig

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
RUN_FILE = "mlflow_run.json"
SPOOL_FILE = "mlflow_metrics.jsonl"
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
#: Text artifacts scrubbed of secrets before upload (binary files are uploaded as they are).
TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".toml", ".sh", ".log")


def resolve_tracking_uri(cfg: TrackingConfig) -> str:
    """``cfg.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a local SQLite store (no server needed)."""
    return cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def parse_run_ref(ref: str) -> str:
    """A run id from ``<run_id>`` or ``runs:/<run_id>[/path]``.

    Raises:
        ValueError: ``ref`` is neither (names the value).
    """
    candidate = ref[len("runs:/"):].strip("/").split("/")[0] if ref.startswith("runs:/") else ref.strip()
    if not _RUN_ID.match(candidate):
        raise ValueError(f"not an MLflow run id (32 hex digits) or runs:/<run_id>: {ref!r}")
    return candidate


def read_run_id(run_dir: str) -> Optional[str]:
    """The MLflow run id a previous attempt of this job recorded in ``run_dir`` (None if there is none)."""
    try:
        with open(os.path.join(run_dir, RUN_FILE)) as f:
            return json.load(f)["run_id"]
    except (OSError, ValueError, KeyError):
        return None


def _dist_ready(world_size: int) -> bool:
    if world_size <= 1:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class MLflowTracker:
    """The MLflow run of one training job (see the module docstring for the guarantees).

    Collective: every rank must construct it (after the process group is initialised when world_size > 1).

    Args:
        cfg: tracking section of the config.
        run_dir: the job's local run directory (run id file, metric spool).
        rank, world_size: global rank and world size.
        resume_run_id: continue this run (``--resume-from``, or the id a previous attempt recorded);
            None = create a new run.
        tags: extra tags (e.g. ``{"mlflow.source.name": "albert-dist train"}``), scrubbed of secrets.

    Raises:
        RuntimeError: on every rank, when rank 0 could not create or resume the run (message included).
    """

    def __init__(self, cfg: TrackingConfig, *, run_dir: str, rank: int = 0, world_size: int = 1,
                 resume_run_id: Optional[str] = None, tags: Optional[dict[str, str]] = None):
        from albert_dist.tracking.params import environment_tags, hostname

        self.cfg = cfg
        self.run_dir = run_dir
        self.rank = rank
        self.tracking_uri = resolve_tracking_uri(cfg)
        self.run_id: Optional[str] = None
        self.resumed = resume_run_id is not None
        self.skipped_steps = 0
        """(key, step) pairs dropped because the run already had that step (a resume re-ran it)."""
        self._client = None
        self._sender = None
        self._uploader = None
        self._existing_params: dict[str, str] = {}
        self._last_step: dict[str, int] = {}
        self._spool = None
        self._closed = False

        dist_ready = _dist_ready(world_size)
        hosts = [hostname()]
        if dist_ready:
            import torch.distributed as dist

            hosts = [None] * world_size
            dist.all_gather_object(hosts, hostname())
        error = None
        if rank == 0:
            try:
                self._open_run(resume_run_id, environment_tags(hosts) | (tags or {}))
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                log.exception("could not open the MLflow run")
                error = f"{type(exc).__name__}: {exc}"
                self._shutdown_threads(0.1)
        if dist_ready:
            import torch.distributed as dist

            box = [self.run_id, error]
            dist.broadcast_object_list(box, src=0)
            self.run_id, error = box
        if error is not None:
            from albert_dist.tracking.secrets import scrub_text

            raise RuntimeError(f"MLflow run could not be opened on rank 0 ({scrub_text(self.tracking_uri)}): "
                               f"{scrub_text(error)}")

    # ---- rank 0: run lifecycle ----
    def _open_run(self, resume_run_id: Optional[str], tags: dict[str, str]) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import RunStatus

        from albert_dist.tracking.checkpoints import CheckpointUploader
        from albert_dist.tracking.secrets import redact, strip_uri_userinfo
        from albert_dist.tracking.sender import BatchSender

        cfg = self.cfg
        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        if resume_run_id is not None:
            run = client.get_run(resume_run_id)
            if run.info.lifecycle_stage != "active":
                raise ValueError(f"MLflow run {resume_run_id} is {run.info.lifecycle_stage}; cannot resume it")
            self.run_id = run.info.run_id
            self._existing_params = dict(run.data.params)
            for key in run.data.metrics:
                self._last_step[key] = max(m.step for m in client.get_metric_history(self.run_id, key))
            client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            log.info("continuing MLflow run %s (%s); last logged step %s", self.run_id,
                     strip_uri_userinfo(self.tracking_uri),
                     max(self._last_step.values(), default=None))
        else:
            exp = client.get_experiment_by_name(cfg.experiment_name)
            if exp is None:
                try:
                    exp_id = client.create_experiment(cfg.experiment_name)
                except Exception:  # noqa: BLE001 - another job created it meanwhile
                    exp = client.get_experiment_by_name(cfg.experiment_name)
                    if exp is None:
                        raise
                    exp_id = exp.experiment_id
            else:
                exp_id = exp.experiment_id
            run = client.create_run(exp_id, run_name=cfg.run_name)
            self.run_id = run.info.run_id
            log.info("created MLflow run %s in experiment %r (%s)", self.run_id, cfg.experiment_name,
                     strip_uri_userinfo(self.tracking_uri))
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, RUN_FILE), "w") as f:
            json.dump({"run_id": self.run_id, "experiment_id": run.info.experiment_id,
                       "tracking_uri": strip_uri_userinfo(self.tracking_uri)}, f)
        self._sender = BatchSender(client, self.run_id, flush_interval_s=cfg.flush_interval_s,
                                   retry_backoff_s=cfg.retry_backoff_s, max_backoff_s=cfg.max_backoff_s)
        self._uploader = CheckpointUploader(client, self.run_id, retry_backoff_s=cfg.retry_backoff_s, max_backoff_s=cfg.max_backoff_s)
        self._replay_spool()
        self._spool = open(os.path.join(self.run_dir, SPOOL_FILE), "a")
        if self.resumed:
            tags = {k: v for k, v in tags.items() if k != "mlflow.user"}
            tags["resumed_count"] = str(int(run.data.tags.get("resumed_count", "0")) + 1)
        self._sender.add_tags(redact(tags))

    def _replay_spool(self) -> None:
        """Queue metrics an earlier attempt of this run spooled locally but the server does not have."""
        path = os.path.join(self.run_dir, SPOOL_FILE)
        if not self.resumed or not os.path.exists(path):
            return
        replayed = 0
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut by a kill
                    continue
                if rec.get("run_id") != self.run_id:
                    continue
                key, step = rec["key"], int(rec["step"])
                if step > self._last_step.get(key, -1):
                    self._sender.add_metrics({key: rec["value"]}, step, timestamp_ms=rec["timestamp"])
                    self._last_step[key] = step
                    replayed += 1
        if replayed:
            log.warning("re-sending %d metrics spooled by an earlier attempt but missing on the server", replayed)

    # ---- the tracker contract ----
    def log_params(self, params: dict[str, Any]) -> None:
        """Log a (nested) config / dict as dotted params; secret-named keys masked.

        On a resumed run a param already present with the same value is skipped, one with a different value
        (e.g. another world size after an elastic resume) is kept and the new value recorded as the tag
        ``param_changed.<name>`` (MLflow params are immutable).
        """
        if self.rank != 0:
            return
        from albert_dist.tracking.params import flatten

        flat = flatten(params)
        new = {k: v for k, v in flat.items() if k not in self._existing_params}
        changed = {k: v for k, v in flat.items() if k in self._existing_params and self._existing_params[k] != v}
        if changed:
            log.warning("resumed with changed params (kept as tags param_changed.*): %s",
                        {k: (self._existing_params[k], v) for k, v in changed.items()})
            self._sender.add_tags({f"param_changed.{k}": v for k, v in changed.items()})
        self._existing_params.update(new)
        if new:
            self._sender.add_params(new)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Buffer ``metrics`` at optimizer step ``step`` (non-blocking); values may be floats or 0-d tensors.

        A (key, step) the run already holds (a resumed job re-running steps) is dropped and counted in
        `skipped_steps`.
        """
        if self.rank != 0:
            return
        step = int(step)
        fresh = {}
        for key, value in metrics.items():
            if step <= self._last_step.get(key, -1):
                self.skipped_steps += 1
                continue
            fresh[key] = float(value)
            self._last_step[key] = step
        if not fresh:
            return
        ts = int(time.time() * 1000)
        for key, value in fresh.items():
            self._spool.write(json.dumps({"run_id": self.run_id, "key": key, "value": value, "step": step,
                                          "timestamp": ts}) + "\n")
        self._spool.flush()
        self._sender.add_metrics(fresh, step, timestamp_ms=ts)

    def log_checkpoint(self, local_dir: str, step: int) -> None:
        """Queue the upload of a finished checkpoint (call on every rank after the collective save returned).

        Returns at once (rank 0 snapshots the files with hard links first). The checkpoint is marked complete
        after its files and every metric logged before this call arrived.
        """
        if self.rank != 0 or not self.cfg.log_checkpoints:
            return
        seq = self._sender.added
        self._uploader.submit(local_dir, step, before_marker=lambda: self._sender.wait_sent(seq))

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None, redact_keys: bool = True) -> None:
        """Queue a file or directory for upload (background). Text files (``.json``, ``.yaml``, ...) are
        uploaded as a copy with secret environment values scrubbed and, if ``redact_keys``, the values of
        secret-named keys masked (configs; not model exports, whose keys are a library's fixed schema).

        Raises:
            ValueError: ``local_path`` does not exist.
        """
        if self.rank != 0:
            return
        if not os.path.exists(local_path):
            raise ValueError(f"artifact {local_path!r} does not exist")
        staging = tempfile.mkdtemp(prefix=".mlflow_artifact_", dir=self.run_dir)
        try:
            if os.path.isdir(local_path):
                shutil.copytree(local_path, staging, dirs_exist_ok=True)
            else:
                shutil.copy2(local_path, staging)
            for dirpath, _, names in os.walk(staging):
                for name in names:
                    _scrub_file(os.path.join(dirpath, name), redact_keys)
            self._uploader.submit_files(staging, artifact_path, take=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def set_tags(self, tags: dict[str, str]) -> None:
        """Queue tags (scrubbed of secrets)."""
        if self.rank != 0:
            return
        from albert_dist.tracking.secrets import redact

        self._sender.add_tags(redact({k: str(v) for k, v in tags.items()}))

    def close(self, status: str = "FINISHED") -> None:
        """Deliver buffered metrics and queued uploads (up to ``cfg.close_timeout_s``), then end the run with
        ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``; a preempted job that will be requeued passes
        ``KILLED`` and its next attempt sets the run back to RUNNING). Idempotent; never raises on
        tracking-server trouble (it is logged).

        Raises:
            ValueError: unknown ``status``.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"tracker close status must be one of {RUN_STATUSES}, got {status!r}")
        if self._closed or self.rank != 0:
            self._closed = True
            return
        self._closed = True
        deadline = time.monotonic() + self.cfg.close_timeout_s
        left = self._shutdown_threads(self.cfg.close_timeout_s)
        if left:
            log.error("%d metrics/params/tags not delivered to run %s; they stay in %s and are re-sent when "
                      "the job resumes", left, self.run_id, os.path.join(self.run_dir, SPOOL_FILE))
        # MLflow's HTTP layer retries for minutes on its own; run it on a thread so close() keeps its deadline.
        outcome: list[BaseException | None] = []

        def end_run() -> None:
            try:
                self._client.set_terminated(self.run_id, status)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        thread = threading.Thread(target=end_run, name="mlflow-end-run", daemon=True)
        thread.start()
        thread.join(timeout=max(30.0, deadline - time.monotonic()))
        if outcome == [None]:
            log.info("MLflow run %s ended %s", self.run_id, status)
        else:
            log.error("could not set MLflow run %s to %s: %s", self.run_id, status,
                      outcome[0] if outcome else "timed out")

    def _shutdown_threads(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        if self._uploader is not None:
            self._uploader.close(max(0.1, deadline - time.monotonic()))
        left = 0
        if self._sender is not None:
            left = self._sender.close(max(0.1, deadline - time.monotonic()))
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        return left

    @property
    def checkpoints_uploaded(self) -> list[int]:
        """Steps whose checkpoint upload completed (rank 0; empty elsewhere)."""
        return list(self._uploader.completed) if self._uploader is not None else []


def _scrub_file(path: str, redact_keys: bool = True) -> None:
    """Rewrite a text artifact with secrets masked (a fresh file, so a hard-linked original is untouched)."""
    from albert_dist.tracking.secrets import redact, scrub_text

    if not path.endswith(TEXT_SUFFIXES):
        return
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return
    if not redact_keys:
        scrubbed = scrub_text(text)
        if scrubbed == text:
            return
        text = scrubbed
    elif path.endswith(".json"):
        try:
            text = json.dumps(redact(json.loads(text)), indent=2)
        except ValueError:
            text = scrub_text(text)
    elif path.endswith((".yaml", ".yml")):
        import yaml

        try:
            text = yaml.safe_dump(redact(yaml.safe_load(text)), sort_keys=False)
        except yaml.YAMLError:
            text = scrub_text(text)
    else:
        text = scrub_text(text)
    os.remove(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
