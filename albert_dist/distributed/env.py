"""Rank / world discovery and device binding, for every way albert_dist is launched (no process group needed).

``albert-dist dist`` prints the discovery of the calling task (a job-script check).

Launch methods and the variables each one sets (precedence from top to bottom):

1. ``torchrun`` and the ``deepspeed`` launcher (``deepspeed.launcher.launch``, also under ``--no_ssh``):
   ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; torchrun adds
   ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (node rank), DeepSpeed adds ``LOCAL_SIZE``, ``CROSS_RANK`` and
   ``CROSS_SIZE`` (deepspeed/launcher/launch.py). These win over Slurm variables because such a launcher is
   often itself started by ``srun`` (one launcher task per node), where ``SLURM_PROCID`` is the *node*
   index, not the rank.
2. ``srun`` starting the ranks directly (``slurm/pretrain.sbatch``, ``deepspeed --launcher slurm``):
   ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, the step's node list
   (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``) and tasks per node
   (``SLURM_STEP_TASKS_PER_NODE``, else ``SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1``). ``MASTER_ADDR`` is the
   address of the first node of that list (Slurm's block distribution puts rank 0 there); ``MASTER_PORT`` is
   derived from ``SLURM_JOB_ID`` (:func:`port_from_job_id`) unless given.
3. Neither: a single process on 127.0.0.1 and a free port.

``MASTER_ADDR`` / ``MASTER_PORT`` already in the environment always win ("unless given"): the sbatch scripts
compute them once in the batch shell so that thousands of ranks do not each ask slurmctld.

Slurm's host lists and the job's port are `albert_dist.distributed.slurm`'s; the ranks tests and benchmarks start on
one machine, `albert_dist.distributed.local_ranks`'.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any, Optional

from albert_dist.distributed.slurm import expand_nodelist, expand_tasks_per_node, node_address, port_from_job_id

log = logging.getLogger(__name__)

_TORCH_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_SLURM_RANK_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job: the numbers ``torch.distributed`` needs, from one launcher.

    Invariants (checked by :func:`discover`): ``0 <= rank < world_size``,
    ``0 <= local_rank < local_world_size <= world_size``, ``0 <= node_rank < num_nodes``.
    """

    rank: int
    """global rank, 0 .. world_size-1"""
    world_size: int
    """number of processes in the job"""
    local_rank: int
    """rank among the processes on this node; the accelerator index on GPU nodes"""
    local_world_size: int
    """number of processes on this node"""
    node_rank: int
    """index of this node, 0 .. num_nodes-1"""
    master_addr: str
    """address (IP or resolvable name) of the node holding rank 0, where the TCP store listens"""
    master_port: int
    """TCP port of the rendezvous store on master_addr"""
    num_nodes: int = 1
    """number of nodes in the job"""
    source: str = "single"
    """which launcher the numbers came from: "torchrun", "deepspeed" (its launcher, also under ``--no_ssh``: the
    same variables plus LOCAL_SIZE/CROSS_RANK/CROSS_SIZE), "slurm" (srun tasks) or "single\""""

    def describe(self) -> str:
        """One log line: ``rank 3/8 (local 1/2, node 1/4) master 10.0.0.1:20042 via slurm``."""
        return (f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
                f"node {self.node_rank}/{self.num_nodes}) master {self.master_addr}:{self.master_port} "
                f"via {self.source}")


# ----------------------------------------------------------------------------------------------------------
# discovery


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it: bind to port 0), for a rendezvous
    store of a single process, the tests' process groups and MLflow servers, and the launch scripts. Another
    process may take it before the caller binds it; callers that must not race retry on EADDRINUSE."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _master_port(env: Mapping[str, str]) -> int | None:
    if "MASTER_PORT" not in env:
        return None
    port = _int(env, "MASTER_PORT")
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port (1-65535)")
    return port


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    missing = [v for v in _TORCH_RANK_VARS if v not in env]
    _check(not missing, f"inconsistent launcher variables: {', '.join(f'{v}={env[v]!r}' for v in _TORCH_RANK_VARS if v in env)} "
                        f"set but {', '.join(missing)} missing (torchrun and deepspeed set all of {', '.join(_TORCH_RANK_VARS)})")
    rank, world, local_rank = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    _check(world >= 1, f"WORLD_SIZE={world} must be >= 1")
    _check(0 <= rank < world, f"inconsistent launcher variables: RANK={rank} not in [0, WORLD_SIZE={world})")
    lws_var = next((v for v in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE") if v in env), None)
    if lws_var is not None:
        local_world = _int(env, lws_var)
    else:
        # a hand-set environment without the per-node size: only a single node is a safe guess
        log.warning("RANK/WORLD_SIZE set without LOCAL_WORLD_SIZE or LOCAL_SIZE; assuming a single node")
        local_world = world
    _check(1 <= local_world <= world,
           f"inconsistent launcher variables: {lws_var or 'local world size'}={local_world} not in [1, WORLD_SIZE={world}]")
    _check(0 <= local_rank < local_world,
           f"inconsistent launcher variables: LOCAL_RANK={local_rank} not in [0, {lws_var or 'local world size'}={local_world})")
    node_var = next((v for v in ("GROUP_RANK", "CROSS_RANK") if v in env), None)
    node_rank = _int(env, node_var) if node_var else rank // local_world
    size_var = next((v for v in ("GROUP_WORLD_SIZE", "CROSS_SIZE") if v in env), None)
    num_nodes = _int(env, size_var) if size_var else -(-world // local_world)
    _check(0 <= node_rank < num_nodes,
           f"inconsistent launcher variables: node rank {node_var or 'RANK // local world size'}={node_rank} "
           f"not in [0, {size_var or 'number of nodes'}={num_nodes})")
    port = _master_port(env)
    addr = env.get("MASTER_ADDR")
    if addr is None or port is None:
        if world == 1:
            addr, port = addr or "127.0.0.1", port or free_port()
        elif "SLURM_JOB_ID" in env and ("SLURM_STEP_NODELIST" in env or "SLURM_JOB_NODELIST" in env):
            slurm_addr, slurm_port = _slurm_master(env)
            addr, port = addr or slurm_addr, port or slurm_port
        else:
            raise ValueError(f"RANK={rank} WORLD_SIZE={world} set but MASTER_ADDR/MASTER_PORT missing "
                             "(needed to find rank 0 when WORLD_SIZE > 1)")
    # DeepSpeed's launcher sets its own per-node variables beside torchrun's (deepspeed/launcher/launch.py)
    launcher = "deepspeed" if any(v in env for v in ("LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")) else "torchrun"
    return DistEnv(rank, world, local_rank, local_world, node_rank, addr, port, num_nodes, launcher)


def _slurm_master(env: Mapping[str, str], nodes: list[str] | None = None) -> tuple[str, int]:
    if nodes is None:
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    addr = env.get("MASTER_ADDR") or node_address(nodes[0])
    port = _master_port(env)
    if port is None:
        _check("SLURM_JOB_ID" in env, "SLURM_JOB_ID missing: cannot derive MASTER_PORT (set MASTER_PORT)")
        port = port_from_job_id(_int(env, "SLURM_JOB_ID"))
    return addr, port


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    missing = [v for v in _SLURM_RANK_VARS if v not in env]
    _check(not missing, f"inconsistent Slurm variables: SLURM_PROCID={env['SLURM_PROCID']!r} set but "
                        f"{', '.join(missing)} missing (srun sets all of {', '.join(_SLURM_RANK_VARS)})")
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    local_rank, node_rank = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
    _check(world >= 1, f"SLURM_NTASKS={world} must be >= 1")
    _check(0 <= rank < world, f"inconsistent Slurm variables: SLURM_PROCID={rank} not in [0, SLURM_NTASKS={world})")
    list_var = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
    _check(list_var in env, "inconsistent Slurm variables: SLURM_PROCID set but SLURM_JOB_NODELIST missing")
    nodes = expand_nodelist(env[list_var])
    _check(0 <= node_rank < len(nodes), f"inconsistent Slurm variables: SLURM_NODEID={node_rank} not in "
                                        f"[0, {len(nodes)}) nodes of {list_var}={env[list_var]!r}")
    if "SLURM_NNODES" in env and list_var == "SLURM_JOB_NODELIST":
        _check(_int(env, "SLURM_NNODES") == len(nodes),
               f"inconsistent Slurm variables: SLURM_NNODES={env['SLURM_NNODES']} but "
               f"{list_var}={env[list_var]!r} names {len(nodes)} nodes")
    tpn_var = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if v in env), None)
    if tpn_var is not None:
        per_node = expand_tasks_per_node(env[tpn_var])
        _check(len(per_node) == len(nodes), f"inconsistent Slurm variables: {tpn_var}={env[tpn_var]!r} covers "
                                            f"{len(per_node)} nodes, {list_var}={env[list_var]!r} names {len(nodes)}")
        _check(sum(per_node) == world, f"inconsistent Slurm variables: {tpn_var}={env[tpn_var]!r} sums to "
                                       f"{sum(per_node)} tasks, SLURM_NTASKS={world}")
        local_world = per_node[node_rank]
    else:
        _check(world % len(nodes) == 0, f"SLURM_NTASKS={world} not divisible by {len(nodes)} nodes and "
                                        "SLURM_TASKS_PER_NODE missing")
        local_world = world // len(nodes)
    _check(0 <= local_rank < local_world, f"inconsistent Slurm variables: SLURM_LOCALID={local_rank} not in "
                                          f"[0, {local_world}) tasks on node {node_rank}")
    addr, port = _slurm_master(env, nodes)
    return DistEnv(rank, world, local_rank, local_world, node_rank, addr, port, len(nodes), "slurm")


def discover(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Work out this process's place in the job from launcher variables (see the module docstring).

    Args:
        environ: the variables to read; ``os.environ`` when None. Never modified.

    Returns:
        A :class:`DistEnv`; ``source`` says which launcher's variables were used.

    Raises:
        ValueError: variables that contradict each other or are incomplete, naming them and their values
            (``RANK`` without ``WORLD_SIZE``, ``RANK >= WORLD_SIZE``, ``SLURM_NODEID`` beyond the node list,
            a non-integer value, a malformed node list, ...).
    """
    env = os.environ if environ is None else environ
    if any(v in env for v in ("RANK", "WORLD_SIZE")):
        return _from_torchrun(env)
    if "LOCAL_RANK" in env:
        raise ValueError(f"inconsistent launcher variables: LOCAL_RANK={env['LOCAL_RANK']!r} set without RANK "
                         "and WORLD_SIZE")
    # SLURM_STEP_ID marks a task started by srun. The batch script itself (no srun) also carries
    # SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is one process: treating it as rank 0 of
    # SLURM_NTASKS would wait forever for ranks that never start.
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return _from_slurm(env)
    if "SLURM_PROCID" in env:
        log.info("Slurm batch step without srun: running as a single process")
    port = _master_port(env) or free_port()
    return DistEnv(0, 1, 0, 1, 0, env.get("MASTER_ADDR", "127.0.0.1"), port, 1, "single")


def export_env(dist_env: DistEnv, environ: dict[str, str] | None = None) -> None:
    """Write ``dist_env`` as the standard ``torch.distributed`` env:// variables (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) into ``environ`` (default os.environ)."""
    env = os.environ if environ is None else environ
    env.update({
        "RANK": str(dist_env.rank),
        "WORLD_SIZE": str(dist_env.world_size),
        "LOCAL_RANK": str(dist_env.local_rank),
        "LOCAL_WORLD_SIZE": str(dist_env.local_world_size),
        "GROUP_RANK": str(dist_env.node_rank),
        "MASTER_ADDR": dist_env.master_addr,
        "MASTER_PORT": str(dist_env.master_port),
    })


def default_torch_extensions_dir(environ: Optional[dict[str, str]] = None, prefix: Optional[str] = None) -> str:
    """Point ``TORCH_EXTENSIONS_DIR`` at ``<prefix>/torch_extensions`` (the venv's, where `make install` pre-builds
    DeepSpeed's CPU comm op) unless it is set or ``prefix`` is not writable; returns the value in effect ('' = torch's
    default). Why: DeepSpeed JIT-builds that op on the first CPU process group into torch's default
    ``~/.cache/torch_extensions``, which every venv of the user shares; two checkouts write different build.ninja
    files there, so each start of either rebuilt the op (1-3 min of every launch, measured on the shared machine).

    Args:
        environ: the environment to update (default ``os.environ``).
        prefix: the installation prefix (default ``sys.prefix``, the venv).
    """
    import sys

    environ = os.environ if environ is None else environ
    prefix = sys.prefix if prefix is None else prefix
    if "TORCH_EXTENSIONS_DIR" not in environ and os.access(prefix, os.W_OK):
        environ["TORCH_EXTENSIONS_DIR"] = os.path.join(prefix, "torch_extensions")
    return environ.get("TORCH_EXTENSIONS_DIR", "")


#: A DeepSpeed JIT op build takes 1-3 min on 2 cores; a build lock older than this is a killed build's.
STALE_BUILD_LOCK_S = 900.0


def clear_stale_build_lock(extensions_dir: str, op: str = "deepspeed_shm_comm", max_age_s: float = STALE_BUILD_LOCK_S,
                           now: Optional[float] = None) -> Optional[str]:
    """Remove ``<extensions_dir>/<op>/lock`` when it is older than `max_age_s` seconds; returns the path removed.

    Why: torch's `cpp_extension` guards a JIT build with a lock *file* (``torch.utils.file_baton.FileBaton``: no
    holder, no timeout) that only the build removes; a build killed mid-way (Ctrl-C at start-up, a job's time
    limit) leaves it, and every later process that loads the op (DeepSpeed's CPU comm op, at the first CPU process
    group) waits on it forever, silently. A lock this old has no live builder: it is removed with a warning.

    Args:
        extensions_dir: torch's extension root (``TORCH_EXTENSIONS_DIR``); '' does nothing.
        now: the clock (``time.time()``), for tests.
    """
    import time

    if not extensions_dir:
        return None
    lock = os.path.join(extensions_dir, op, "lock")
    try:
        age = (time.time() if now is None else now) - os.stat(lock).st_mtime
        if age <= max_age_s:
            return None
        os.remove(lock)
    except FileNotFoundError:  # none, or another rank removed it first
        return None
    log.warning("removed a stale build lock %s (%.0f min old: a build killed before it finished; torch would wait "
                "on it forever)", lock, age / 60)
    return lock


def bind_device(dist_env: DistEnv, accel: Any = None, environ: Optional[dict[str, str]] = None) -> Optional[int]:
    """Select this rank's accelerator device, index ``local_rank % visible devices``, for albert_dist and for
    DeepSpeed; None on CPU (nothing to select).

    The modulo covers every binding: a task that sees the node's GPUs (``--gpus-per-node``: index = local rank)
    and one the launcher narrowed to its own (``srun --gpus-per-task=1`` / ``--gpu-bind=single:1``:
    CUDA_VISIBLE_DEVICES holds one device, index 0, while SLURM_LOCALID runs 0..7). DeepSpeed selects the device
    from ``LOCAL_RANK`` itself (the engine's ``_set_distributed_vars``, ``comm/torch.py``'s ``device_id``, ZeRO-3's
    ``partition_parameters``), so ``LOCAL_RANK`` in `environ` (default os.environ) becomes the device index;
    `dist_env` keeps the true local rank for albert_dist's bookkeeping (one download per node, the logs).

    Args:
        accel: DeepSpeed's accelerator (default ``get_accelerator()``).

    Raises:
        RuntimeError: an accelerator that sees no device (CUDA_VISIBLE_DEVICES empty on a GPU job).
    """
    if accel is None:
        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()
    if accel.device_name() == "cpu":
        return None
    count = accel.device_count()
    if count < 1:
        raise RuntimeError(f"accelerator {accel.device_name()!r} sees no device (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    index = dist_env.local_rank % count
    accel.set_device(index)  # NCCL needs it before the first collective
    (os.environ if environ is None else environ)["LOCAL_RANK"] = str(index)
    return index
