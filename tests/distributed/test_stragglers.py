"""A rank slowed from outside the trainer is found and named (issue 43, stragglers).

A 2-rank tiny job (tests/fixtures/ranks.py) where rank 1 shares one CPU with a busy competitor process, at a lower
priority (nice 10: CFS gives it ~10% of that CPU while the competitor runs), both pinned there with
`os.sched_setaffinity`; nothing inside the trainer knows. Rank 0 then waits for rank 1 in every collective, so both
ranks' wall time per step is the same; what `albert_dist.engine.stragglers` measures (each rank's runnable time:
on-CPU + run-queue wait) sees rank 1's time queued behind the competitor and not rank 0's sleep in gloo. Expected:
`perf/slowest_rank` = 1 in most records of metrics.jsonl and one warning line on rank 0 naming rank 1 and its host.
Before this work: no `perf/slowest_rank` at all, no warning.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from albert_dist.engine import metric_names as names
from fixtures.ranks import CONFIG, Job
from helpers import read_metrics

pytestmark = pytest.mark.distributed

STEPS = 10
NICE = 10
#: a busy loop that ends by itself should the test die without killing it
COMPETITOR = "import time\nend = time.time() + 180\nwhile time.time() < end: pass"


def _slow_down(pid: int, cpu: int) -> None:
    """Pin every thread of process `pid` to `cpu` at nice `NICE` (threads and processes it starts later inherit
    both from its main thread); a thread that ended meanwhile is skipped."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
            os.setpriority(os.PRIO_PROCESS, int(tid), NICE)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: rank 1's and the others'")
def test_a_rank_slowed_from_outside_is_the_slowest_rank_and_named_in_a_warning(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    job = Job(2, config, tmp_path / "run", [], [f"max_steps={STEPS}", "checkpoint.save_interval_steps=0",
                                                "log_interval_steps=1"])
    competitor = None
    try:
        _slow_down(job.procs[1].pid, cpu)  # before the rank starts its process group, loader and threads
        deadline = time.time() + 120
        # the competitor from the ranks' set-up on (rank 0 writes config.yaml once the process group is up): its
        # CPU seconds are the test's cost
        while not (tmp_path / "run" / "config.yaml").exists() and time.time() < deadline and \
                all(p.poll() is None for p in job.procs):
            time.sleep(0.1)
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR])
        os.sched_setaffinity(competitor.pid, {cpu})
        _slow_down(job.procs[1].pid, cpu)  # any thread made meanwhile
        codes = job.wait(timeout=240)
    finally:
        job.kill()
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    assert codes == [0, 0], f"exit codes {codes}\n{job.log_tail()}"
    records = read_metrics(tmp_path / "run", names.PERF_SLOWEST_RANK)
    assert len(records) == STEPS
    slowest = [int(r[names.PERF_SLOWEST_RANK]) for r in records]
    assert slowest.count(1) > STEPS // 2, (slowest, [r[names.PERF_STEP_TIME_S_MAX] for r in records])
    for r in records:
        assert r[names.PERF_STEP_TIME_S_MAX] >= r[names.PERF_STEP_TIME_S_MEDIAN] > 0
        assert r[names.PERF_DATA_WAIT_S_MAX] >= r[names.PERF_DATA_WAIT_S_MEDIAN] >= 0
    log0 = Path(job.logs[0].name).read_text(errors="replace")
    warnings = re.findall(r"WARNING .*straggler: rank (\d+) on host (\S+) ", log0)
    assert warnings and all(w == ("1", socket.gethostname()) for w in warnings), log0[-3000:]
