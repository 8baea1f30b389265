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


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


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


def test_hostfile_cli_runs_as_script(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "launch/slurm_hostfile.py"), "--nodelist", "n[1-2]",
                           "--slots", "2"], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "n1 slots=2\nn2 slots=2\n"
