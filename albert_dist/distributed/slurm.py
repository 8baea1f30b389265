"""Slurm's node lists and task counts expanded (``scontrol show hostnames`` or python-hostlist), node addresses,
and the rendezvous port a job derives from its id: what `albert_dist.distributed.env.discover` reads under
``srun``, and what the launch and sbatch scripts (launch/slurm_hostfile.py, slurm/deepspeed.sbatch) call.
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess

log = logging.getLogger(__name__)

#: ``MASTER_PORT`` derived from ``SLURM_JOB_ID`` lies in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's
#: default ephemeral range (32768-60999), so an outgoing connection rarely holds it, and the same for every
#: task of a job (and for its requeued runs, which keep the job id).
PORT_BASE = 20000
PORT_SPAN = 10000


def expand_nodelist_py(nodelist: str) -> list[str]:
    """Expand a Slurm host list without Slurm, as ``scontrol show hostnames`` does, with python-hostlist.

    ``"gpu[01-03,07]"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07"]``; ``"n[1-2],login5"`` ->
    ``["n1", "n2", "login5"]``; several bracket groups form their product in Slurm's order
    (``"r[1-2]n[1-2]"`` -> ``r1n1 r1n2 r2n1 r2n2``); zero padding is kept. Duplicates are kept and empty
    entries skipped, like scontrol (``hostlist.expand_hostlist(..., allow_duplicates=True)``). Unlike Slurm
    22.05's scontrol, a literal after the last bracket (``"node[1-2]-ib"``) is expanded.

    Raises:
        ValueError: empty list, unbalanced or nested brackets, a bad range or ``N > M`` (python-hostlist's
            ``BadHostlist``, with the list named).
    """
    import hostlist

    try:
        hosts = hostlist.expand_hostlist(nodelist.strip(), allow_duplicates=True)
    except hostlist.BadHostlist as err:
        why = "a range runs backwards (start > stop)" if str(err) == "start > stop" else str(err)
        raise ValueError(f"node list {nodelist!r}: {why}") from None
    if not hosts:
        raise ValueError(f"node list {nodelist!r} names no host")
    return hosts


def expand_nodelist(nodelist: str, use_scontrol: bool = True) -> list[str]:
    """Host names in a Slurm node list: ``scontrol show hostnames`` when installed, else the Python expander.

    python-hostlist always runs first as a syntax check: scontrol 22.05 exits 0 on a malformed list,
    printing nothing ("Invalid hostlist" on stderr) or garbage (``n[1-2`` -> ``n]``).

    Raises:
        ValueError: the list is malformed or empty.
    """
    hosts = expand_nodelist_py(nodelist)
    if use_scontrol and shutil.which("scontrol"):
        proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode == 0 and proc.stdout.split():
            if proc.stdout.split() != hosts:
                log.warning("scontrol and the Python expander disagree on %r: %s vs %s; using scontrol's",
                            nodelist, proc.stdout.split(), hosts)
            return proc.stdout.split()
        log.warning("scontrol show hostnames %r failed (%s); using the Python expander", nodelist,
                    proc.stderr.strip())
    return hosts


def expand_tasks_per_node(spec: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` -> tasks on each node: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``
    (``hostlist.parse_slurm_tasks_per_node``).

    Raises:
        ValueError: an entry that is not ``N`` or ``N(xM)``.
    """
    import hostlist

    try:
        return hostlist.parse_slurm_tasks_per_node(spec.strip())
    except hostlist.BadHostlist:
        raise ValueError(f"SLURM_TASKS_PER_NODE={spec!r}: bad entry (expected N or N(xM), comma-separated)") from None


def node_address(name: str, use_scontrol: bool = True) -> str:
    """The address of Slurm node ``name``: its ``NodeAddr`` from ``scontrol show node`` when available.

    Virtual nodes (several ``slurmd -N`` on one host, as in CI) have names that do not resolve; their
    ``NodeAddr`` does. On clusters where NodeAddr equals the name this returns the name. Falls back to the
    name itself when scontrol is missing or fails.
    """
    if use_scontrol and shutil.which("scontrol"):
        proc = subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True, timeout=30)
        m = re.search(r"\bNodeAddr=(\S+)", proc.stdout)
        if proc.returncode == 0 and m:
            return m.group(1)
        log.warning("scontrol show node %s gave no NodeAddr (%s); using the name", name, proc.stderr.strip())
    return name


def port_from_job_id(job_id: int) -> int:
    """``MASTER_PORT`` for Slurm job ``job_id``: ``PORT_BASE + job_id % PORT_SPAN`` (same on every task)."""
    return PORT_BASE + job_id % PORT_SPAN
