"""Fine-tune results in MLflow, beside the pretraining run they score.

Layout::

    <pretraining run>                     metrics downstream/<task>/<metric> = median over seeds, at step =
      |                                   the checkpoint's optimizer step (several checkpoints draw a curve), of
      |                                   one setup per task: tag downstream/<task>/setup (`log_summary`)
      +- <task>-step<N>-seed<S>-<init>  (child: tag mlflow.parentRunId; no step<N>- for a model without one, e.g. a
      |                                   transformers directory)  params task, seed, lr, epochs, batch,
                                           max_len, checkpoint_step, init, model; metrics: the dev scores

A fine-tune from random init, or of a model with no pretraining run (a transformers directory, a run never
tracked), goes under a standalone run instead (named after the model and the init; tag
``pretraining_run_id`` when there is one), in ``--experiment`` or the pretraining run's experiment, so that
`albert-dist compare --experiment` ranks it beside the pretraining runs. Every call goes through
`mlflow.MlflowClient` against the store given (the run's own store by default): no global MLflow state.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from albert_dist.engine.metric_names import DOWNSTREAM as DOWNSTREAM_PREFIX
from albert_dist.tracking.secrets import redact

log = logging.getLogger(__name__)

#: MLflow's limit of params per log_batch call.
MAX_PARAMS_PER_BATCH = 100
#: Experiment of standalone runs when neither --experiment nor a pretraining run names one.
DEFAULT_EXPERIMENT = "albert_dist"


def setup_tag(task: str) -> str:
    """``downstream/<task>/setup``: the tag naming the setup of the scored run's headline (`log_summary`)."""
    return f"{DOWNSTREAM_PREFIX}{task}/setup"


def metric_key(task: str, metric: str) -> str:
    """``downstream/<task>/<metric>``, the summary metric on the scored run."""
    return f"{DOWNSTREAM_PREFIX}{task}/{metric}"


class DownstreamRuns:
    """The MLflow runs of one `albert-dist finetune` call: the scored run (the pretraining run, or a standalone
    run) and one child per fine-tune.

    Args:
        tracking_uri: an absolute tracking URI (`albert_dist.tracking.tracker.resolve_tracking_uri`).
        parent_run_id: the pretraining run; None when there is none.
        standalone_name: when given, a new run of this name holds the scores (random init, no pretraining run).
        experiment: experiment of a standalone run (None: the pretraining run's, else `DEFAULT_EXPERIMENT`).
        tags: extra tags of a standalone run.
        standalone_params: params of a standalone run, over the pretraining run's (which it copies: its config).

    Raises:
        mlflow.exceptions.MlflowException: the store refuses (unknown parent run, deleted experiment).
    """

    def __init__(self, tracking_uri: str, parent_run_id: Optional[str], standalone_name: Optional[str],
                 experiment: Optional[str], tags: Optional[dict[str, str]] = None,
                 standalone_params: Optional[dict[str, Any]] = None):
        from mlflow import MlflowClient

        from albert_dist.tracking.tracker import create_local_store

        create_local_store(tracking_uri)
        self.client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        parent = self.client.get_run(parent_run_id) if parent_run_id else None
        if standalone_name is None and parent is not None:
            self.run_id = parent.info.run_id
            self.experiment_id = parent.info.experiment_id
            self.standalone = False
            return
        if experiment is not None:
            self.experiment_id = self._experiment(experiment)
        elif parent is not None:
            self.experiment_id = parent.info.experiment_id
        else:
            self.experiment_id = self._experiment(DEFAULT_EXPERIMENT)
        run_tags = {"mlflow.runName": standalone_name or "finetune", "mlflow.source.name": "albert-dist finetune",
                    **(tags or {})}
        if parent is not None:
            run_tags["pretraining_run_id"] = parent.info.run_id
        self.run_id = self.client.create_run(self.experiment_id, tags=run_tags).info.run_id
        self.standalone = True
        # the pretraining run's params (its config): `compare` then shows only what differs, e.g. init
        params = {**(parent.data.params if parent is not None else {}), **(standalone_params or {})}
        self._log_params(self.run_id, params)

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(redact(v)) if isinstance(v, str) else str(v)) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])

    def _experiment(self, name: str) -> str:
        from albert_dist.tracking.tracker import artifact_location

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(name, artifact_location=artifact_location(self.tracking_uri))

    def log_child(self, name: str, params: dict[str, Any], metrics: dict[str, float]) -> str:
        """A finished child run of the scored run with `params` (scrubbed of secrets) and `metrics` (step 0);
        returns its id. An earlier child of the same name and params but for ``model`` (the same checkpoint
        named by its run directory or by its run id) is replaced: deleted, as the run's downstream.json entry is."""
        self._delete_same_children(name, params)
        run = self.client.create_run(self.experiment_id, tags={
            "mlflow.parentRunId": self.run_id, "mlflow.runName": name, "mlflow.source.name": "albert-dist finetune"})
        from mlflow.entities import Metric

        self.client.log_batch(run.info.run_id, metrics=[Metric(k, float(v), _now_ms(), 0) for k, v in metrics.items()])
        self._log_params(run.info.run_id, params)
        self.client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    def _delete_same_children(self, name: str, params: dict[str, Any]) -> None:
        def comparable(p: dict[str, Any]) -> dict[str, str]:
            return {k: str(redact(v)) if isinstance(v, str) else str(v) for k, v in p.items() if k != "model"}

        want = comparable(params)
        escaped = name.replace("'", "\\'")
        for old in self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.run_id}' "
                                           f"and tags.mlflow.runName = '{escaped}'"):
            if comparable(old.data.params) == want:
                self.client.delete_run(old.info.run_id)
                log.info("child run %s (%s) replaced by this fine-tune's", old.info.run_id, name)

    def log_summary(self, task: str, summary: dict[str, float], step: int, setup: str) -> bool:
        """``downstream/<task>/<metric>`` = the median per metric, on the scored run at `step`, when `setup`
        (`albert_dist.apps.finetune.run.setup_line`: data, subset sizes, seeds, hyper-parameters) is the task's setup on
        that run: the first one logged, kept in its tag ``downstream/<task>/setup``, so that the headline (and
        its curve over checkpoints) is one setup's. Another setup logs nothing there and is warned; returns
        whether the headline was logged."""
        from mlflow.entities import Metric, RunTag

        tag = setup_tag(task)
        canonical = self.client.get_run(self.run_id).data.tags.get(tag)
        if canonical is not None and canonical != setup:
            log.warning("%s*: left as they are on run %s, which keeps the setup of its tag %s (%s); this "
                        "fine-tune (%s) is in its child runs and downstream.json", metric_key(task, ""),
                        self.run_id, tag, canonical, setup)
            return False
        now = _now_ms()
        self.client.log_batch(self.run_id, metrics=[Metric(metric_key(task, k), float(v), now, int(step))
                                                    for k, v in summary.items()],
                              tags=[] if canonical is not None else [RunTag(tag, setup)])
        return True

    def close(self, status: str = "FINISHED") -> None:
        """End a standalone run (the pretraining run's status is its own)."""
        if self.standalone:
            self.client.set_terminated(self.run_id, status)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
