"""A rank SIGSTOPped under `launch/pretrain_local.sh`: seconds from the SIGSTOP to the hang watchdog's line and to
the script's exit, its exit code, and whether the launcher ended the stopped rank (docs/faults.md).

    python bench/hang_stop.py [--ranks 2] [--step-timeout-s 30] [--init-timeout-s 90] [--stop-at-step 5]

The defaults are the config's (init 900 s, step 300 s) scaled down 10x. albert-tiny on the bundled sample (the
default recipe), no validation, tracking off; rank 1 (its pid from its watchdog report) is stopped once it has
finished `--stop-at-step` steps. Prints one JSON record and writes it to bench/results/hang_stop.json. Not part of
the suite (`bench/run_all.py`): it waits out a timeout by design.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from albert_dist.job.watchdog import rank_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "hang_stop.json"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--step-timeout-s", type=float, default=30.0)
    parser.add_argument("--init-timeout-s", type=float, default=90.0)
    parser.add_argument("--stop-at-step", type=int, default=5)
    parser.add_argument("--stop-rank", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hang_stop_") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = ["launch/pretrain_local.sh", str(args.ranks), "max_steps=100000", "log_interval_steps=1",
               "checkpoint.save_interval_steps=5", "tracking.enabled=false", "data.validation=[]",
               "eval_interval_steps=0", f"engine.step_timeout_s={args.step_timeout_s:g}",
               f"engine.init_timeout_s={args.init_timeout_s:g}"]
        log = open(Path(tmp) / "launch.log", "wb")
        started = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "RUN_DIR": str(run_dir)}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        stopped_pid = None
        try:
            while proc.poll() is None and time.time() - started < 900:
                report = rank_report(run_dir, args.stop_rank)
                if report is not None and report.step >= args.stop_at_step:
                    stopped_pid = report.pid
                    os.kill(stopped_pid, signal.SIGSTOP)
                    break
                time.sleep(0.05)
            if stopped_pid is None:
                raise SystemExit(f"rank {args.stop_rank} never reached step {args.stop_at_step}: "
                                 f"{(Path(tmp) / 'launch.log').read_text()[-3000:]}")
            stopped_at = time.time()
            code = proc.wait(timeout=args.step_timeout_s + 600)
            ended_at = time.time()
            try:
                os.kill(stopped_pid, 0)
                left_alive = True
            except ProcessLookupError:
                left_alive = False
            hang = next(iter(run_dir.glob("watchdog/*/hang.json")), None)
            hang_record = json.loads(hang.read_text()) if hang else {}
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            if stopped_pid is not None:
                try:
                    os.kill(stopped_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            log.close()
        out = (Path(tmp) / "launch.log").read_text(errors="replace")
        result = {
            "command": " ".join(cmd), "ranks": args.ranks, "step_timeout_s": args.step_timeout_s,
            "init_timeout_s": args.init_timeout_s, "stopped_rank": args.stop_rank,
            "stopped_at_step": report.step, "stopped_in_phase": report.phase,
            "sigstop_to_hang_line_s": round(hang_record["time"] - stopped_at, 1) if hang_record else None,
            "sigstop_to_script_exit_s": round(ended_at - stopped_at, 1), "script_exit_code": code,
            "stopped_rank_left_alive": left_alive, "hang_line": hang_record.get("line"),
            # the scratch folder as <work>: a results record holds no machine path (tools/self_contained.py)
            "script_summary": [l.replace(tmp, "<work>") for l in out.splitlines()
                               if l.startswith(("(hang", "pretraining"))],
            "load_average": os.getloadavg(),
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
