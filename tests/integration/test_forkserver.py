"""tests/fixtures/forkserver.py: a forked rank sees what a new interpreter of the same command sees, and ends as
it would. Each probe runs both ways (`subprocess.Popen` of ``sys.executable`` is the reference) and what it prints
is compared."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from fixtures import forkserver
from helpers import REPO, clean_env, rank_env

PROBE = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                      "file": __file__, "main": sys.modules["__main__"].__dict__.get("MARK"),
                      "env": os.environ.get("PROBE_VAR"), "rank": os.environ.get("RANK"),
                      "globals": sorted(k for k in globals() if not k.startswith("__")),
                      "cmdline": open("/proc/self/cmdline").read().replace(chr(0), " ").strip()}))
    print("to stderr", file=sys.stderr)
    MARK = "mine"
    what = sys.argv[1]
    if what == "raise":
        raise ValueError("probe failed")
    if what == "sleep":
        import time
        print("sleeping", flush=True)
        time.sleep(60)
    sys.exit(int(what))
""")


def _both(tmp_path, args: list[str], module: bool = False, unbuffered: bool = False):
    """(reference, forked): each (exit code, stdout+stderr text) of the probe with ``args``; ``unbuffered``:
    PYTHONUNBUFFERED set (as CI's .ci/run sets it), else unset (stdout to a file is then block-buffered, so its
    lines come after stderr's)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    cmd = [sys.executable, *(["-m", "probe"] if module else [str(script)]), *args]
    env = rank_env(PROBE_VAR="x y", RANK="3")
    env.pop("PYTHONUNBUFFERED", None)
    env.update({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    out = []
    for name, start in (("new", subprocess.Popen), ("forked", forkserver.start)):
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as fh:
            proc = start(cmd, env=env, cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT)
            code = proc.wait(timeout=60)
        out.append((code, log.read_text()))
    return out


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
def test_a_forked_run_sees_and_ends_as_a_new_interpreter(tmp_path, module, unbuffered):
    (code, text), (fork_code, fork_text) = _both(tmp_path, ["3"], module, unbuffered)
    assert (fork_code, fork_text) == (code, text)
    assert code == 3 and text.splitlines()[1 if unbuffered else 0] == "to stderr"
    (seen,) = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert seen["env"] == "x y" and seen["rank"] == "3" and seen["cwd"] == str(tmp_path)
    assert seen["name"] == "__main__" and seen["path0"] == str(tmp_path)


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path):
    (code, text), (fork_code, fork_text) = _both(tmp_path, ["raise"])
    assert code == fork_code == 1
    assert "ValueError: probe failed" in text.splitlines() and "ValueError: probe failed" in fork_text.splitlines()
    assert "Traceback (most recent call last):" in fork_text


def test_wait_times_out_and_a_signal_ends_it_as_popen_reports(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    with open(tmp_path / "log", "wb") as fh:
        proc = forkserver.start([sys.executable, str(script), "sleep"], env=rank_env(), cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM and proc.poll() == -signal.SIGTERM


def test_a_logger_made_at_import_writes_in_order_with_print(tmp_path):
    """DeepSpeed's logger gets its handler at import, holding the server's stdout in a forked child: it must write
    through the child's stdout as in a new interpreter (same buffer, so the same order with print)."""
    script = tmp_path / "probe.py"
    script.write_text("from deepspeed.utils import logger\nprint('before')\nlogger.warning('ds line')\n"
                      "print('after')\n")
    env = rank_env()
    env.pop("PYTHONUNBUFFERED", None)  # block-buffered stdout: an order that differs shows
    orders = []
    for name, start in (("new", subprocess.Popen), ("forked", forkserver.start)):
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as fh:
            assert start([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=fh,
                         stderr=subprocess.STDOUT).wait(timeout=120) == 0
        orders.append([w for line in log.read_text().splitlines() for w in ("before", "ds line", "after")
                       if line.endswith(w)])
    assert orders[0] == orders[1] == ["before", "ds line", "after"]


def test_each_child_draws_its_own_random_numbers(tmp_path):
    """numpy's and torch's global generators are reseeded in each child (two new interpreters differ too)."""
    script = tmp_path / "draw.py"
    script.write_text("import numpy, torch\nprint(numpy.random.rand(), torch.initial_seed(), torch.rand(1).item())\n")
    draws = []
    for i in range(2):
        log = tmp_path / f"{i}.log"
        with open(log, "wb") as fh:
            assert forkserver.start([sys.executable, str(script)], env=rank_env(), cwd=tmp_path, stdout=fh,
                                    stderr=subprocess.STDOUT).wait(timeout=60) == 0
        draws.append(log.read_text().split())
    assert all(a != b for a, b in zip(*draws)), draws


def test_a_variable_read_at_import_must_be_the_servers(tmp_path):
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        forkserver.start([sys.executable, "x.py"], env=rank_env(PYTHONHASHSEED="123"), cwd=tmp_path)


def test_only_python_scripts_and_modules_are_forked(tmp_path):
    with pytest.raises(ValueError, match="the fork server runs"):
        forkserver.start(["bash", "-c", "true"], env=clean_env(), cwd=tmp_path)
    with pytest.raises(ValueError, match="the fork server runs"):
        forkserver.start([sys.executable, "-c", "pass"], env=clean_env(), cwd=tmp_path)
