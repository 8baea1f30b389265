"""Rank/world discovery (albert_dist.distributed.group): precedence, Slurm node lists, errors.

References: the variables torchrun (GROUP_RANK, LOCAL_WORLD_SIZE) and deepspeed/launcher/launch.py
(CROSS_RANK, CROSS_SIZE, LOCAL_SIZE) set; the node-list examples in Slurm's documentation (tests/fixtures/slurm_env.py;
against the real ``scontrol show hostnames``: tests/integration/test_slurm_nodelist.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from albert_dist.distributed import collectives as C, env as E, group as G
from albert_dist.distributed import slurm as S
from fixtures.slurm_env import EXPANSIONS, slurm_step


@pytest.fixture
def no_scontrol(monkeypatch, tmp_path):
    """Hide scontrol (an empty PATH), so that results do not depend on whether Slurm is installed."""
    monkeypatch.setenv("PATH", str(tmp_path))


# ------------------------------------------------------------------------------------------------ node lists

def test_python_expander_literal_after_bracket():
    # an extension: Slurm 22.05's scontrol calls this an "Invalid hostlist" (prints nothing, exits 0)
    assert S.expand_nodelist_py("node-[1,3-4]-ib") == ["node-1-ib", "node-3-ib", "node-4-ib"]


@pytest.mark.parametrize("nodelist", sorted(EXPANSIONS))
def test_python_expander(nodelist):
    assert S.expand_nodelist_py(nodelist) == EXPANSIONS[nodelist]


@pytest.mark.parametrize("bad", ["", ",", "n[1-2", "n1-2]", "n[3-1]", "n[a-b]", "n[[1-2]]"])
def test_python_expander_rejects_malformed(bad):
    with pytest.raises(ValueError, match="node list"):
        S.expand_nodelist_py(bad)


def test_tasks_per_node():
    assert S.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert S.expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        S.expand_tasks_per_node("2(x),1")


def test_port_from_job_id():
    assert S.port_from_job_id(4711) == S.PORT_BASE + 4711
    assert S.port_from_job_id(S.PORT_SPAN + 5) == S.PORT_BASE + 5
    ports = {S.port_from_job_id(j) for j in range(100_000, 100_000 + S.PORT_SPAN)}
    assert min(ports) >= 1024 and max(ports) < 32768  # below Linux's ephemeral range


# ------------------------------------------------------------------------------------------------ precedence


def test_single_process():
    env = E.discover({})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.num_nodes) == (
        0, 1, 0, 1, 0, 1)
    assert env.master_addr == "127.0.0.1" and 0 < env.master_port < 65536 and env.source == "single"


def test_torchrun_variables():
    env = E.discover({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                      "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert env == E.DistEnv(5, 8, 1, 4, 1, "10.0.0.1", 29500, 2, "torchrun")


def test_deepspeed_launcher_variables():
    # deepspeed/launcher/launch.py: CROSS_RANK = node rank, CROSS_SIZE = nodes, LOCAL_SIZE = procs per node
    env = E.discover({"RANK": "2", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
                      "CROSS_SIZE": "3", "MASTER_ADDR": "h1", "MASTER_PORT": "29501"})
    assert env == E.DistEnv(2, 6, 0, 2, 1, "h1", 29501, 3, "deepspeed")


def test_launcher_variables_win_over_slurm(no_scontrol):
    # deepspeed --no_ssh started by srun, one launcher per node: SLURM_PROCID is the node index there
    environ = slurm_step(procid=1, nodeid=1, localid=0, ntasks=2, tasks_per_node="1(x2)")
    environ.update({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
                    "CROSS_SIZE": "2", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500"})
    env = E.discover(environ)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.source) == (
        3, 4, 1, 2, 1, "deepspeed")


def test_slurm_variables(no_scontrol):
    env = E.discover(slurm_step(procid=3, nodeid=1, localid=1))
    assert env == E.DistEnv(3, 4, 1, 2, 1, "gpu01", S.port_from_job_id(4711), 2, "slurm")


def test_slurm_uneven_tasks_per_node(no_scontrol):
    environ = slurm_step(procid=6, nodeid=3, localid=0, ntasks=7, nodelist="n[1-4]", tasks_per_node="2(x3),1")
    env = E.discover(environ)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.num_nodes) == (
        6, 7, 0, 1, 3, 4)


def test_slurm_given_master_wins(no_scontrol):
    environ = slurm_step(procid=0, nodeid=0, localid=0) | {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "23456"}
    env = E.discover(environ)
    assert (env.master_addr, env.master_port) == ("10.1.1.1", 23456)


def test_slurm_batch_shell_is_single_process(no_scontrol):
    # measured: the batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS but no SLURM_STEP_ID
    environ = slurm_step(procid=0, nodeid=0, localid=0)
    del environ["SLURM_STEP_ID"]
    assert E.discover(environ).world_size == 1


def test_environ_not_modified(no_scontrol):
    environ = slurm_step(procid=2, nodeid=1, localid=0)
    before = dict(environ)
    E.discover(environ)
    assert environ == before


def test_export_env_round_trip(no_scontrol):
    env = E.discover(slurm_step(procid=3, nodeid=1, localid=1))
    exported: dict[str, str] = {}
    E.export_env(env, exported)
    assert E.discover(exported) == E.DistEnv(3, 4, 1, 2, 1, "gpu01", env.master_port, 2, "torchrun")


# ------------------------------------------------------------------------------------------------ errors

ERRORS = [
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK"),
    ({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "RANK=4"),
    ({"RANK": "x", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "RANK='x'"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a",
      "MASTER_PORT": "1"}, "LOCAL_RANK=2"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
      "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "GROUP_RANK=2"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    (slurm_step(procid=4, nodeid=1, localid=1), "SLURM_PROCID=4"),
    (slurm_step(procid=3, nodeid=2, localid=1), "SLURM_NODEID=2"),
    (slurm_step(procid=3, nodeid=1, localid=2), "SLURM_LOCALID=2"),
    (slurm_step(procid=1, nodeid=0, localid=1, ntasks=5), "sums to 4"),
    (slurm_step(procid=1, nodeid=0, localid=1, tasks_per_node="2(x3)"), "covers 3 nodes"),
    (slurm_step(procid=1, nodeid=0, localid=1) | {"SLURM_STEP_NODELIST": "gpu[02-01]"}, "runs backwards"),
    ({k: v for k, v in slurm_step(procid=1, nodeid=0, localid=1).items() if k != "SLURM_NTASKS"}, "SLURM_NTASKS"),
]


@pytest.mark.parametrize("environ, names", ERRORS, ids=[e[1] for e in ERRORS])
def test_inconsistent_variables_raise(no_scontrol, environ, names):
    with pytest.raises(ValueError) as info:
        E.discover(environ)
    assert names in str(info.value)


def test_init_distributed_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s"):
        G.init_distributed(timeout_s=0)


def test_free_port_is_bindable_and_is_multi_rank_without_a_group():
    import socket

    port = E.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: binding it again succeeds
    assert 1024 <= port < 65536
    assert C.is_multi_rank() is False  # no process group in a unit test


def test_torch_extensions_dir_defaults_to_the_venvs_own(tmp_path, monkeypatch):
    """DeepSpeed's CPU comm op is built where `make install` pre-built it (the venv), not in the
    ~/.cache/torch_extensions every venv shares (where two checkouts rebuilt it at every start); a user's own
    setting wins, and a read-only prefix (a shared install) keeps torch's default."""
    import sys

    env: dict[str, str] = {}
    assert E.default_torch_extensions_dir(env, str(tmp_path)) == str(tmp_path / "torch_extensions")
    assert env == {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    env = {"TORCH_EXTENSIONS_DIR": "/mine"}
    assert E.default_torch_extensions_dir(env, str(tmp_path)) == "/mine" and env == {"TORCH_EXTENSIONS_DIR": "/mine"}
    monkeypatch.setattr(E.os, "access", lambda path, mode: False)  # a read-only prefix (root may write anywhere)
    env = {}
    assert E.default_torch_extensions_dir(env, str(tmp_path)) == "" and env == {}
    monkeypatch.undo()
    # the defaults: this process's environment and the running venv
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert E.default_torch_extensions_dir() == f"{sys.prefix}/torch_extensions"


def test_a_killed_builds_lock_is_removed_a_live_ones_kept(tmp_path, monkeypatch, caplog):
    """A stale JIT-build lock (a build killed mid-way) made every later CPU rank wait forever in torch's
    FileBaton; it is removed where torch looks for it (the op DeepSpeed's CPU accelerator builds, in the build
    directory torch derives from TORCH_EXTENSIONS_DIR), and a fresh one (a build under way) is kept."""
    import time

    from deepspeed.accelerator import get_accelerator
    from torch.utils import cpp_extension
    from torch.utils.file_baton import FileBaton

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    op = get_accelerator().create_op_builder("ShareMemCommBuilder").name
    lock = Path(cpp_extension._get_build_directory(op, False)) / "lock"  # where torch's baton sits
    lock.touch()
    assert E.clear_stale_build_lock(str(tmp_path), now=time.time()) is None and lock.exists()  # a build under way
    old = time.time() - E.STALE_BUILD_LOCK_S - 60
    os.utime(lock, (old, old))
    with caplog.at_level("WARNING", logger=E.log.name):
        assert E.clear_stale_build_lock(str(tmp_path)) == str(lock)
    assert not lock.exists() and "stale build lock" in caplog.text
    FileBaton(str(lock), wait_seconds=0.01).wait()  # returns: the next rank builds instead of waiting forever
    assert E.clear_stale_build_lock(str(tmp_path)) is None and E.clear_stale_build_lock("") is None


class OneGpuTask:
    """DeepSpeed's accelerator API as a task of ``srun --gpus-per-task=1`` (or ``--gpu-bind=single:1``) sees it:
    one CUDA device, index 0, whatever the task's local rank; any other index is CUDA's "invalid device ordinal"."""

    def __init__(self):
        self.selected: list[int] = []

    def device_name(self, index=None):
        return "cuda" if index is None else f"cuda:{index}"

    def device_count(self):
        return 1

    def set_device(self, index):
        if int(index) != 0:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        self.selected.append(int(index))

    def device(self, index=None):
        return ("cuda", index)

    def communication_backend_name(self):
        return "nccl"


def test_gpus_per_task_every_local_rank_uses_the_one_visible_device(monkeypatch, caplog):
    """Local rank 3 of a node whose tasks each see one GPU: albert_dist and DeepSpeed (its engine's
    `_set_distributed_vars`, comm/torch.py's `device_id`) all select device 0; the DistEnv keeps local rank 3."""
    import importlib
    import logging
    import types
    from datetime import timedelta

    import deepspeed
    import deepspeed.runtime.engine as ds_engine
    import torch
    import torch.distributed as tdist

    accel = OneGpuTask()
    for var, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                       "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                       "CUDA_VISIBLE_DEVICES": "5", "TORCH_EXTENSIONS_DIR": "/tmp/x"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(G, "_STARTED", None)
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: accel)
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    seen = {}
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: seen.update(local_rank=E.os.environ["LOCAL_RANK"]))
    with caplog.at_level(logging.INFO, logger=G.__name__):
        env = G.init_distributed()
    assert env.local_rank == 3 and accel.selected == [0] and seen == {"local_rank": "0"}
    assert "device cuda:0 of 1 visible (CUDA_VISIBLE_DEVICES=5)" in caplog.text

    # DeepSpeed's engine reads LOCAL_RANK (`_configure_with_arguments`) and selects that device
    monkeypatch.setattr(ds_engine, "get_accelerator", lambda: accel)
    monkeypatch.setattr(ds_engine.dist, "get_world_size", lambda *a, **k: 4)
    monkeypatch.setattr(ds_engine.dist, "get_rank", lambda *a, **k: 3)
    engine = types.SimpleNamespace()
    ds_engine.DeepSpeedEngine._configure_with_arguments(engine, None, None)
    ds_engine.DeepSpeedEngine._set_distributed_vars(engine, None)
    assert engine.device == torch.device("cuda:0") and accel.selected == [0, 0]
    # and binds its NCCL group to it (comm/torch.py: device_id=get_accelerator().device(LOCAL_RANK))
    group_kwargs = {}
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` is torch itself
    monkeypatch.setattr(ds_comm_torch, "get_accelerator", lambda: accel)

    def init_process_group(backend, timeout=None, init_method=None, rank=-1, world_size=-1, device_id=None):
        group_kwargs["device_id"] = device_id  # DeepSpeed passes it when the signature has it (torch >= 2.3)

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "nccl")
    ds_comm_torch.TorchBackend.init_process_group(types.SimpleNamespace(), "nccl", timedelta(seconds=1), None, 3, 4)
    assert group_kwargs["device_id"] == ("cuda", 0)


def test_bind_device_uses_the_local_rank_among_the_nodes_gpus():
    """--gpus-per-node: every task sees the node's 8 GPUs; local rank 3 takes index 3. CPU: nothing selected."""

    class EightGpus(OneGpuTask):
        def device_count(self):
            return 8

        def set_device(self, index):
            self.selected.append(index)

    env = E.DistEnv(11, 16, 3, 8, 1, "127.0.0.1", 29500, 2, "torchrun")
    accel, environ = EightGpus(), {"LOCAL_RANK": "3"}
    assert E.bind_device(env, accel, environ) == 3 and accel.selected == [3] and environ == {"LOCAL_RANK": "3"}

    class Cpu(OneGpuTask):
        def device_name(self, index=None):
            return "cpu"

    environ = {"LOCAL_RANK": "3"}
    assert E.bind_device(env, Cpu(), environ) is None and environ == {"LOCAL_RANK": "3"}


def _clean_launch_env(monkeypatch):
    import os
    for name in list(os.environ):
        if name.startswith("SLURM_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
                                                 "GROUP_RANK", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name)


def test_dist_command_prints_the_discovery(monkeypatch, capsys):
    """`albert-dist dist` (the job scripts' check): one
    ``DIST {...}`` line of the discovered DistEnv plus the host."""
    import json
    import socket

    from albert_dist.cli import main
    _clean_launch_env(monkeypatch)
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                 "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    assert main(["dist"]) == 0
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("DIST ") and json.loads(line[5:]) == {
        "rank": 5, "world_size": 8, "local_rank": 1, "local_world_size": 4, "node_rank": 1,
        "master_addr": "10.0.0.1", "master_port": 29500, "num_nodes": 2, "source": "torchrun",
        "host": socket.gethostname()}


def test_dist_command_bad_variables_one_line_exit_2(monkeypatch, capsys, no_scontrol):
    from albert_dist.cli import main
    _clean_launch_env(monkeypatch)
    for k, v in slurm_step(procid=4, nodeid=1, localid=1).items():
        monkeypatch.setenv(k, v)
    assert main(["dist"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and "SLURM_PROCID=4" in captured.err


def test_init_distributed_takes_the_callers_discovery(monkeypatch):
    """Given the app's discovery (the preflight's `JobPlan.env`), the process group starts from it: no second
    discovery (whose single-process port is a new free one), its numbers exported and given to DeepSpeed."""
    import deepspeed
    import torch.distributed as tdist

    given = E.DistEnv(1, 2, 0, 1, 1, "10.0.0.7", 29555, 2, "torchrun")
    for var, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "5",
                       "TORCH_EXTENSIONS_DIR": "/tmp/x"}.items():
        monkeypatch.setenv(var, value)  # restored after the test (init_distributed exports its numbers)
    monkeypatch.setattr(G, "discover", lambda *a, **k: pytest.fail("discovered again"))
    monkeypatch.setattr(G, "_STARTED", None)
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: OneGpuTask())
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    seen = {}
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: seen.update(port=kw["distributed_port"]))
    assert G.init_distributed(dist_env=given) is given and seen == {"port": 29555}
    assert [os.environ[v] for v in ("RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")] == \
        ["1", "2", "1", "10.0.0.7", "29555"]
