"""The tracker contract, and the local tracker every job has on rank 0: console + ``<run_dir>/metrics.jsonl``.

``metrics.jsonl`` is the job's one local metric log: one JSON object per record,
``{"step": N, "timestamp_ms": T, "<name>": value, ...}`` with the names of `albert_dist.engine.metric_names`.
The MLflow tracker (`albert_dist.tracking.tracker`) sends what this file holds, so a record is written once,
locally, before anything goes over the network; a server outage, a job that never reached its server, or a
requeued job re-send from here (`read_metric_log`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Optional

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.json"
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")


class Tracker:
    """What the trainer calls; every rank may call every method. This base records nothing: it is the tracker
    of ranks other than 0 (`NullTracker`), and what a tracker that does not override a method does."""

    def log_params(self, params: dict[str, Any]) -> None:
        """Record the (nested) config and derived values once per job."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at optimizer step ``step`` (names from `albert_dist.engine.metric_names`)."""

    def log_checkpoint(self, local_dir: str, step: int) -> None:
        """A complete checkpoint of step ``step`` now exists in ``local_dir``."""

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None, redact_keys: bool = True) -> None:
        """Keep a file or directory with the run (``artifact_path``: folder in the run's artifacts)."""

    def set_tags(self, tags: dict[str, str]) -> None:
        """Attach string tags to the run."""

    def close(self, status: str) -> None:
        """End the run with ``status`` (one of `RUN_STATUSES`); idempotent."""


class NullTracker(Tracker):
    """The tracker of ranks other than 0 (and of a job without one): records nothing."""


class JsonlTracker(Tracker):
    """`<run_dir>/metrics.jsonl` tracker (rank 0).

    Args:
        run_dir: the job's run directory (created if missing).
        resumed_step: the step of the checkpoint the job resumes from: records beyond it (logged by the
            interrupted attempt, re-run now) are dropped at once, so that no step appears twice in the file.
    """

    def __init__(self, run_dir: str | Path, resumed_step: Optional[int] = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resumed_step is not None and self.path.is_file():
            kept = [json.dumps(r) for r in read_metric_log(self.run_dir) if r["step"] <= resumed_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(k + "\n" for k in kept))
            os.replace(tmp, self.path)

    def log_params(self, params: dict) -> None:
        """Merge `params` into <run_dir>/params.json (what `albert-dist tracking sync` sends as params): the
        trainer logs the config and, separately, derived counts; nested sections are merged, not replaced."""
        path = self.run_dir / PARAMS_FILE
        merged = json.loads(path.read_text()) if path.is_file() else {}

        def merge(into: dict, new: dict) -> None:
            for key, value in new.items():
                if isinstance(value, dict) and isinstance(into.get(key), dict):
                    merge(into[key], value)
                else:
                    into[key] = value

        merge(merged, json.loads(json.dumps(params, default=str)))
        path.write_text(json.dumps(merged, indent=1, sort_keys=True))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Append one record (with the wall-clock time in ms, as MLflow stores it). The console line is the
        trainer's (`albert_dist.job.console`): every metric goes here, a few to the console."""
        record = {"step": int(step), "timestamp_ms": int(time.time() * 1000),
                  **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a") as fh:  # one write of one whole line: a concurrent reader sees all or nothing
            fh.write(json.dumps(record) + "\n")

    def close(self, status: str) -> None:
        """Note the end of the run ("FINISHED", "KILLED" on preemption, "FAILED")."""
        logger.info("run %s; metrics in %s", status, self.path)


def read_metric_log(run_dir: str | Path, offset: int = 0) -> Iterator[dict]:
    """Records of ``<run_dir>/metrics.jsonl`` from byte ``offset`` on, each with ``"_end"``: the byte offset
    after it. A last line without its newline (being written, or cut by a kill) is not returned."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                return
            offset += len(line)
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by a kill -9 and appended to afterwards
                continue
            record["_end"] = offset
            yield record
