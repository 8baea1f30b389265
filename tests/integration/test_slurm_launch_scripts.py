"""launch/slurm_hostfile.py (checked against DeepSpeed's own hostfile parser), the shell scripts' syntax and shellcheck."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL_SCRIPTS = sorted([*REPO.glob("slurm/*.sbatch"), *REPO.glob("slurm/*.sh"), *REPO.glob("launch/*.sh"),
                        *REPO.glob("bench/*.sh"), REPO / ".ci/slurm-cluster.sh", REPO / ".ci/run"])


def _load_hostfile_module():
    spec = importlib.util.spec_from_file_location("slurm_hostfile", REPO / "launch/slurm_hostfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load_hostfile_module()


@pytest.mark.parametrize("environ, slots", [
    ({"SLURM_GPUS_PER_NODE": "8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "a100:4", "SLURM_NTASKS_PER_NODE": "2"}, 4),
    ({"SLURM_GPUS_PER_NODE": "gpu:h100:2"}, 2),
    ({"SLURM_NTASKS_PER_NODE": "3"}, 3),
    ({}, 1),
])
def test_slots_from_env(environ, slots):
    assert H.slots_from_env(environ) == slots


@pytest.mark.parametrize("environ", [{"SLURM_GPUS_PER_NODE": "a100"}, {"SLURM_GPUS_PER_NODE": "0"}])
def test_slots_from_env_rejects(environ):
    with pytest.raises(ValueError, match="SLURM_GPUS_PER_NODE"):
        H.slots_from_env(environ)


def test_hostfile_parsed_by_deepspeed(tmp_path, monkeypatch):
    """The file DeepSpeed's runner reads back (deepspeed.launcher.runner.fetch_hostfile) has every node of
    the list, in order, with the slots asked for."""
    from deepspeed.launcher.runner import fetch_hostfile

    monkeypatch.setenv("PATH", str(tmp_path))  # the Python expander, whether or not Slurm is installed
    out = tmp_path / "hostfile"
    assert H.main(["--nodelist", "gpu[01-03,07],login5", "--slots", "8", "-o", str(out)]) == 0
    pool = fetch_hostfile(str(out))
    assert list(pool.items()) == [("gpu01", 8), ("gpu02", 8), ("gpu03", 8), ("gpu07", 8), ("login5", 8)]


def test_hostfile_errors(capsys):
    assert H.main(["--nodelist", "n[1-2", "--slots", "1"]) == 2
    assert "node list" in capsys.readouterr().err
    assert H.main(["--nodelist", "n[1-2],n1", "--slots", "1"]) == 2
    assert "twice" in capsys.readouterr().err
    assert H.main(["--nodelist", "n1", "--slots", "0"]) == 2


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (Debian package `shellcheck`; .ci/run installs it)")
def test_shellcheck():
    """Every launch/, slurm/, bench/ and .ci/ script passes shellcheck (warnings and style notes included); a line
    that is right as written carries a `# shellcheck disable=SCxxxx # why` directive."""
    proc = subprocess.run(["shellcheck", "--format=gcc", *map(str, SHELL_SCRIPTS)], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sbatch_directives_precede_commands():
    """sbatch stops reading #SBATCH lines at the first command: every directive must come before it."""
    for script in REPO.glob("slurm/*.sbatch"):
        lines = script.read_text().splitlines()
        first_command = next(i for i, line in enumerate(lines[1:], 1) if line.strip() and not line.startswith("#"))
        assert not [line for line in lines[first_command:] if line.startswith("#SBATCH")], script


@pytest.mark.integration
def test_hostfile_cli_runs_as_script(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "launch/slurm_hostfile.py"), "--nodelist", "n[1-2]",
                           "--slots", "2"], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "n1 slots=2\nn2 slots=2\n"


@pytest.mark.parametrize("command_exit, expected, says", [
    (137, 1, "a rank was killed by signal 9 (SIGKILL): the kernel's OOM killer (see dmesg), a kill -9, or srun "
             "ending a rank stuck after another failed (the first error above is the cause); exit 1 (srun exited 137)"),
    (247, 1, "a rank was killed by signal 9 (SIGKILL)"),  # DeepSpeed's launch.py: the rank's -9
    (130, 130, "SIGINT killed the ranks (a second one, or one during start-up): no checkpoint at the stop"),
    (75, 75, "training exited with status 75"), (74, 74, "training exited with status 74"),
    (1, 1, "training exited with status 1"),
])
def test_run_preemptible_maps_a_rank_killed_by_a_signal_to_a_documented_exit_code(command_exit, expected, says):
    """What the batch script exits with when srun's tasks end: albert-dist train's codes pass through; a task
    killed by a signal (srun: 128 + N) is not one of them: 1, naming the signal (130 for SIGINT)."""
    script = (f"MASTER_ADDR=127.0.0.1 SLURM_JOB_ID=1; source slurm/common.sh; "
              f"run_preemptible true -- bash -c 'exit {command_exit}'; echo \"rc=$?\"")
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert f"rc={expected}" in proc.stdout.splitlines()[-1], proc.stdout + proc.stderr
    assert says in proc.stdout, proc.stdout
