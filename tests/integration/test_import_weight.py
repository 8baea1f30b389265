"""What importing a module pulls in, checked in a fresh interpreter (a subprocess each: the test process has
imported everything already): the config layer stays torch-free (a `--help` or a refused config pays no torch
import), the checkpoint layout torch-free (tracking reads it), the model package free of the distributed stack,
and `albert-dist tokenizer` never imports DeepSpeed (albert_dist.cli builds only the named command's parser)."""
from __future__ import annotations

import subprocess
import sys

import pytest

CONFIG_HEAVY = ("torch", "deepspeed", "mlflow", "datasets")


@pytest.mark.parametrize("modules, heavy", [
    *[((m,), CONFIG_HEAVY) for m in ("albert_dist.config", "albert_dist.engine.config", "albert_dist.data.config",
                                     "albert_dist.model.config", "albert_dist.tracking.config")],
    (("albert_dist.engine.checkpoint.layout",), ("torch",)),
    (("albert_dist.engine.memory",), ("torch", "deepspeed")),
    (("albert_dist.model", "albert_dist.model.hf", "albert_dist.model.flops"), ("deepspeed", "mlflow")),
])
def test_a_fresh_import_loads_none_of(modules, heavy):
    code = (f"import sys, {', '.join(modules)}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", f"{modules}: {proc.stdout} {proc.stderr[-500:]}"


def test_the_tokenizer_command_imports_no_deepspeed(tmp_path):
    code = ("import sys; from albert_dist import cli; "
            f"code = cli.main(['tokenizer', 'train', '--input', {str(tmp_path / 'none*.txt')!r}, '--vocab-size', "
            f"'50', '--output', {str(tmp_path)!r}]); "
            "print(code, sorted(m for m in ('deepspeed', 'mlflow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr[-2000:]
