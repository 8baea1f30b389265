"""A crash after the preflight (in Trainer.setup) through `albert-dist train` in a fresh interpreter: exit 1 and
the traceback printed once."""
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import clean_env

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")


def test_a_crash_in_setup_prints_its_traceback_once(tmp_path):
    script = textwrap.dedent(f"""
        import sys, pytest
        from albert_dist import cli
        from albert_dist.apps.pretrain.trainer import Trainer
        def boom(self):
            raise RuntimeError("setup exploded")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Trainer, "setup", boom)
            sys.exit(cli.main(["train", "--config", {RECIPE!r}, "tracking.enabled=false", "run_dir={tmp_path / 'r'}"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert out.count("Traceback (most recent call last)") == 1 and out.count("RuntimeError: setup exploded") == 1
