"""The job's rendezvous store, opened before the process group, so that every rank learns the preflight verdict.

A job refused in preflight (a bad config, a missing input, a run directory another job holds: exit code 2)
must not leave its other ranks waiting in the rendezvous for a rank 0 that has gone: they would sit there for
the process-group timeout (30 min) unless a launcher killed them. So the app opens torch's `TCPStore` at
MASTER_ADDR:MASTER_PORT first (rank 0 serves it, exactly as torch's env:// rendezvous would), every rank runs
its preflight and reports to it (`agree`), and rank 0 publishes one verdict: every rank then starts the
process group over this same store (`albert_dist.distributed.group.init_distributed(store=...)`), or every
rank exits 2 with the refusing rank's message. The checks that only rank 0 makes (the run directory's lock,
`albert_dist.job.lock`) reach the other ranks the same way.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Optional

from albert_dist.distributed.env import DistEnv

_KEY = "albert_dist/apps/pretrain/preflight/"
#: Seconds rank 0 keeps serving a refusal for the other ranks to read it before it exits.
LINGER_S = 30.0


class PreflightRefused(ValueError):
    """Another rank refused the job in its preflight; the message is that rank's (prefixed with its rank)."""


def open_store(dist_env: DistEnv, timeout_s: float = 1800.0) -> Optional[Any]:
    """The job's `torch.distributed.TCPStore` (rank 0 the server at MASTER_ADDR:MASTER_PORT, or torchrun's
    agent; the ranks clients, which wait up to `timeout_s` for it), or None for a single rank. Call it before anything that may
    fail, so a failing rank 0 can still tell the others."""
    if dist_env.world_size == 1:
        return None
    from torch.distributed import TCPStore

    # As torch's env:// rendezvous does: under torchrun the agent serves the store (a new one per restart),
    # every rank is a client; otherwise rank 0 serves it.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return TCPStore(dist_env.master_addr, dist_env.master_port, dist_env.world_size,
                    dist_env.rank == 0 and not agent_store, timeout=timedelta(seconds=timeout_s),
                    wait_for_workers=False, multi_tenant=True)


def agree(store: Optional[Any], dist_env: DistEnv, error: Optional[str], poll_s: float = 0.05,
          linger_s: float = LINGER_S) -> None:
    """Every rank calls this once, after its preflight, with its own error message (None: it passed). Returns
    on every rank when every rank passed.

    Raises:
        PreflightRefused: on every rank that did not refuse itself, when some rank refused (the first refusal's
            message, naming its rank); a refusing rank returns and exits with its own error.
    """
    if store is None:
        return
    rank, world = dist_env.rank, dist_env.world_size
    if error is not None:
        store.compare_set(_KEY + "refused", "", f"rank {rank}: {error}")  # the first refusal wins
    store.add(_KEY + "done", 1)
    if rank == 0:
        while store.add(_KEY + "done", 0) < world:  # store operations time out with the store's timeout
            time.sleep(poll_s)
        refused = store.check([_KEY + "refused"])
        verdict = store.get(_KEY + "refused").decode() if refused else "ok"
        store.set(_KEY + "verdict", verdict)
        if verdict == "ok":
            return
        deadline = time.monotonic() + linger_s  # the server dies with rank 0: let the others read the verdict
        while store.add(_KEY + "read", 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(poll_s)
    else:
        store.wait([_KEY + "verdict"])
        verdict = store.get(_KEY + "verdict").decode()
        store.add(_KEY + "read", 1)
        if verdict == "ok":
            return
    if error is None:
        raise PreflightRefused(verdict)


__all__ = ["LINGER_S", "PreflightRefused", "agree", "open_store"]
