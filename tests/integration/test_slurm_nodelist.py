"""The Python node-list expander and the discovery of a virtual node's address against the real `scontrol`
(skipped where Slurm is not installed; the expander's own cases: tests/unit/test_distributed_env.py)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from albert_dist.distributed import env as E
from albert_dist.distributed import slurm as S
from fixtures.slurm_env import EXPANSIONS, slurm_step


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
@pytest.mark.parametrize("nodelist", sorted(EXPANSIONS))
def test_python_expander_matches_scontrol(nodelist):
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    assert S.expand_nodelist_py(nodelist) == out.stdout.split()
    assert S.expand_nodelist(nodelist) == out.stdout.split()


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
def test_virtual_node_resolves_to_node_addr():
    """On the CI cluster (.ci/slurm-cluster.sh) n1 and n2 are virtual: their NodeAddr is 127.0.0.1."""
    probe = subprocess.run(["scontrol", "show", "node", "n1"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("no Slurm cluster with node n1 running (.ci/slurm-cluster.sh start)")
    env = E.discover(slurm_step(procid=1, nodeid=1, localid=0, ntasks=2, nodelist="n[1-2]", tasks_per_node="1(x2)"))
    assert env.master_addr == "127.0.0.1"
