"""The commands the README and docs/ show exist: `albert-dist <sub-command>`, `make <target>`, `launch/<script>`;
and the modules (`albert_dist.x.y`) and test files the README, docs/ and the package's docstrings name exist
(`missing_references`).

Every line of a fenced code block in README.md and docs/*.md that starts (after `VAR=value` assignments) with
`albert-dist`, `make` or `launch/` must name a real sub-command of `albert_dist.cli.COMMANDS`, a target of the
Makefile, or a file in the repository. On every command line (also `python -m albert_dist.cli ...`, `deepspeed`,
`sbatch`, ...) the sub-command after `albert_dist.cli`, a `--config` path and any `configs/`, `slurm/`, `bench/`,
`launch/` path must exist too (placeholders in `<...>` and globs are skipped).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from albert_dist.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_CHECKED_DIRS = ("configs/", "slurm/", "bench/", "launch/", "tools/")


def _fenced_commands(text: str) -> list[str]:
    """Commands in fenced code blocks: continuation lines joined, comments and prompts removed."""
    out, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        line = pending + " ".join(line.split())
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a shell comment (never inside our commands' args)
        if line:
            out.append(line.removeprefix("$ "))
    return out


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command)
    except ValueError:  # not shell (a directory tree with an apostrophe): plain words
        words = command.split()
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def _problems(command: str) -> list[str]:
    words = _words(command)
    if not words:
        return []
    head, problems = words[0], []
    if head == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        problems += [f"no make target {t!r}" for t in targets if t not in _make_targets()]
    for i, word in enumerate(words):
        if word in ("albert-dist", "albert_dist.cli") and (i + 1 == len(words) or words[i + 1] not in COMMANDS):
            problems.append(f"no albert-dist sub-command {words[i + 1:i + 2]} (have {sorted(COMMANDS)})")
    paths = [w for w in words if w.startswith(_CHECKED_DIRS)]
    paths += [b for a, b in zip(words, words[1:]) if a == "--config"]
    for path in dict.fromkeys(paths):
        if "<" not in path and "*" not in path and not (ROOT / path).exists():
            problems.append(f"no file {path!r}")
    return problems


def _all_commands() -> list[tuple[str, str]]:
    """The fenced commands of every page; docs/layout.md's generated package tree (modules' roles, not commands)
    is left out."""
    tree = re.compile(r"<!-- package-tree start -->.*?<!-- package-tree end -->", re.S)
    return [(doc.relative_to(ROOT).as_posix(), cmd) for doc in DOCS
            for cmd in _fenced_commands(tree.sub("", doc.read_text()))]


def _head(command: str) -> str:
    words = _words(command)
    return words[0].split("/")[0] if words else ""


def test_docs_exist_and_readme_links_them():
    readme = (ROOT / "README.md").read_text()
    for name in ("model", "data", "training", "gradients", "mlflow", "slurm", "benchmarks"):
        assert (ROOT / "docs" / f"{name}.md").is_file()
        assert f"(docs/{name}.md)" in readme
    assert len(readme.splitlines()) <= 150


def test_every_doc_page_is_in_the_docs_index():
    """docs/README.md lists every page of docs/ (a task's page one click away) and the README links it; the
    split topic pages (data, training, convergence, scale) each list their own pages."""
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert len(pages) > 20 and [p for p in pages if f"]({p})" not in index] == []
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()
    for topic in ("data", "training", "convergence", "scale"):
        text = (ROOT / "docs" / f"{topic}.md").read_text()
        assert [p for p in pages if p.startswith(f"{topic}-") and f"]({p})" not in text] == [], topic


def test_docs_show_commands():
    """The check below has something to check: the README shows all three kinds of command."""
    heads = {_head(cmd) for _, cmd in _all_commands()}
    assert {"albert-dist", "make", "launch"} <= heads


@pytest.mark.parametrize("doc,command", _all_commands())
def test_documented_command_exists(doc, command):
    """Only the commands the issue names must start a line; the paths and sub-commands of every line are checked."""
    assert _problems(command) == [], f"{doc}: {command}"


@pytest.mark.parametrize("command,expected", [
    ("albert-dist trian --config configs/pretrain/albert-tiny-wikitext.yaml", "no albert-dist sub-command ['trian']"),
    ("torchrun --nproc_per_node 2 -m albert_dist.cli tran", "no albert-dist sub-command ['tran']"),
    ("make pretrian", "no make target 'pretrian'"),
    ("RUN_DIR=x launch/pretrain_locl.sh 2", "no file 'launch/pretrain_locl.sh'"),
    ("albert-dist train --config configs/pretrain/nope.yaml", "no file 'configs/pretrain/nope.yaml'"),
])
def test_checker_finds_wrong_commands(command, expected):
    problems = _problems(command)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_fenced_commands_join_continuations_and_drop_comments():
    text = "x\n```bash\nmake test   # all\nalbert-dist export a \\\n    --output b\n```\nmake nothing\n"
    assert _fenced_commands(text) == ["make test", "albert-dist export a --output b"]


# ------------------------------------------------------------------ modules and test files named in prose

_MODULE_RE = re.compile(r"(?<![\w.])albert_dist(?:\.[A-Za-z_]\w*)+")
_PATH_RE = re.compile(r"(?<![\w/.])(?:albert_dist|tests/(?:unit|integration|distributed|e2e|fixtures))/[\w/]+\.py\b")
#: file names that look like dotted module names: the checkpoint's model record, the run directory's lock
_NOT_MODULES = {"albert_dist.json", "albert_dist.lock"}


def _module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in (root / "albert_dist").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _top_level_names(path: Path) -> set[str]:
    """Names a module defines or imports at its top level (under if/try too)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def missing_references(root: Path = ROOT) -> list[str]:
    """Every ``albert_dist.x.y[.name]`` and ``albert_dist/x/y.py`` / ``tests/<tier>/x.py`` path named in
    README.md, docs/*.md or a module of the package (docstrings, comments) that does not exist: a dotted name
    must be a module, or a module and a name it defines or imports (the first part after the module)."""
    modules = _module_names(root)
    defined: dict[str, set[str]] = {}
    out = []
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "albert_dist").rglob("*.py"))]
    for path in (p for p in texts if p.is_file()):
        text, where = path.read_text(), path.relative_to(root)
        for m in _MODULE_RE.finditer(text):
            name = m.group(0)
            if name in _NOT_MODULES:
                continue
            parts = name.split(".")
            head = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in modules), None)
            rest = parts[len(head.split(".")):] if head else parts
            if head is None or (rest and rest[0] not in defined.setdefault(head, _top_level_names(modules[head]))):
                out.append(f"{where}: {name}")
        out += [f"{where}: {m.group(0)}" for m in _PATH_RE.finditer(text) if not (root / m.group(0)).exists()]
    return sorted(set(out))


def test_modules_and_test_files_named_in_docs_and_docstrings_exist():
    assert missing_references() == []


def test_the_reference_check_finds_a_moved_module_a_gone_name_and_a_gone_test(tmp_path):
    (tmp_path / "albert_dist" / "engine").mkdir(parents=True)
    (tmp_path / "albert_dist" / "__init__.py").write_text("")
    (tmp_path / "albert_dist" / "engine" / "__init__.py").write_text("")
    (tmp_path / "albert_dist" / "engine" / "loss.py").write_text(
        '"""See albert_dist.engine.loss.mlm_loss and tests/unit/test_gone.py."""\ndef mlm_loss(): pass\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("`albert_dist.engine.distributed`, `albert_dist.engine.loss.sop_loss`, "
                                            "`albert_dist/engine/loss.py`, albert_dist.json\n")
    assert missing_references(tmp_path) == ["albert_dist/engine/loss.py: tests/unit/test_gone.py",
                                            "docs/a.md: albert_dist.engine.distributed",
                                            "docs/a.md: albert_dist.engine.loss.sop_loss"]


def test_the_layout_page_tree_is_the_modules_roles():
    """docs/layout.md's package tree is what tools/layout_tree.py makes of the modules' docstrings' first lines
    (one home per fact: a module's role is in its docstring; rerun the script after adding or moving a module)."""
    from helpers import load_tool

    tree = load_tool("layout_tree")
    page = (ROOT / "docs" / "layout.md").read_text()
    start, end = "<!-- package-tree start -->\n", "\n<!-- package-tree end -->"
    assert page[page.index(start) + len(start):page.index(end)] == tree.tree()
    assert "      trainer.py         The pretraining loop on a DeepSpeed engine" in tree.tree()  # apps/pretrain/
