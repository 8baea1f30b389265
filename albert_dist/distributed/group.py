"""Process-group start-up: discovery (`albert_dist.distributed.env`), device binding, then torch.distributed."""
from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any, Optional

from albert_dist.distributed.env import DistEnv, bind_device, clear_stale_build_lock, default_torch_extensions_dir, \
    discover, export_env
from albert_dist.job.watchdog import flight_recorder_env

log = logging.getLogger(__name__)


def init_distributed(timeout_s: float = 1800.0, store: Any = None,
                     flight_recorder_prefix: Optional[str] = None, dist_env: Optional[DistEnv] = None) -> DistEnv:
    """Discover this process's place (or take `dist_env`), export it as env:// variables and start the process group.

    Calls ``deepspeed.init_distributed`` with the accelerator's backend (``gloo`` on CPU, ``nccl`` on CUDA:
    ``get_accelerator().communication_backend_name()``) and MPI discovery off, since :func:`discover`
    already covered Slurm. On an accelerator, selects the device first (:func:`bind_device`: index
    ``local_rank % visible devices``, also as DeepSpeed's ``LOCAL_RANK``). A second call, while the group is
    up, returns the first call's discovery without re-initialising.

    Args:
        timeout_s: seconds a collective (and the rendezvous) may wait before failing, instead of hanging.
        store: the job's rendezvous store, already open (`albert_dist.distributed.rendezvous.open_store`: the
            preflight verdict went through it); the process group starts over it instead of env://.
        flight_recorder_prefix: on nccl, PyTorch's NCCL flight recorder is switched on before the group starts,
            dumping on a collective's timeout to ``<prefix><rank>`` (`albert_dist.job.watchdog.flight_recorder_env`;
            variables the user set are kept); nothing on gloo.
        dist_env: this process's place as the caller discovered it (the app's preflight, `JobPlan.env`); None
            discovers it here (:func:`discover`).

    Raises:
        ValueError: from :func:`discover`, or ``timeout_s <= 0``.
        RuntimeError: from :func:`bind_device`.
    """
    global _STARTED
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0")
    import deepspeed
    import torch.distributed as tdist
    from deepspeed.accelerator import get_accelerator

    if (tdist.is_initialized() and _STARTED is not None and (_STARTED.rank, _STARTED.world_size)
            == (tdist.get_rank(), tdist.get_world_size())):  # LOCAL_RANK may be the device index now: not rediscovered
        return _STARTED
    if dist_env is None:
        dist_env = discover()
    export_env(dist_env)
    accel = get_accelerator()
    extensions_dir = default_torch_extensions_dir()
    if accel.device_name() == "cpu":  # the CPU accelerator JIT-builds its comm op in deepspeed.init_distributed
        clear_stale_build_lock(extensions_dir)
    device = bind_device(dist_env, accel)
    if not tdist.is_initialized():
        if flight_recorder_prefix is not None:
            os.environ.update(flight_recorder_env(accel.communication_backend_name(), flight_recorder_prefix))
        if store is not None:  # DeepSpeed then wraps the group it finds
            tdist.init_process_group(accel.communication_backend_name(), store=store, rank=dist_env.rank,
                                     world_size=dist_env.world_size, timeout=timedelta(seconds=timeout_s))
        deepspeed.init_distributed(dist_backend=accel.communication_backend_name(), auto_mpi_discovery=False,
                                   distributed_port=dist_env.master_port, timeout=timedelta(seconds=timeout_s),
                                   verbose=dist_env.rank == 0)
    _STARTED = dist_env
    where = "cpu" if device is None else f"{accel.device_name(device)} of {accel.device_count()} visible"
    log.info("process group up: %s backend %s; device %s (CUDA_VISIBLE_DEVICES=%s)", dist_env.describe(),
             accel.communication_backend_name(), where, os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return dist_env


#: The discovery of the process group this process started (`init_distributed`), while it is up.
_STARTED: Optional[DistEnv] = None
