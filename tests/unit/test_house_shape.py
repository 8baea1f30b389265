"""tools/house_shape.py, the house-shape-3 figures (issue 35): the bars this tree meets, and a planted tree that
breaks each counted one (the checker can fail); the docs' word count is shown, not a bar (issue 45)."""
from __future__ import annotations

from helpers import load_tool


def _values(rows):
    return {name: (value, met) for name, value, _bar, met in rows}


def test_the_tree_meets_the_process_life_and_front_end_bars():
    got = _values(load_tool("house_shape").figures())
    for name in ("modules configuring logging", "modules calling flock", "argparse Namespace params outside cli/",
                 "signal/fcntl imported in engine/", "albert_dist/config a package"):
        assert got[name][1], (name, got[name])


def test_a_planted_tree_is_counted(tmp_path):
    shape = load_tool("house_shape")
    files = {
        "albert_dist/data/a.py": "import logging\nlogging.basicConfig()\ndef plan_x(): pass\n",
        "albert_dist/data/b.py": "import fcntl, logging\nfcntl.flock(0, 1)\nlogging.basicConfig()\nclass JobPlan: pass\n",
        "albert_dist/engine/loss.py": "import signal\n",
        "albert_dist/apps/finetune/run.py": "import argparse\ndef run(args: argparse.Namespace) -> int: return 0\n",
        "albert_dist/config.py": "",
        "docs/a.md": "word " * 50_000,  # more than the old 40,650-word bar: shown, never a shortfall
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = _values(shape.figures(tmp_path))
    assert got == {
        "modules directly in data/": (2, True), "definitions named *plan*": (2, True),
        "modules configuring logging": (2, False), "modules calling flock": (1, True),
        "argparse Namespace params outside cli/": (1, False), "signal/fcntl imported in engine/": (1, False),
        "albert_dist/config a package": (False, False), "docs words (docs/*.md)": (50_000, True),
        "docs words (docs/*.md + README.md)": (50_000, True)}
