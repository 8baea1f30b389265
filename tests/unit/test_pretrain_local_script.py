"""launch/pretrain_local.sh hands the deepspeed launcher the rank count, recipe and overrides it was given.

A stand-in `deepspeed` on PATH prints its argv, so the test checks the command line, not a training run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "configs/pretrain/albert-tiny-wikitext.yaml"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _launch(tmp_path: Path, *args: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "deepspeed"
    fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    # python for the free-port helper comes from this interpreter's directory
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "RUN_DIR": str(tmp_path / "run")}
    proc = subprocess.run(["bash", str(REPO / "launch/pretrain_local.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)
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
