"""What describes a run: the resolved config as dotted MLflow params, and the environment as tags.

Params are immutable in MLflow (a second value for a key is an error), so names must be stable across
versions of the config: they are the dataclass field paths (``model.num_hidden_groups``,
``engine.zero_stage``, ``data.train.0.path``), values are ``str()`` of the field (JSON for bools
so ``true`` reads the same as in YAML). Options left at ``null`` (pass-through defaults such as
``engine.peak_tflops_per_device``) are not logged: a column of "null" tells the reader nothing.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import platform
import socket
from collections.abc import Mapping
from typing import Any, Optional

from albert_dist.tracking.secrets import redact

log = logging.getLogger(__name__)

#: MLflow limits (mlflow/utils/validation.py): longer param values are rejected by the server.
MAX_PARAM_VALUE_LEN = 6000
MAX_KEY_LEN = 250


def _param_value(value: Any) -> str:
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into ``{"a.b.c": "value"}`` with secret-named keys masked.

    Args:
        obj: nested dicts/lists (e.g. ``albert_dist.config.to_container(cfg)``) and dataclasses.
        prefix: prepended to every key (``"derived"`` -> ``"derived.world_size"``).

    Returns:
        dotted name -> string value. Lists are flattened by index (``data.train.0.weight``); an empty
        list or dict becomes ``"[]"`` / ``"{}"`` so that its presence is recorded; None values are left out.

    Raises:
        ValueError: a flattened key longer than MLflow's 250 characters.
    """
    out: dict[str, str] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, Mapping):
            if not node and key:
                out[key] = "{}"
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            if not node and key:
                out[key] = "[]"
            for i, v in enumerate(node):
                walk(v, f"{key}.{i}" if key else str(i))
        elif node is not None:
            if len(key) > MAX_KEY_LEN:
                raise ValueError(f"param name {key!r} is longer than MLflow's {MAX_KEY_LEN} characters")
            value = _param_value(node)
            if len(value) > MAX_PARAM_VALUE_LEN:
                log.warning("param %s truncated from %d to %d characters", key, len(value), MAX_PARAM_VALUE_LEN)
                value = value[:MAX_PARAM_VALUE_LEN]
            out[key] = value

    # Dataclasses (e.g. TrackingConfig) -> dicts, tuples -> lists, so the key rules see every nested key.
    plain = json.loads(json.dumps(obj, default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o)))
    walk(redact(plain), prefix)
    return out


def run_tags(hosts: list[str], environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Tags describing where and with what a run ran, scrubbed of secrets.

    MLflow's context registry (``mlflow.tracking.context.registry.resolve_tags``: user, source name and type,
    git commit/branch/remote of the entry script), the git commit of this package when the entry script is
    not in a checkout (the ``albert-dist`` console script), plus ``hosts``, ``num_hosts``, the Slurm job
    (``slurm.job_id``, ``slurm.array_job_id``, ``slurm.restart_count``, ``slurm.job_name``,
    ``slurm.cluster``), ``version.<package>`` and ``cuda``.

    Args:
        hosts: host names of all ranks (gathered by the caller), duplicates allowed.
        environ: environment to read Slurm variables from (default ``os.environ``).
    """
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.git_utils import get_git_commit
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

    environ = os.environ if environ is None else environ
    tags = {k: str(v) for k, v in resolve_tags().items()}
    if MLFLOW_GIT_COMMIT not in tags:
        commit = get_git_commit(os.path.dirname(os.path.abspath(__file__)))
        if commit:
            tags[MLFLOW_GIT_COMMIT] = commit
    unique_hosts = sorted(set(hosts))
    tags.update({"hosts": ",".join(unique_hosts), "num_hosts": str(len(unique_hosts)),
                 "version.python": platform.python_version()})
    for dist in ("torch", "deepspeed", "datasets", "transformers", "mlflow", "albert_dist"):
        try:
            tags[f"version.{dist}"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    for var, tag in (("SLURM_JOB_ID", "slurm.job_id"), ("SLURM_ARRAY_JOB_ID", "slurm.array_job_id"),
                     ("SLURM_RESTART_COUNT", "slurm.restart_count"), ("SLURM_JOB_NAME", "slurm.job_name"),
                     ("SLURM_CLUSTER_NAME", "slurm.cluster")):
        if environ.get(var):
            tags[tag] = environ[var]
    try:
        import torch

        if torch.cuda.is_available():
            tags["cuda"] = f"{torch.version.cuda} ({torch.cuda.get_device_name(0)})"
    except Exception:  # noqa: BLE001 - a tag is never worth failing the run for
        pass
    return redact(tags)


def hostname() -> str:
    """This machine's host name (what ``hosts`` is gathered from)."""
    return socket.gethostname()
