"""What a test job's ranks cost the suite started as new interpreters against forked from tests/fixtures/forkserver.py:
the CPU seconds and wall seconds of tests/fixtures/ranks.py's tiny 2-rank, 8-step job, both ways, alternated.

    python bench/rank_start.py [--repeats 3]

Not part of `make bench` (no ``run``): it measures the test harness, not albert_dist. The CPU seconds of a job are
those of its processes (``RUSAGE_CHILDREN`` of this process for new interpreters, the fork server's reaped children
for forked ranks); the server's own start (its imports, once per pytest process) is printed apart.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fixtures import forkserver  # noqa: E402
from fixtures.ranks import CONFIG, run_ok  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="rank-start-"))
    config = root / "tiny.yaml"
    config.write_text(CONFIG)
    start = time.perf_counter()
    rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    server_start = None
    for i in range(args.repeats):
        for fork in (False, True):
            if fork and server_start is None:  # start the server outside the timed job
                before = time.perf_counter()
                forkserver.ensure_server()
                server_start = (forkserver.server_cpu_seconds(), time.perf_counter() - before)
            cpu0, fs0, t0 = _children_cpu(), forkserver.server_cpu_seconds(), time.perf_counter()
            run_ok(2, config, root / f"run-{i}-{int(fork)}", [], fork=fork)
            rows[fork].append((_children_cpu() - cpu0 + forkserver.server_cpu_seconds() - fs0,
                               time.perf_counter() - t0))
    for fork, name in ((False, "new interpreters"), (True, "forked")):
        cpu = statistics.median(c for c, _ in rows[fork])
        wall = statistics.median(w for _, w in rows[fork])
        print(f"{name:17s} CPU s {cpu:6.1f}  wall s {wall:6.1f}  (median of {args.repeats} 2-rank jobs)")
    fresh, forked = (statistics.median(c for c, _ in rows[f]) for f in (False, True))
    print(f"forked / new: CPU {forked / fresh:.2f}; the server's start: CPU s {server_start[0]:.1f}, "
          f"wall s {server_start[1]:.1f}; total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
