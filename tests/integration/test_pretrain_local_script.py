"""launch/pretrain_local.sh hands the deepspeed launcher the rank count, recipe and overrides it was given.

A stand-in `deepspeed` on PATH prints its argv, so the test checks the command line, not a training run.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "configs/pretrain/albert-tiny-wikitext.yaml"

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")]


def _run(tmp_path: Path, *args: str, exit_code: int = 0, before_exit: str = "",
         sigint: signal.Handlers = signal.SIG_DFL, script: Path = REPO / "launch/pretrain_local.sh",
         env: dict | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "deepspeed"
    fake.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@"\n{before_exit}\nexit {exit_code}\n')
    fake.chmod(0o755)
    # python for the free-port helper comes from this interpreter's directory
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "RUN_DIR": str(tmp_path / "run"),
           **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}  # None: unset (e.g. RUN_DIR)
    # SIGINT at its default, as in a terminal, unless `sigint` says otherwise (a script's background job, e.g. a
    # CI runner's children, inherits it ignored, and bash cannot trap a signal ignored when it started)
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          env=env, timeout=60, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def _launch(tmp_path: Path, *args: str) -> list[str]:
    # a finished run leaves a "final" checkpoint at max_steps: without one the launcher's 0 is not believed
    proc = _run(tmp_path, *args, before_exit=_checkpoint(tmp_path / "run", "step_50", "final", step=50))
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split("\npretraining finished")[0].splitlines()
    return argv


@pytest.mark.parametrize("args, ranks, recipe, rest", [
    ((), "2", DEFAULT, []),
    (("4",), "4", DEFAULT, []),
    (("2", "max_steps=50"), "2", DEFAULT, ["max_steps=50"]),  # an override is not taken for the recipe
    (("max_steps=5",), "2", DEFAULT, ["max_steps=5"]),
    (("2", "configs/pretrain/albert-base-lamb.yaml", "seed=1", "--resume", "auto"), "2",
     "configs/pretrain/albert-base-lamb.yaml", ["seed=1", "--resume", "auto"]),
])
def test_arguments_reach_the_launcher(tmp_path, args, ranks, recipe, rest):
    argv = _launch(tmp_path, *args)
    assert argv[argv.index("--num_gpus") + 1] == ranks
    assert argv[argv.index("--config") + 1] == recipe
    tail = argv[argv.index("--config") + 2:]
    assert tail == [f"run_dir={tmp_path / 'run'}", *rest]


def _continue_command(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return shlex.split(lines[lines.index(next(x for x in lines if x.rstrip().endswith(" with:"))) + 1])


@pytest.mark.parametrize("args, expected_tail", [
    (("2", "max_steps=50", "data.train=[{paths: [my corpus/*.txt]}]"),
     ["max_steps=50", "data.train=[{paths: [my corpus/*.txt]}]", "--resume", "auto"]),
    (("4", "configs/pretrain/albert-base-lamb.yaml", "seed=1", "--resume", "auto"), ["seed=1", "--resume", "auto"]),
])
def test_after_a_preemption_it_prints_the_exact_command_to_continue(tmp_path, args, expected_tail):
    proc = _run(tmp_path, *args, exit_code=75, before_exit=_checkpoint(tmp_path / "run", "step_7", "stop"))
    assert proc.returncode == 75
    command = _continue_command(proc.stdout)
    ranks = args[0]
    recipe = args[1] if args[1].endswith(".yaml") else DEFAULT
    assert command == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", ranks, recipe, *expected_tail]
    # pasted back, it hands the launcher the same overrides plus --resume auto
    rerun = _launch(tmp_path, *command[2:])
    assert rerun[rerun.index("--config") + 1:] == [recipe, f"run_dir={tmp_path / 'run'}", *expected_tail]


def test_after_a_config_error_there_is_no_resume_hint(tmp_path):
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=2)
    assert proc.returncode == 2
    after = proc.stdout.split("max_steps=50\n", 1)[1]
    assert "exit 2" in after and "resume" not in after and "continue" not in after



def test_a_job_refused_by_the_run_directory_lock_returns_at_once(tmp_path):
    """A second launch on a run directory in use is refused (exit 2) by its ranks, but the script then waited for
    "its" ranks, found by their command line, which were the first job's (same recipe, same run_dir=): up to
    300 s, or until the other job ended. A stand-in process carries that command line for the other job."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "albert_dist.cli", "train",
                              "--config", DEFAULT, f"run_dir={tmp_path / 'run'}", "max_steps=50"])
    try:
        start = time.monotonic()
        proc = _run(tmp_path, "2", "max_steps=50", exit_code=2)
        took = time.monotonic() - start
    finally:
        other.kill()
        other.wait()
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert took < 20 and "still running" not in proc.stderr, (took, proc.stderr)

def _checkpoint(run: Path | str, tag: str, reason: str, step: int = 7, max_steps: int = 50,
                stop_cause: str = "") -> str:
    """Shell commands writing what a save leaves: the tag's albert_dist.json (its "step", "reason", "stop_cause"
    when given, and the resolved config's max_steps), then `latest`."""
    ckpt = f"{run}/checkpoints"
    cause = f'"stop_cause": "{stop_cause}", ' if stop_cause else ""
    meta = f'{{"step": {step}, "reason": "{reason}", {cause}"config": {{"max_steps": {max_steps}}}}}'
    return f"mkdir -p {ckpt}/{tag}; echo '{meta}' > {ckpt}/{tag}/albert_dist.json; echo {tag} > {ckpt}/latest"


@pytest.mark.parametrize("cause, restarted", [("store", True), ("signal", False)])
def test_max_restarts_restarts_a_store_give_up_in_place_not_a_stop_asked_for(tmp_path, cause, restarted):
    """`--max-restarts 1`: the ranks' own 75 on an object store that stayed unavailable (the stop checkpoint's
    stop_cause "store") starts the run again in place with --resume auto, as a crash does; a 75 of a signal (a
    stop asked for, here one sent to the ranks only) does not. Each attempt of the stand-in records progress."""
    run = tmp_path / "run"
    progress = (f"mkdir -p {run}; t=$(date +%s.%N); "
                f"echo '{{\"event\": \"start\", \"t\": '$t', \"step\": 0, \"begin_t\": '$ALBERT_LAUNCH_TIME', "
                f"\"launch_t\": '$ALBERT_LAUNCH_TIME', \"load_s\": 0.0}}' >> {run}/goodput.jsonl; "
                f"echo '{{\"event\": \"interval\", \"t\": '$t', \"step\": 7, \"from_step\": 0, \"elapsed_s\": 1.0, "
                f"\"phases\": {{}}}}' >> {run}/goodput.jsonl")
    # each attempt's own stop checkpoint: step_7, then step_8 (attempts counted by their start events)
    stop = _checkpoint(run, "step_$((6 + n))", "stop", stop_cause=cause).replace('"step": 7', '"step": '"'$((6 + n))'"'')
    proc = _run(tmp_path, "2", "max_steps=50", "--max-restarts", "1", exit_code=1,
                before_exit=f"{progress}\nn=$(grep -c '\"start\"' {run}/goodput.jsonl)\n{stop}")
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    said = "(exit 75: restart 1 in place with --resume auto, 0 more allowed)"
    assert (said in proc.stdout) == restarted, proc.stdout
    assert proc.stdout.count("--world_info") + proc.stdout.count("--num_gpus") >= 1
    assert proc.stdout.count("pretraining stopped") == 1, proc.stdout  # one final word, after the last attempt

@pytest.mark.parametrize("signal_name", ["INT", "TERM"])
def test_ctrl_c_or_sigterm_then_a_stop_checkpoint_is_exit_75_with_the_command_to_continue(tmp_path, signal_name):
    # The signal reaches the whole group: the ranks checkpoint, DeepSpeed's launch.py exits 1 whatever they said.
    # The stand-in signals the script (its parent), writes a stop checkpoint and exits 1.
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=1,
                before_exit=f"kill -{signal_name} $PPID; sleep 0.5; {_checkpoint(tmp_path / 'run', 'step_7', 'stop')}")
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    assert f"(SIG{signal_name}: every rank stopped after writing checkpoint step_7; the launcher exited 1)" \
        in proc.stdout
    assert _continue_command(proc.stdout) == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", "2", DEFAULT,
                                              "max_steps=50", "--resume", "auto"]



def test_a_store_give_up_is_named_as_such_not_as_a_signal(tmp_path):
    """The ranks stop for an object store that stayed unavailable as for a signal (a stop checkpoint, exit 75);
    the script said "stopped by a signal" (issue 46). The checkpoint records the cause; the script names it, and
    the ranks' own 75 without a checkpoint at the stop (a store down before the first step) is named the same."""
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=1,
                before_exit=_checkpoint(tmp_path / "run", "step_7", "stop", stop_cause="store"))
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    assert "signal" not in proc.stdout, proc.stdout
    assert ("(the object store stayed unavailable for data.store_retry_s (the ranks' log names the URL): every rank "
            "stopped after writing checkpoint step_7; the launcher exited 1)") in proc.stdout
    assert ("pretraining stopped: the object store stayed unavailable, after writing a checkpoint (exit 75); once it "
            "answers, continue with:") in proc.stdout
    assert _continue_command(proc.stdout)[-2:] == ["--resume", "auto"]
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=75)  # no new checkpoint: step_7 is the newest still
    assert proc.returncode == 75 and "signal" not in proc.stdout, proc.stdout
    assert ("pretraining stopped (exit 75) without a checkpoint at the stop: an object store stayed unavailable (the "
            "ranks' log names it); once it answers, continue from its last complete checkpoint (step_7) with:"
            ) in proc.stdout


@pytest.mark.parametrize("signal_name", ["INT", "TERM"])
def test_a_signal_after_the_final_checkpoint_is_a_finished_run(tmp_path, signal_name):
    """Ctrl-C or SIGTERM a moment after the run finished (its final checkpoint at max_steps written, the launcher
    still exiting, here with 143 as when it dies of the signal) was "pretraining interrupted, unsaved at the stop"
    with a resume command; a scheduler requeued a finished run. The final checkpoint decides: 0, finished."""
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=143,
                before_exit=f"{_checkpoint(tmp_path / 'run', 'step_50', 'final', step=50)}; kill -{signal_name} $PPID; "
                            "sleep 0.5")
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert f"(SIG{signal_name} came after the final checkpoint step_50 at max_steps; the launcher exited 143)" \
        in proc.stdout
    assert "pretraining finished" in proc.stdout and "continue" not in proc.stdout

def test_sigint_from_a_script_with_sigint_ignored_is_exit_75_like_a_ctrl_c(tmp_path):
    """`setsid launch/pretrain_local.sh ... &` from a script, then `kill -INT -PGID`: the script starts with SIGINT
    ignored (a non-interactive shell's background job) and cannot trap it, the ranks stop on it and checkpoint,
    the launcher exits 1. It was "pretraining failed (exit 1)"; a scheduler reading the code gave up. Now the
    stop checkpoint decides: 75 and the command to continue, as after a Ctrl-C."""
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=1, sigint=signal.SIG_IGN,
                before_exit=f"kill -INT $PPID; sleep 0.5; {_checkpoint(tmp_path / 'run', 'step_7', 'stop')}")
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    assert "(SIGINT: every rank stopped after writing checkpoint step_7; the launcher exited 1)" in proc.stdout
    assert "pretraining failed" not in proc.stdout
    assert _continue_command(proc.stdout) == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", "2", DEFAULT,
                                              "max_steps=50", "--resume", "auto"]


@pytest.mark.parametrize("written, reason", [(False, ""), (True, "interval")])
def test_a_signal_without_a_checkpoint_at_the_stop_is_not_called_one(tmp_path, written, reason):
    """The issue's Ctrl-C case: the last interval checkpoint was taken for one written at the stop (exit 75).
    Now: no new checkpoint, or a new one the ranks wrote on their interval (killed before their stop's), is an
    interrupt: exit 130 (128 + SIGINT), the newest complete checkpoint named, the command to continue printed."""
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["bash", "-c", _checkpoint(run, "step_5", "interval")], check=True)
    write = _checkpoint(run, "step_7", reason) if written else "true"
    proc = _run(tmp_path, "2", exit_code=1, before_exit=f"kill -INT $PPID; sleep 0.5; {write}")
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    newest = "step_7" if written else "step_5"
    assert f"(SIGINT: no checkpoint was written at the stop (a second Ctrl-C, a signal during start-up, or the " \
           f"ranks were killed); newest complete checkpoint: {newest})" in proc.stdout
    assert f"pretraining interrupted, unsaved at the stop (exit 130); continue from its last complete checkpoint " \
           f"({newest}) with:" in proc.stdout and "stopped by a signal" not in proc.stdout
    assert _continue_command(proc.stdout)[-2:] == ["--resume", "auto"]


@pytest.mark.parametrize("launcher_exit, signum, name", [(247, 9, "KILL"), (137, 9, "KILL"), (245, 11, "SEGV")])
def test_a_rank_killed_by_a_signal_is_exit_1_naming_the_signal(tmp_path, launcher_exit, signum, name):
    """kill -9 of rank 1: DeepSpeed's launch.py exits with the rank's return code -9, i.e. 247, which is not one
    of the documented codes: it becomes 1 (a crash; `--resume auto` continues), the signal named."""
    proc = _run(tmp_path, "2", exit_code=launcher_exit, before_exit=_checkpoint(tmp_path / "run", "step_5", "interval"))
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert f"(a rank was killed by signal {signum} (SIG{name}), e.g. the kernel's OOM killer (see dmesg) or a " \
           f"kill -9; the launcher exited {launcher_exit})" in proc.stdout
    assert "pretraining failed (exit 1)" in proc.stdout and _continue_command(proc.stdout)[-2:] == ["--resume", "auto"]


def test_a_diverged_run_is_exit_77_said_so_with_its_healthy_checkpoint(tmp_path):
    """The ranks exit 77 (albert_dist.engine.divergence): passed through as "diverged", not a crash."""
    proc = _run(tmp_path, "2", exit_code=77, before_exit=_checkpoint(tmp_path / "run", "step_8", "interval"))
    assert proc.returncode == 77, (proc.returncode, proc.stdout, proc.stderr)
    assert "pretraining diverged (exit 77, the line above names the step): no final model; checkpoints/latest " \
           "names the newest healthy checkpoint (step_8)" in proc.stdout and "failed" not in proc.stdout
    assert _continue_command(proc.stdout)[-2:] == ["--resume", "auto"]


def test_without_the_venv_on_path_it_says_to_activate_it(tmp_path):
    """A fresh shell (no venv on PATH) got `deepspeed: command not found`, exit 127 and a hint to resume a run
    that never started; now exit 2 naming the fix, and no run directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    proc = subprocess.run([shutil.which("bash"), str(REPO / "launch/pretrain_local.sh"), "2"], capture_output=True,
                          text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RUN_DIR": str(tmp_path / "run")},
                          timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no 'deepspeed' command on PATH" in proc.stderr and "source .venv/bin/activate" in proc.stderr
    assert "--resume auto" not in proc.stdout + proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN])
def test_a_stop_checkpoint_with_the_launcher_exiting_0_is_exit_75_not_finished(tmp_path, sigint):
    """The user trial's two SIGINTs 0.3 s apart: the ranks checkpointed step_256 ("reason": "stop") and exited 75,
    but launch.py died of the second signal and DeepSpeed's runner, which exits only with a positive code, exited
    0: the script said "pretraining finished", exit 0, no command to continue. Now the checkpoint decides."""
    proc = _run(tmp_path, "2", "max_steps=300", exit_code=0, sigint=sigint,
                before_exit=_checkpoint(tmp_path / "run", "step_256", "stop", step=256, max_steps=300))
    assert proc.returncode == 75, (proc.returncode, proc.stdout, proc.stderr)
    assert "pretraining finished" not in proc.stdout
    assert "every rank stopped after writing checkpoint step_256; the launcher exited 0)" in proc.stdout
    assert _continue_command(proc.stdout) == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", "2", DEFAULT,
                                              "max_steps=300", "--resume", "auto"]


@pytest.mark.parametrize("written", [False, True])
def test_a_launcher_exiting_0_short_of_max_steps_is_not_finished(tmp_path, written):
    """0 from the launcher, but the newest checkpoint (or none) is short of max_steps and not a stop's: the run
    was interrupted unsaved (130), not finished."""
    write = _checkpoint(tmp_path / "run", "step_100", "interval", step=100, max_steps=300) if written else "true"
    proc = _run(tmp_path, "2", "max_steps=300", exit_code=0, before_exit=write)
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    assert "pretraining finished" not in proc.stdout and "the run did not reach max_steps" in proc.stdout
    assert ("--resume auto" in proc.stdout) == written


@pytest.mark.parametrize("sigint, launcher_exit", [(signal.SIG_IGN, 1), (signal.SIG_DFL, 1), (signal.SIG_IGN, 254)])
def test_two_sigints_before_any_checkpoint_are_exit_130_interrupted_unsaved(tmp_path, sigint, launcher_exit):
    """The user trial's two SIGINTs 0.1 s apart to `setsid launch/pretrain_local.sh ... &` (SIGINT ignored when it
    started): the ranks died of the second, nothing was saved, launch.py exited 1 (or 254, a rank's -2), and the
    script said "pretraining failed (exit 1) ... after fixing the cause". Now: 130, interrupted, and no
    `--resume auto` (there is nothing to resume)."""
    signals = "kill -INT $PPID; sleep 0.1; kill -INT $PPID; sleep 0.3" if launcher_exit == 1 else "true"
    proc = _run(tmp_path, "2", "max_steps=50", exit_code=launcher_exit, sigint=sigint, before_exit=signals)
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    assert "pretraining interrupted before its first checkpoint (exit 130); nothing to resume" in proc.stdout
    assert "pretraining failed" not in proc.stdout and "after fixing the cause" not in proc.stdout
    assert _continue_command(proc.stdout) == [f"RUN_DIR={tmp_path / 'run'}", "launch/pretrain_local.sh", "2", DEFAULT,
                                              "max_steps=50"]


def _checkout(tmp_path: Path) -> Path:
    """A scratch checkout (the script, and links to the package and configs it asks for the run directory), so a
    run without RUN_DIR names its directory under this checkout's runs/, not the real one's."""
    checkout = tmp_path / "checkout"
    (checkout / "launch").mkdir(parents=True)
    shutil.copy(REPO / "launch/pretrain_local.sh", checkout / "launch")
    for name in ("albert_dist", "configs"):
        (checkout / name).symlink_to(REPO / name)
    return checkout


# the stand-in's finish: the final checkpoint in the run directory the ranks were given (the last run_dir=)
FINISH_IN_GIVEN_RUN_DIR = ('for a; do [[ $a == run_dir=* ]] && d=${a#run_dir=}; done; '
                           + _checkpoint("$d", "step_50", "final", step=50))


def test_two_runs_without_a_run_dir_get_two_new_run_directories(tmp_path):
    """Without RUN_DIR or run_dir=, each run gets a new runs/<recipe>-<UTC time>[-k] (named and created by
    `albert-dist train --print-run-dir auto`, the ranks' own rule: albert_dist.job.lock.auto_run_dir, whose
    same-second case tests/unit/test_train_cli.py checks), passed to the ranks and judged there."""
    checkout = _checkout(tmp_path)
    dirs = []
    for _ in range(2):
        proc = _run(tmp_path, "1", before_exit=FINISH_IN_GIVEN_RUN_DIR, script=checkout / "launch/pretrain_local.sh",
                    env={"RUN_DIR": None, "MASTER_PORT": "29999"})
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        dirs.append(Path(next(a for a in proc.stdout.splitlines() if a.startswith("run_dir="))[len("run_dir="):]))
        assert f"pretraining finished; outputs in {dirs[-1]}" in proc.stdout
    assert dirs[0] != dirs[1] and sorted(dirs) == sorted((checkout / "runs").iterdir())
    assert all(d.name.startswith("albert-tiny-wikitext-20") and (d / "checkpoints/latest").is_file() for d in dirs)


@pytest.mark.parametrize("how", ["override", "override over RUN_DIR", "recipe"])
def test_the_run_directory_the_ranks_use_is_the_one_judged_and_nothing_else_is_created(tmp_path, how):
    """The issue's `launch/pretrain_local.sh 2 max_steps=4 run_dir=DIR`: the ranks trained into DIR, the script
    reserved and judged an auto-named runs/ directory of its own, said "interrupted before its first checkpoint
    (exit 130)" and left that empty directory. Now the directory is the one the ranks resolve, however it was
    named (a run_dir= override, which wins over RUN_DIR as on the ranks' command line; a recipe's run_dir)."""
    checkout = _checkout(tmp_path)
    chosen = tmp_path / "chosen"
    args = ["2", "max_steps=4", f"run_dir={chosen}"]
    env = {"RUN_DIR": str(tmp_path / "env-dir") if how == "override over RUN_DIR" else None, "MASTER_PORT": "29999"}
    if how == "recipe":
        recipe = tmp_path / "mine.yaml"
        recipe.write_text((REPO / DEFAULT).read_text() + f"\nrun_dir: {chosen}\n")
        args = ["2", str(recipe), "max_steps=4"]
    proc = _run(tmp_path, *args, before_exit=FINISH_IN_GIVEN_RUN_DIR, script=checkout / "launch/pretrain_local.sh",
                env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert f"pretraining finished; outputs in {chosen}" in proc.stdout and "interrupted" not in proc.stdout
    assert (chosen / "checkpoints/latest").is_file()
    assert not (checkout / "runs").exists() and not (tmp_path / "env-dir").exists()


def test_a_config_error_is_refused_once_before_the_launcher_and_leaves_no_run_directory(tmp_path):
    """An override that does not load: one line (not one per rank), exit 2, no launcher started, no runs/."""
    checkout = _checkout(tmp_path)
    proc = _run(tmp_path, "2", "max_steps=oops", script=checkout / "launch/pretrain_local.sh",
                env={"RUN_DIR": None, "MASTER_PORT": "29999"})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("albert-dist train: ") == 1 and "max_steps" in proc.stderr, proc.stderr
    assert "--num_gpus" not in proc.stdout and not (checkout / "runs").exists()


def test_a_config_error_leaves_no_empty_automatic_run_directory(tmp_path):
    checkout = _checkout(tmp_path)
    proc = _run(tmp_path, "1", exit_code=2, script=checkout / "launch/pretrain_local.sh",
                env={"RUN_DIR": None, "MASTER_PORT": "29999"})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert list((checkout / "runs").iterdir()) == []


HANG_LINE = ("hang: no progress for over 300 s; 1 of 2 rank(s) stopped reporting: rank 1 (host node7, pid 4242) at "
             "step 12, phase data for 301 s, last report 301 s ago")


def _hang_report(run: Path, job: str = "20261206T000000Z") -> str:
    """Shell commands writing what the hang watchdog leaves (albert_dist.job.watchdog): <run>/watchdog/<job>/hang.json."""
    return f"mkdir -p {run}/watchdog/{job}; echo '{{\"line\": \"{HANG_LINE}\"}}' > {run}/watchdog/{job}/hang.json"


@pytest.mark.parametrize("launcher_exit", [76, 247])
def test_a_hang_is_exit_76_with_the_watchdogs_line_and_the_command_to_continue(tmp_path, launcher_exit):
    """The live ranks exit 76 (EXIT_HUNG) and launch.py SIGKILLs the stopped one: the launcher says 76, or the
    killed rank's 247. Either way the watchdog's report of this launch decides: exit 76, its line, the command to
    continue (it was "pretraining failed (exit 76)", or a crash naming SIGKILL)."""
    run = tmp_path / "run"
    proc = _run(tmp_path, "2", exit_code=launcher_exit,
                before_exit=f"{_checkpoint(run, 'step_10', 'interval')}; {_hang_report(run)}")
    assert proc.returncode == 76, (proc.returncode, proc.stdout, proc.stderr)
    assert f"({HANG_LINE}; the launcher exited {launcher_exit})" in proc.stdout
    assert "pretraining hung: a rank stopped making progress (exit 76" in proc.stdout
    assert "continue from its last complete checkpoint (step_10)" in proc.stdout
    assert _continue_command(proc.stdout)[-2:] == ["--resume", "auto"]


@pytest.mark.parametrize("launcher_exit, expected", [(76, 76), (247, 1)])
def test_a_save_cut_short_before_any_complete_checkpoint_still_gets_resume_auto(tmp_path, launcher_exit, expected):
    """A rank SIGSTOPped (or killed) inside the first save leaves an incomplete step_3/ and no `latest`. The ranks
    refuse that run_dir without --resume ("already holds an earlier run's checkpoints", exit 2), so the command
    printed to continue must carry --resume auto (it did not: it keyed on `latest` alone; found by SIGSTOP of rank 1
    during the first save of a 2-rank albert-base job)."""
    run = tmp_path / "run"
    hang = f"; {_hang_report(run)}" if expected == 76 else ""
    proc = _run(tmp_path, "2", exit_code=launcher_exit,
                before_exit=f"mkdir -p {run}/checkpoints/step_3 {run}/checkpoints/step_2_diverged{hang}")
    assert proc.returncode == expected, (proc.returncode, proc.stdout, proc.stderr)
    assert _continue_command(proc.stdout)[-2:] == ["--resume", "auto"], proc.stdout
    if expected == 76:
        assert "continue from its last complete checkpoint (none; step_3 is incomplete)" in proc.stdout


def test_a_hang_report_of_an_earlier_launch_does_not_make_a_crash_a_hang(tmp_path):
    run = tmp_path / "run"
    subprocess.run(["bash", "-c", _hang_report(run, "20200101T000000Z")], check=True)
    old = time.time() - 3600
    os.utime(run / "watchdog" / "20200101T000000Z" / "hang.json", (old, old))
    proc = _run(tmp_path, "2", exit_code=247, before_exit=_checkpoint(run, "step_5", "interval"))
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert HANG_LINE not in proc.stdout
