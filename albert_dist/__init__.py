"""albert_dist: distributed ALBERT pretraining with grouped cross-layer sharing on DeepSpeed ZeRO."""
import importlib.abc
import importlib.util
import sys
import threading

__version__ = "0.1.0"


class _DeepSpeedWithoutMlflow(importlib.abc.MetaPathFinder):
    """Lets `import deepspeed` skip MLflow: DeepSpeed 0.19.8's package import reaches
    `deepspeed.autotuning.autotuner`, whose ``try: import mlflow`` costs ~1.5-2 CPU-s per process (pandas, fastapi;
    measured with `/usr/bin/time python -c "import deepspeed"` with and without it) for its autotuner alone, which
    this project never runs. While the importing thread executes DeepSpeed's package, `import mlflow` raises
    ImportError there (the autotuner then sets ``has_mlflow = False``); MLflow imported earlier or afterwards, or by
    another thread, is untouched (albert_dist.tracking imports it itself where a run logs to MLflow)."""

    def __init__(self) -> None:
        self._inside = threading.local()

    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" and getattr(self._inside, "deepspeed", False):
            raise ModuleNotFoundError("mlflow is not imported while deepspeed is (albert_dist)", name="mlflow")
        if name != "deepspeed" or getattr(self._inside, "finding", False):
            return None
        self._inside.finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._inside.finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, inside = spec.loader.exec_module, self._inside

        def exec_without_mlflow(module):
            inside.deepspeed = True
            try:
                exec_module(module)
            finally:
                inside.deepspeed = False

        spec.loader.exec_module = exec_without_mlflow  # this loader instance serves deepspeed/__init__.py only
        return spec


# by name, not class: a fresh import of this package (a test that re-imports it) must not add a second one
if not any(type(finder).__name__ == _DeepSpeedWithoutMlflow.__name__ for finder in sys.meta_path):
    sys.meta_path.insert(0, _DeepSpeedWithoutMlflow())
