"""The `house-shape-3` figures of issue 35: the tree's shape against the bars.

    python tools/house_shape.py          # one line per figure: name, value, bar, ok/SHORT; exit 1 if any is short

Figures: modules directly in albert_dist/data/ (<= 10), definitions (functions, methods, classes) whose name has
"plan" (<= 6), modules configuring logging (basicConfig, dictConfig, addHandler on the root: 1), modules calling
flock (1), parameters annotated argparse.Namespace outside cli/ (0), signal or fcntl imported in engine/ (0),
albert_dist/config a package. The docs' word count is shown, never a bar: a size is an observation, not a
target (issue 45).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: Path):
    for path in sorted(package.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _calls(tree: ast.AST, names: set[str]) -> bool:
    """Whether `tree` calls an attribute or name in `names` (``logging.basicConfig(...)``, ``fcntl.flock(...)``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in names and not (isinstance(f, ast.Name) and name == "flock"):  # flock(): the one helper
                return True
    return False


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def figures(root: Path = ROOT) -> list[tuple[str, object, str, bool]]:
    """(figure, value, bar, met) of every house-shape-3 bar for the tree at `root`."""
    package = root / "albert_dist"
    data_modules = [p for p in (package / "data").glob("*.py") if p.name != "__init__.py"]
    plan_defs, logging_mods, flock_mods, namespace_params, engine_sig = [], [], [], [], []
    for path, tree in _modules(package):
        rel = str(path.relative_to(root))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and "plan" in node.name.lower():
                plan_defs.append(f"{rel}:{node.name}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not rel.startswith("albert_dist/cli/"):
                for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                    if a.annotation is not None and "Namespace" in ast.unparse(a.annotation):
                        namespace_params.append(f"{rel}:{node.name}({a.arg})")
        if _calls(tree, {"basicConfig", "dictConfig", "fileConfig"}):
            logging_mods.append(rel)
        if _calls(tree, {"flock", "lockf"}):
            flock_mods.append(rel)
        if rel.startswith("albert_dist/engine/") and _imports(tree) & {"signal", "fcntl"}:
            engine_sig.append(rel)
    docs = sorted((root / "docs").glob("*.md"))
    words = sum(len(p.read_text().split()) for p in docs)
    readme = (root / "README.md")
    words_readme = words + (len(readme.read_text().split()) if readme.is_file() else 0)
    return [
        ("modules directly in data/", len(data_modules), "<= 10", len(data_modules) <= 10),
        ("definitions named *plan*", len(plan_defs), "<= 6", len(plan_defs) <= 6),
        ("modules configuring logging", len(logging_mods), "1", len(logging_mods) == 1),
        ("modules calling flock", len(flock_mods), "1", len(flock_mods) == 1),
        ("argparse Namespace params outside cli/", len(namespace_params), "0", not namespace_params),
        ("signal/fcntl imported in engine/", len(engine_sig), "0", not engine_sig),
        ("albert_dist/config a package", (package / "config" / "__init__.py").is_file(), "True",
         (package / "config" / "__init__.py").is_file()),
        ("docs words (docs/*.md)", words, "(shown)", True),
        ("docs words (docs/*.md + README.md)", words_readme, "(shown)", True),
    ]


def details(root: Path = ROOT) -> dict[str, list[str]]:
    """The modules or definitions behind the counted figures (what to change to meet a bar)."""
    package = root / "albert_dist"
    out: dict[str, list[str]] = {"plan": [], "logging": [], "flock": []}
    for path, tree in _modules(package):
        rel = str(path.relative_to(root))
        out["plan"] += [f"{rel}:{n.name}" for n in ast.walk(tree)
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                        and "plan" in n.name.lower()]
        if _calls(tree, {"basicConfig", "dictConfig", "fileConfig"}):
            out["logging"].append(rel)
        if _calls(tree, {"flock", "lockf"}):
            out["flock"].append(rel)
    return out


def main(argv: list[str] | None = None) -> int:
    rows = figures(Path(argv[0]) if argv else ROOT)
    for name, value, bar, met in rows:
        print(f"{name:42s} {value!s:>8}  bar {bar:10s} {'ok' if met else 'SHORT'}")
    short = sum(not met for *_, met in rows)
    print(f"{short} shortfall(s)")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
