"""bench/run_all.py runs each benchmark in a child process: discovery, kwargs, summaries, failures, and a benchmark
that spawns its own processes (the runner's plumbing in one process: tests/unit/test_bench_suite.py). The
benchmarks here are fakes returning fixed numbers."""
from __future__ import annotations

import json

from helpers import load_bench

run_all = load_bench("run_all")


def test_discover_and_child_process(tmp_path):
    (tmp_path / "fake.py").write_text(
        "def run(repeats=1):\n    return {'ratio_x': [1.0 * i for i in range(1, repeats + 1)], 'summary': {'x': 1}}\n")
    (tmp_path / "skipme.py").write_text("def main():\n    pass\n")
    (tmp_path / "_private.py").write_text("def run():\n    pass\n")
    (tmp_path / "broken.py").write_text("def run(:\n")
    (tmp_path / "fails.py").write_text("def run(repeats=1):\n    raise RuntimeError('boom')\n")
    assert run_all.discover(tmp_path) == ["broken", "fails", "fake"]
    entry = run_all.run_one("fake", {"repeats": 3, "unknown_size": 5}, timeout_s=120, bench_dir=tmp_path)
    assert entry["status"] == "ok" and entry["kwargs"] == {"repeats": 3}
    assert entry["summary"]["ratio_x"] == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert "summary.x" not in entry["summary"]  # a benchmark's own summary is not summarized again
    failed = run_all.run_one("fails", {"repeats": 1}, timeout_s=120, bench_dir=tmp_path)
    assert failed["status"] == "failed" and "boom" in failed["error"]
    json.dumps(entry)


def test_child_benchmark_can_spawn_processes(tmp_path):
    # lamb.py / zero.py start their ranks with the spawn method, which unpickles the worker function by
    # its module's name: the runner must import a benchmark under its plain name, importable in the ranks.
    (tmp_path / "spawner.py").write_text(
        "import multiprocessing as mp\n"
        "def square(x):\n    return x * x\n"
        "def run(repeats=1):\n"
        "    with mp.get_context('spawn').Pool(1) as pool:\n"
        "        return {'squares': pool.map(square, range(1, repeats + 1))}\n")
    entry = run_all.run_one("spawner", {"repeats": 3}, timeout_s=120, bench_dir=tmp_path)
    assert entry["status"] == "ok", entry.get("error")
    assert entry["result"]["squares"] == [1, 4, 9]
