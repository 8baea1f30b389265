"""tools/self_contained.py: this checkout holds no absolute path of a machine and no test reading outside it (a
fresh clone's tests need nothing beside it, issue 45); a planted tree shows that each rule can fail, and that
ignored files, a how-to's example path and a test climbing only to the checkout's root pass."""
from __future__ import annotations

from helpers import load_tool

WORK, HOME = "/wo" + "rk/", "/ho" + "me/"  # spelled apart: this file is checked too


def test_this_checkout_needs_nothing_beside_it():
    assert load_tool("self_contained").findings() == []


def test_a_planted_tree_is_found(tmp_path):
    files = {
        ".gitignore": "/runs/\n.venv/\n*.egg-info/\n",
        "runs/x/log.txt": f"{WORK}main/runs/x\n",  # ignored
        ".venv/lib/site.py": f"{HOME}alice\n",  # ignored
        "bench/results/a.json": '{"cmd": "x --out /tmp/soak-1/run"}\n',
        "bench/b.py": f'CORPORA = "{WORK}corpora"\n',
        "docs/c.md": "x\n`--output /tmp/prepared` (an example)\nsee ~/x and /usr/bin/time\n",
        "docs/d.md": f"a run in {HOME}bob/runs/q\n",
        "tests/unit/test_e.py": 'Z = Path(__file__).resolve().parents[2]' + '.parent / "x"\n'
                                'OK = Path(__file__).resolve().parents[2] / "data"\n',
        "tests/unit/test_f.py": "W = REPO" + ".parent / 'corpora'\n",
        "tests/integration/test_g.py": f'Z = Path("{WORK}x.jsonl")\n',
        "tests/unit/test_h.py": 'Z = Path(__file__).resolve().parents[' '3] / "x"\nY = open("..' + '/x")\n',
        "tests/unit/test_i.py": f'SCRUB = "{HOME}alice/runs"  # data for a scrubbing test, read from nowhere\n',
        "tests/fixtures/text/j.md": f"copied from {WORK}shared\n",  # not a test module
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = [line.split(": ")[0] for line in load_tool("self_contained").findings(tmp_path)]
    assert found == ["bench/b.py:1", "bench/results/a.json:1", "docs/d.md:1", "tests/integration/test_g.py:1",
                     "tests/unit/test_e.py:1", "tests/unit/test_f.py:1", "tests/unit/test_h.py:1",
                     "tests/unit/test_h.py:2"]
