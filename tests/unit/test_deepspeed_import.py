"""albert_dist's import hook: DeepSpeed's package import runs without MLflow (its autotuner's optional
``import mlflow``, ~3 CPU-s per process), and MLflow imports as usual before and after. Checked on stand-in
`deepspeed` and `mlflow` packages (re-importing the real ones in this process would cost seconds and re-register
torch ops)."""
import importlib
import sys

import pytest

import albert_dist

#: A stand-in for DeepSpeed 0.19.8's package import: deepspeed.autotuning.autotuner's optional import.
FAKE_DEEPSPEED = "try:\n    import mlflow\n    HAS_MLFLOW = True\nexcept ImportError:\n    HAS_MLFLOW = False\n"


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    for name in ("deepspeed", "mlflow"):
        (tmp_path / name).mkdir()
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
    (tmp_path / "deepspeed" / "__init__.py").write_text(FAKE_DEEPSPEED)
    (tmp_path / "mlflow" / "__init__.py").write_text("STAND_IN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return monkeypatch


def _hooks():
    return [f for f in sys.meta_path if type(f).__name__ == albert_dist._DeepSpeedWithoutMlflow.__name__]


def test_deepspeed_imports_without_mlflow_and_mlflow_imports_afterwards(fakes):
    assert len(_hooks()) == 1
    import deepspeed

    assert deepspeed.HAS_MLFLOW is False
    assert "mlflow" not in sys.modules
    import mlflow  # afterwards untouched

    assert mlflow.STAND_IN


def test_mlflow_imported_first_is_what_deepspeed_sees(fakes):
    import mlflow
    import deepspeed

    assert deepspeed.HAS_MLFLOW is True and mlflow.STAND_IN


def test_control_without_the_hook_deepspeed_imports_mlflow(fakes):
    fakes.setattr(sys, "meta_path", [f for f in sys.meta_path if f not in _hooks()])
    import deepspeed

    assert deepspeed.HAS_MLFLOW is True


def test_no_module_imports_mlflow_at_load():
    """MLflow is imported where a run logs to it, never when a module loads: the trainer imports tracking/, and a
    run without tracking would pay MLflow's import (~3 CPU-s per rank) for nothing."""
    import ast
    from pathlib import Path

    root = Path(albert_dist.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno}" for n in names if n.split(".")[0] == "mlflow"]
    assert not found, found
