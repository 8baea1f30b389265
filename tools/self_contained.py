"""A checkout that needs nothing beside it: no absolute path of one machine in its files, no test reading outside it.

    python tools/self_contained.py       # one line per finding (file:line: what); exit 1 if there is any

A text check, simple on purpose (tests/unit/test_self_contained.py runs it on this tree and on a planted one).
The files: every file of the checkout that .gitignore does not exclude (what `git add -A` would track).

* Machine paths, outside tests/: a path under ``/work``, ``/root`` or ``/home`` anywhere; under ``/tmp`` too in results
  (bench/results/, docs/quickstart-reference/), which record paths relative to the checkout. An example path
  in a how-to (``--output /tmp/x``) is the reader's to change and stays.
* Tests reading outside the checkout (tests/**/*.py): a machine path (under ``/work``), the shared corpora of the
  development machine (``shared/corpora``, ``"shared"``), or a path climbing above the checkout (``REPO.parent``,
  ``ROOT.parent``, ``"../"``, ``Path(__file__)...parents[k]`` with k at or past the checkout's root followed by
  ``.parent``, or k past it). A test reads what the repository holds or what it generates.
"""
from __future__ import annotations

import fnmatch
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE = re.compile(r"/(?:work|root|home)/")
TMP = re.compile(r"/tmp/")
RESULTS = ("bench/results/", "docs/quickstart-reference/")
OUTSIDE = re.compile(r"/(?:work)/|shared/corpora|[\"']shared[\"']|\b(?:REPO|ROOT)\.parent\b|[\"']\.\./")
PARENTS = re.compile(r"parents\[(\d+)\](\.parent\b)?")


def _ignore_patterns(root: Path) -> list[str]:
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """Whether .gitignore's `patterns` exclude the checkout-relative path `rel` (the subset of gitignore's rules
    this tree's .gitignore uses: a leading "/" anchors, a trailing "/" matches directories, globs)."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only, pattern = pattern.endswith("/"), pattern.rstrip("/")
        if dir_only and not is_dir:
            continue
        if pattern.startswith("/") or "/" in pattern:
            if fnmatch.fnmatchcase(rel, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def files(root: Path = ROOT) -> list[str]:
    """The checkout-relative paths of the files .gitignore keeps (``.git``, a worktree's file too, left out), sorted."""
    patterns, out = _ignore_patterns(root), []
    for folder, dirs, names in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        dirs[:] = [d for d in dirs if d != ".git" and not _ignored(base + d, True, patterns)]
        out += [base + n for n in names if n != ".git" and not _ignored(base + n, False, patterns)]
    return sorted(out)


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def findings(root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every machine path outside tests/ and every test line reading outside the checkout."""
    out = []
    for rel in files(root):
        text = _text(root / rel)
        if text is None:
            continue
        is_test = rel.startswith("tests/")
        depth = rel.count("/")  # Path(__file__).parents[depth] is the checkout's root
        for number, line in enumerate(text.splitlines(), 1):
            if not is_test:
                if MACHINE.search(line) or (rel.startswith(RESULTS) and TMP.search(line)):
                    out.append(f"{rel}:{number}: an absolute path of a machine: {line.strip()[:100]}")
            elif rel.endswith(".py"):
                climbs = [m for m in PARENTS.finditer(line) if "__file__" in line
                          and (int(m.group(1)) > depth or (int(m.group(1)) == depth and m.group(2)))]
                if OUTSIDE.search(line) or climbs:
                    out.append(f"{rel}:{number}: a test reading outside the checkout: {line.strip()[:100]}")
    return out


def main() -> int:
    found = findings()
    print("\n".join(found) if found else "self-contained: no machine path, no test reading outside the checkout")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
