"""The apps import without mlflow and tenacity: the GPU image has neither, and a run with tracking off (what
bench/gpu_check.sh runs there) must start. Both are imported where a run is tracked (albert_dist.tracking)."""
import importlib
import importlib.abc
import sys

import pytest

BLOCKED = ("mlflow", "tenacity")


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the finder protocol
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


@pytest.mark.parametrize("module", ["albert_dist.apps.pretrain.trainer", "albert_dist.apps.pretrain.main", "albert_dist.apps.finetune",
                                    "albert_dist.apps.export", "albert_dist.cli"])
def test_app_imports_without_mlflow_and_tenacity(module):
    saved, finder = dict(sys.modules), _Block()
    try:
        for name in list(sys.modules):  # fresh imports of ours, and none of the blocked already loaded
            if name.split(".")[0] in (*BLOCKED, "albert_dist"):
                del sys.modules[name]
        sys.meta_path.insert(0, finder)
        importlib.import_module(module)
        assert not any(name.split(".")[0] in BLOCKED for name in sys.modules)
        with pytest.raises(ImportError, match="blocked"):  # the control: the block works
            importlib.import_module("tenacity")
    finally:
        sys.meta_path.remove(finder)
        sys.modules.clear()
        sys.modules.update(saved)
