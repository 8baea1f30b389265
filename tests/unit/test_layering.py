"""The package's layering (DESIGN.md): a torch-free config layer, no import cycles, and every import (lazy or
not, absolute or relative, or a module named in a string for importlib) runs down the layers ground < job <
distributed < model < data < engine < tracking < config < runs < apps < cli, and inside apps/ down APP_ORDER (export
< run_tracking < init_from < preflight < trainer < main < finetune); at most 5 ground modules directly in
albert_dist/; MLflow is imported in tracking/ only.
What a fresh import loads: tests/integration/test_import_weight.py."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "albert_dist"


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name a relative ``from ..x import y`` in `module` names (``from .`` in a package's
    __init__ is the package itself)."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports anywhere in its source: absolute and relative imports (top
    level, in functions, or under TYPE_CHECKING: a lazy import is still a dependency), and string literals that
    name one of its modules (``importlib.import_module("albert_dist.x")``, the "module" or "module:function"
    entries of a dispatch table such as albert_dist.cli.COMMANDS)."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    root = package.name
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module if node.level == 0 else _absolute(name, path.name == "__init__.py", node)
                targets = [base] + [f"{base}.{a.name}" for a in node.names] if base else []
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(root + "."):
                targets = [node.value.split(":")[0]]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name and t.startswith(root))
        # a package's __init__ is not a dependency of its own submodules' users beyond what it imports itself
        graph[name] = {d for d in deps if d != root}
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
    assert len(graph) > 30 and "albert_dist.apps.pretrain.trainer" in graph
    assert find_cycle(graph) is None



#: The layers, bottom to top; a module may import its own layer and the ones below, never one above (DESIGN.md).
#: `ground` is what every layer may name: the modules directly in albert_dist/ (the process-exit contract, sizes,
#: the vocabulary every config section tags its fields with); `job` (a job's life on a rank) and `distributed` (who
#: am I) are the floor under the model; `config` reads files only; `runs` alone reads what a job leaves behind;
#: `apps` compose everything below (pretraining, fine-tuning, export); `cli` is every command's front end.
LAYERS = ("ground", "job", "distributed", "model", "data", "engine", "tracking", "config", "runs", "apps", "cli")

#: The modules allowed directly in albert_dist/ (at most 5): anything else belongs to a layer's package.
GROUND = ("albert_dist", "albert_dist.exit_codes", "albert_dist.on_resume", "albert_dist.sizes", "albert_dist.paths")


def layer_of(module: str) -> str:
    """The layer of an albert_dist module: its sub-package, else ground (a module of GROUND); "unplaced" for a
    top-level module that is neither (test_every_module_has_a_layer fails on it)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS[1:]:
        return parts[1]
    return "ground" if module in GROUND else "unplaced"


#: Inside apps/, bottom to top: an app module may import the ones before it (and its own package), never one after
#: it. A new app module (or package) must be placed here.
APP_ORDER = ("albert_dist.apps.export", "albert_dist.apps.pretrain.run_tracking", "albert_dist.apps.pretrain.init_from",
             "albert_dist.apps.pretrain.preflight", "albert_dist.apps.pretrain.trainer", "albert_dist.apps.pretrain.main",
             "albert_dist.apps.finetune")
#: The packages of apps/, whose __init__ imports nothing of its own.
APP_PACKAGES = ("albert_dist.apps", "albert_dist.apps.pretrain")


def app_rank(module: str) -> int:
    """The place of an app module in APP_ORDER (a package's submodules share its place); -1 when unplaced."""
    for i, name in enumerate(APP_ORDER):
        if module == name or module.startswith(name + "."):
            return i
    return -1


def app_order_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every app module missing from APP_ORDER, and every import that runs up the app order."""
    apps = [m for m in graph if layer_of(m) == "apps" and m not in APP_PACKAGES]
    out = [f"{m}: not placed in APP_ORDER" for m in sorted(apps) if app_rank(m) < 0]
    out += sorted(f"{m} -> {d} (app order)" for m in apps for d in graph[m]
                  if layer_of(d) == "apps" and d not in APP_PACKAGES and app_rank(d) > app_rank(m) >= 0)
    return out


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up the layers, as "importer (layer) -> imported (layer)"."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{mod} ({layer_of(mod)}) -> {dep} ({layer_of(dep)})" for mod, deps in graph.items()
                  for dep in deps if rank[layer_of(dep)] > rank[layer_of(mod)])


def test_layer_checker_sees_an_upward_import_without_a_cycle():  # the checker itself can fail
    assert layer_of("albert_dist.engine.checkpoint.save") == "engine"
    assert layer_of("albert_dist.apps.pretrain.trainer") == "apps" and layer_of("albert_dist.exit_codes") == "ground"
    assert layer_of("albert_dist.trainer") == "unplaced"  # a new top-level module must find its layer
    graph = {"albert_dist.engine.loss": {"albert_dist.tracking.base"}, "albert_dist.tracking.base": set()}
    assert find_cycle(graph) is None
    assert upward_imports(graph) == ["albert_dist.engine.loss (engine) -> albert_dist.tracking.base (tracking)"]


def test_every_import_runs_down_the_layers():
    graph = import_graph()
    assert {layer_of(m) for m in graph} == set(LAYERS)  # every layer holds a module; none is unplaced
    assert upward_imports(graph) == []


def test_at_most_five_modules_sit_directly_in_the_package():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 5 and all(f"albert_dist.{name}" in GROUND for name in top), top
    assert not (PACKAGE / "dist").exists()  # tools and ignore files skip a folder named dist


def test_the_app_modules_import_down_their_order():
    graph = import_graph()
    assert "albert_dist.cli.train" in graph["albert_dist.cli"]  # the COMMANDS table's strings are edges
    assert app_order_violations(graph) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A package tree `root/albert_dist/...` holding `files` (relative path -> source); returns the package."""
    for rel, text in files.items():
        path = root / "albert_dist" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "albert_dist"


def test_the_checker_fails_on_a_planted_relative_or_importlib_upward_import(tmp_path):
    """The import-graph builder on a temporary tree: a relative upward import (``from ...apps.pretrain.trainer
    import Trainer`` in engine/), a dotted importlib string in model/, a COMMANDS-style "module:function" entry, a
    config module importing an app and an app import running up the app order are all reported."""
    package = _tree(tmp_path, {
        "__init__.py": "", "apps/__init__.py": "", "apps/pretrain/__init__.py": "", "apps/pretrain/trainer.py": "",
        "apps/pretrain/main.py": "from .trainer import Trainer\n",
        "apps/pretrain/preflight.py": "from albert_dist.apps.pretrain import main\n",
        "config/__init__.py": "", "config/load.py": "from albert_dist.apps.pretrain import init_from\n",
        "apps/pretrain/init_from.py": "",
        "engine/__init__.py": "", "engine/loss.py": "from ..apps.pretrain.trainer import Trainer\nfrom . import config\n",
        "engine/config.py": "",
        "model/__init__.py": "", "model/albert.py": "import importlib\nimportlib.import_module('albert_dist.apps.pretrain.main')\n",
        "data/__init__.py": "", "data/cli.py": "TABLE = {'x': 'albert_dist.engine.loss:main'}\n",
    })
    graph = import_graph(package)
    assert graph["albert_dist.engine.loss"] == {"albert_dist.apps.pretrain.trainer", "albert_dist.engine",
                                                "albert_dist.engine.config"}
    assert graph["albert_dist.apps.pretrain.main"] == {"albert_dist.apps.pretrain.trainer"}
    assert upward_imports(graph) == [
        "albert_dist.config.load (config) -> albert_dist.apps.pretrain (apps)",
        "albert_dist.config.load (config) -> albert_dist.apps.pretrain.init_from (apps)",
        "albert_dist.data.cli (data) -> albert_dist.engine.loss (engine)",
        "albert_dist.engine.loss (engine) -> albert_dist.apps.pretrain.trainer (apps)",
        "albert_dist.model.albert (model) -> albert_dist.apps.pretrain.main (apps)"]
    assert app_order_violations(graph) == [
        "albert_dist.apps.pretrain.preflight -> albert_dist.apps.pretrain.main (app order)"]


def mlflow_importers(package: Path = PACKAGE) -> list[str]:
    """Every module outside `package`/tracking/ that imports MLflow anywhere in its source (lazily too): the rest
    of the package reaches MLflow through albert_dist.tracking (DESIGN.md)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "tracking":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                out.append(_module_name(path, package))
                break
    return out


def test_only_tracking_imports_mlflow():
    assert mlflow_importers() == []


def test_the_mlflow_check_fails_on_a_planted_import(tmp_path):  # the checker itself can fail
    package = _tree(tmp_path, {
        "__init__.py": "NAME = 'mlflow'\n", "tracking/__init__.py": "", "tracking/tracker.py": "import mlflow\n",
        "apps/__init__.py": "", "apps/finetune/__init__.py": "",
        "apps/finetune/source.py": "def f():\n    from mlflow import MlflowClient\n",
        "init_source.py": "import mlflow.exceptions as e\n", "export.py": "import mlflowlike\n",
    })
    assert mlflow_importers(package) == ["albert_dist.apps.finetune.source", "albert_dist.init_source"]
