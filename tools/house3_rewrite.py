"""Apply the house-3 rewrite map (tools/house3_rewrites.txt) to a tree: module moves and renamed definitions.

Usage: python tools/house3_rewrite.py [--map MAP] [--check] [ROOT]   (ROOT defaults to the repository root)

Map lines (``#`` starts a comment):
  old.dotted.module new.dotted.module      a module (or package) moved; dotted names, ``from old import x`` lines,
                                           ``from parent import leaf`` lines, monkeypatch strings and
                                           ``albert_dist/old/path.py`` paths in code, docs and tests follow it
  symbol:OldName NewName                   a definition renamed; replaced with word boundaries everywhere

Idempotent: a second run changes nothing. A move whose new name extends the old one (a module that became a package
of the same name, e.g. ``albert_dist.finetune albert_dist.finetune.run``) rewrites ``old.x`` only where ``old.x`` is
not a module or package of the rewritten tree. --check prints the files that would change and exits 1 if any.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh", ".sbatch", ".rst"}
NAMES = {"Makefile"}
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "results"}


def read_map(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(module moves old -> new, symbol renames old -> new) from the map file."""
    modules: dict[str, str] = {}
    symbols: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        old, new = line.split()
        if old.startswith("symbol:"):
            symbols[old[len("symbol:"):]] = new
        else:
            modules[old] = new
    return modules, symbols


def existing_modules(root: Path) -> set[str]:
    """Every dotted module and package name under root/albert_dist."""
    out = set()
    for p in (root / "albert_dist").rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


class Rewriter:
    def __init__(self, modules: dict[str, str], symbols: dict[str, str], present: set[str]):
        self.modules, self.symbols, self.present = modules, symbols, present
        olds = sorted(modules, key=len, reverse=True)
        # a dotted name: old, then maybe more dotted parts; not inside a longer identifier
        self.dotted = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, olds)) + r")((?:\.\w+)*)") if olds else None
        # a path: albert_dist/a/b.py or albert_dist/a/b/ (and a/b.py bare when b sits in a sub-package)
        forms = {}
        for old in olds:
            path = old.replace(".", "/")
            forms[path] = old
            if old.count(".") >= 2:
                forms.setdefault(path.split("/", 1)[1], old)
        self.slash = re.compile(r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(forms, key=len, reverse=True)))
                                + r")(\.py\b|/)") if olds else None
        self.slash_forms = forms
        self.symbol_re = (re.compile(r"\b(" + "|".join(map(re.escape, sorted(symbols, key=len, reverse=True)))
                                     + r")\b") if symbols else None)
        self.from_re = re.compile(r"^(?P<ind>[ \t]*)from (?P<pkg>albert_dist(?:\.\w+)*) import "
                                  r"(?P<names>\([^)]*\)|[^\n#]*?)(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M)

    def move(self, name: str) -> str:
        """The new dotted name of `name` (itself if no entry covers it)."""
        if name in self.present and name not in self.modules:
            return name
        for old in sorted(self.modules, key=len, reverse=True):
            if name == old or name.startswith(old + "."):
                new = self.modules[old]
                if new.startswith(old + ".") and name != old:
                    # old became a package of the same name: old.x is already new when old.x exists
                    if any(name == m or name.startswith(m + ".") for m in self.present if m.startswith(old + ".")):
                        return name
                return new + name[len(old):]
        return name

    def _dotted(self, m: re.Match) -> str:
        old, rest = m.group(1), m.group(2)
        parts = rest.split(".")[1:]
        # the longest module prefix of old+rest decides; the rest (attributes) is kept
        for k in range(len(parts), -1, -1):
            head = ".".join([old] + parts[:k])
            if head in self.present and head not in self.modules:
                return m.group(0)  # already a module of the rewritten tree
            if k == 0 and not parts and self._same_name(old):
                return m.group(0)  # the bare package name: still right
            moved = self.move(head)
            if moved != head or k == 0:
                return ".".join([moved] + parts[k:])
        return m.group(0)

    def _same_name(self, old: str) -> bool:
        """old became a package of the same name (its code moved to a module inside it)."""
        return self.modules.get(old, "").startswith(old + ".")

    def _from_line(self, m: re.Match) -> str:
        ind, pkg, names, tail = m.group("ind"), m.group("pkg"), m.group("names"), m.group("tail")
        inner = names[1:-1] if names.startswith("(") else names
        items = [n.strip() for n in inner.replace("\n", " ").split(",") if n.strip()]
        if self._same_name(pkg) and not any(f"{pkg}.{i.split()[0]}" in self.present for i in items):
            return f"{ind}from {self.modules[pkg]} import {names}{tail}"
        if not any(self.move(f"{pkg}.{i.split()[0]}") != f"{pkg}.{i.split()[0]}" for i in items
                   if f"{pkg}.{i.split()[0]}" in self.modules or self._is_module(f"{pkg}.{i.split()[0]}")):
            return m.group(0)
        groups: dict[str, list[str]] = {}
        for item in items:
            leaf = item.split()[0]
            full = f"{pkg}.{leaf}"
            if full in self.modules or self._is_module(full):
                moved = self.move(full)
                parent, new_leaf = moved.rsplit(".", 1)
                alias = item.split(" as ")[1] if " as " in item else (leaf if new_leaf != leaf else None)
                groups.setdefault(parent, []).append(new_leaf + (f" as {alias}" if alias and alias != new_leaf else ""))
            else:
                groups.setdefault(pkg, []).append(item)
        lines = [_wrap(f"{ind}from {p} import ", ns) for p, ns in groups.items()]
        lines[-1] += tail
        return "\n".join(lines)

    def _is_module(self, name: str) -> bool:
        return any(name == old or name.startswith(old + ".") for old in self.modules)

    def _slash(self, m: re.Match) -> str:
        form, suffix = m.group(1), m.group(2)
        old = self.slash_forms[form]
        new = self.modules[old]
        if new.startswith(old + ".") and suffix == "/":  # became a package of the same name: the folder stays
            return m.group(0)
        path = new.replace(".", "/")
        return (path if form.startswith("albert_dist/") else path.split("/", 1)[1]) + suffix

    def rewrite(self, text: str) -> str:
        if self.modules:
            text = self.from_re.sub(self._from_line, text)
            text = self.dotted.sub(self._dotted, text)
            text = self.slash.sub(self._slash, text)
        if self.symbol_re:
            text = self.symbol_re.sub(lambda m: self.symbols[m.group(1)], text)
        return text


def _wrap(head: str, names: list[str], width: int = 120) -> str:
    """`head` + names, in parentheses over several lines when one line would pass `width`."""
    line = head + ", ".join(names)
    if len(line) <= width:
        return line
    out, cur = [], head + "("
    for i, n in enumerate(names):
        piece = n + (", " if i < len(names) - 1 else ")")
        if len(cur) + len(piece.rstrip()) > width and cur.strip() not in ("", head.strip() + " ("):
            out.append(cur.rstrip())
            cur = " " * len(head + "(")
        cur += piece
    out.append(cur)
    return "\n".join(out)


def files(root: Path, exclude: set[Path]):
    for p in sorted(root.rglob("*")):
        if any(part in SKIP_DIRS for part in p.relative_to(root).parts) or not p.is_file() or p in exclude:
            continue
        if p.suffix in SUFFIXES or p.name in NAMES:
            yield p


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", type=Path, default=here.parents[1])
    ap.add_argument("--map", type=Path, default=here.with_name("house3_rewrites.txt"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    modules, symbols = read_map(args.map)
    rw = Rewriter(modules, symbols, existing_modules(root))
    changed = []
    for p in files(root, {args.map.resolve(), here}):
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rw.rewrite(text)
        if new != text:
            changed.append(p.relative_to(root))
            if not args.check:
                p.write_text(new)
    for c in changed:
        print(c)
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
