"""launch/pretrain_local.sh hands the deepspeed launcher the rank count, recipe and overrides it was given.

A stand-in `deepspeed` on PATH prints its argv, so the test checks the command line, not a training run.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "configs/pretrain/albert-tiny-wikitext.yaml"

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")]


def _run(tmp_path: Path, *args: str, exit_code: int = 0, before_exit: str = "") -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "deepspeed"
    fake.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@"\n{before_exit}\nexit {exit_code}\n')
    fake.chmod(0o755)
    # python for the free-port helper comes from this interpreter's directory
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "RUN_DIR": str(tmp_path / "run")}
    return subprocess.run(["bash", str(REPO / "launch/pretrain_local.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60, start_new_session=True)


def _launch(tmp_path: Path, *args: str) -> list[str]:
    proc = _run(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split("\npretraining finished")[0].splitlines()
    return argv


@pytest.mark.parametrize("args, ranks, recipe, rest", [
    ((), "2", DEFAULT, []),
    (("4",), "4", DEFAULT, []),
    (("2", "max_steps=50"), "2", DEFAULT, ["max_steps=50"]),  # an override is not taken for the recipe
    (("max_steps=5",), "2", DEFAULT, ["max_steps=5"]),
    (("2", "configs/pretrain/albert-base-lamb.yaml", "x=1", "--resume", "auto"), "2",
     "configs/pretrain/albert-base-lamb.yaml", ["x=1", "--resume", "auto"]),
])
def test_arguments_reach_the_launcher(tmp_path, args, ranks, recipe, rest):
    argv = _launch(tmp_path, *args)
    assert argv[argv.index("--num_gpus") + 1] == ranks
    assert argv[argv.index("--config") + 1] == recipe
    tail = argv[argv.index("--config") + 2:]
    assert tail == [f"run_dir={tmp_path / 'run'}", *rest]


def _continue_command(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return shlex.split(lines[lines.index(next(x for x in lines if "continue with:" in x)) + 1])


@pytest.mark.parametrize("args, expected_tail", [
    (("2", "max_steps=50", "data.train=[{paths: [my corpus/*.txt]}]"),
     ["max_steps=50", "data.train=[{paths: [my corpus/*.txt]}]", "--resume", "auto"]),
    (("4", "configs/pretrain/albert-base-lamb.yaml", "x=1", "--resume", "auto"), ["x=1", "--resume", "auto"]),
])
def test_after_a_preemption_it_prints_the_exact_command_to_continue(tmp_path, args, expected_tail):
    proc = _run(tmp_path, *args, exit_code=75)
    assert proc.returncode == 75
    command = _continue_command(proc.stdout)
    ranks = args[0]
    recipe = args[1] if args[1].endswith(".yaml") else DEFAULT
    assert command == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", ranks, recipe, *expected_tail]
    # pasted back, it hands the launcher the same overrides plus --resume auto
    rerun = _launch(tmp_path, *command[2:])
    assert rerun[rerun.index("--config") + 1:] == [recipe, f"run_dir={tmp_path / 'run'}", *expected_tail]


def test_after_a_config_error_there_is_no_resume_hint(tmp_path):
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=2)
    assert proc.returncode == 2
    after = proc.stdout.split("max_steps=50\n", 1)[1]
    assert "exit 2" in after and "resume" not in after and "continue" not in after


# A process started in the background by a non-interactive shell (a CI runner, nohup ... &) inherits SIGINT
# ignored, and bash cannot trap a signal that was ignored when it started: the INT case cannot run there.
_SIGINT_IGNORED = signal.getsignal(signal.SIGINT) == signal.SIG_IGN


@pytest.mark.parametrize("signal_name", [
    pytest.param("INT", marks=pytest.mark.skipif(_SIGINT_IGNORED, reason="SIGINT is ignored in this process tree "
                                                                          "(started in the background); bash cannot trap it")),
    "TERM"])
def test_ctrl_c_or_sigterm_to_the_group_prints_the_command_to_continue(tmp_path, signal_name):
    # The signal reaches the whole group: the ranks checkpoint, `deepspeed`'s runner exits non-zero. The
    # stand-in signals the script itself (its parent), writes a checkpoint's `latest` and exits 1.
    checkpoints = tmp_path / "run" / "checkpoints"
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=1,
                before_exit=f"kill -{signal_name} $PPID; sleep 0.5; mkdir -p {checkpoints}; echo step_7 > {checkpoints}/latest")
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    assert f"(SIG{signal_name} received, the launcher exited 1; newest complete checkpoint: step_7)" in proc.stdout
    assert _continue_command(proc.stdout) == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", "2", DEFAULT,
                                              "max_steps=50", "--resume", "auto"]
