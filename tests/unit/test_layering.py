"""The package's layering (DESIGN.md): a torch-free config layer, no import cycles, and every import (lazy or
not) runs down the layers base < model < data < engine < tracking < app."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "albert_dist"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the albert_dist modules it imports anywhere in its source (top level, in functions, or under
    TYPE_CHECKING: a lazy import is still a dependency)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name and t.startswith("albert_dist"))
        # a package's __init__ is not a dependency of its own submodules' users beyond what it imports itself
        graph[name] = {d for d in deps if d != "albert_dist"}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_detects_a_two_module_cycle():  # the checker itself can fail
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    assert len(graph) > 30 and "albert_dist.trainer" in graph
    assert find_cycle(graph) is None


@pytest.mark.integration
@pytest.mark.parametrize("module", ["albert_dist.config", "albert_dist.engine.config", "albert_dist.data.config",
                                    "albert_dist.model.config", "albert_dist.tracking.config"])
def test_config_layer_imports_no_torch(module):
    code = (f"import sys, {module}; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'deepspeed', 'mlflow', 'datasets')); print(heavy[:5]); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{module} imports {proc.stdout.strip()} {proc.stderr[-500:]}"


#: The layers, bottom to top; a module may import its own layer and the ones below, never one above.
#: `base` is what every layer may name: the process-exit contract and the vocabulary every config section tags
#: its fields with (what a change means on resume); `app` is every other top-level module.
LAYERS = ("base", "model", "data", "engine", "tracking", "app")


def layer_of(module: str) -> str:
    """The layer of an albert_dist module: its sub-package, else base (exit_codes, on_resume) or app (the top
    level)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("model", "data", "engine", "tracking"):
        return parts[1]
    return "base" if module in ("albert_dist", "albert_dist.exit_codes", "albert_dist.on_resume") else "app"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up the layers, as "importer (layer) -> imported (layer)"."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{mod} ({layer_of(mod)}) -> {dep} ({layer_of(dep)})" for mod, deps in graph.items()
                  for dep in deps if rank[layer_of(dep)] > rank[layer_of(mod)])


def test_layer_checker_sees_an_upward_import_without_a_cycle():  # the checker itself can fail
    assert layer_of("albert_dist.engine.checkpoint.save") == "engine"
    assert layer_of("albert_dist.trainer") == "app" and layer_of("albert_dist.exit_codes") == "base"
    graph = {"albert_dist.engine.loss": {"albert_dist.tracking.base"}, "albert_dist.tracking.base": set()}
    assert find_cycle(graph) is None
    assert upward_imports(graph) == ["albert_dist.engine.loss (engine) -> albert_dist.tracking.base (tracking)"]


def test_every_import_runs_down_the_layers():
    graph = import_graph()
    assert {layer_of(m) for m in graph} == set(LAYERS)
    assert upward_imports(graph) == []
