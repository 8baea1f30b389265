"""docs/layout.md's package tree, generated from each module's role: the first line of its docstring.

    python tools/layout_tree.py      # rewrite the tree between <!-- package-tree start/end --> in docs/layout.md

A module's role has one home, its docstring; tests/unit/test_docs.py checks that the
page's tree is what this prints for the current package.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "layout.md"
NAME = "package-tree"
COLUMN = 25  # where the roles start


def role(path: Path) -> str:
    """The role of module `path`: its docstring's first line ('' when there is no docstring)."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def _line(indent: int, name: str, text: str) -> str:
    left = "  " * indent + name
    return (left.ljust(COLUMN - 1) + " " + text).rstrip() if text else left


def tree(package: Path = ROOT / "albert_dist") -> str:
    """The fenced tree of `package`: each package with its __init__'s role, then its modules with theirs (sorted;
    sub-packages after the modules)."""
    lines: list[str] = []

    def walk(pkg: Path, indent: int) -> None:
        init = pkg / "__init__.py"
        lines.append(_line(indent, pkg.name + "/", role(init) if init.is_file() else ""))
        for mod in sorted(p for p in pkg.glob("*.py") if p.name != "__init__.py"):
            lines.append(_line(indent + 1, mod.name, role(mod)))
        for sub in sorted(p for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
            walk(sub, indent + 1)

    walk(package, 0)
    return "```\n" + "\n".join(lines) + "\n```"


def main() -> int:
    write_block(DOC, NAME, tree())
    print(f"wrote the package tree into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
