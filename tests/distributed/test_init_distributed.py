"""init_distributed() from Slurm-style variables alone: 2 gloo processes find each other and all-reduce;
the distributed helpers (is_multi_rank, broadcast_object, all_gather_object, barrier) on them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from albert_dist.distributed.env import free_port

pytestmark = pytest.mark.distributed

CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from albert_dist.distributed.collectives import all_gather_object, barrier, broadcast_object, is_multi_rank
    from albert_dist.distributed.group import init_distributed
    env = init_distributed(timeout_s=60)
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    got = broadcast_object({"from": env.rank})
    barrier()
    print("RESULT " + json.dumps({"rank": env.rank, "node_rank": env.node_rank, "source": env.source,
          "sum": t.item(), "world": dist.get_world_size(), "backend": dist.get_backend(),
          "RANK": os.environ["RANK"], "MASTER_PORT": os.environ["MASTER_PORT"], "multi": is_multi_rank(),
          "broadcast_from": got["from"], "gathered": all_gather_object(env.rank * 10)}))
    dist.destroy_process_group()
""")


def test_two_ranks_from_slurm_variables(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
        # what srun gives task `rank` of a 2-node x 1-task step; MASTER_ADDR as the sbatch script exports it
        env.update({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                    "SLURM_NODEID": str(rank), "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
                    "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
                    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["node_rank"] == r["rank"] and r["source"] == "slurm"
        assert r["sum"] == 3.0 and r["world"] == 2 and r["backend"] == "gloo"
        assert r["RANK"] == str(r["rank"]) and r["MASTER_PORT"] == str(port)
        assert r["multi"] is True and r["broadcast_from"] == 0  # rank 0's object on both ranks
        assert r["gathered"] == [0, 10]  # every rank's object, in rank order
