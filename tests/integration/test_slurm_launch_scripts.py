"""launch/slurm_hostfile.py (checked against DeepSpeed's own hostfile parser), the shell scripts' syntax and shellcheck."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL_SCRIPTS = sorted([*REPO.glob("slurm/*.sbatch"), *REPO.glob("slurm/*.sh"), *REPO.glob("launch/*.sh"),
                        *REPO.glob("bench/*.sh"), REPO / ".ci/slurm-cluster.sh", REPO / ".ci/run"])


def _load_hostfile_module():
    spec = importlib.util.spec_from_file_location("slurm_hostfile", REPO / "launch/slurm_hostfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load_hostfile_module()


@pytest.mark.parametrize("environ, slots", [
    ({"SLURM_GPUS_PER_NODE": "8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "a100:4", "SLURM_NTASKS_PER_NODE": "2"}, 4),
    ({"SLURM_GPUS_PER_NODE": "gpu:h100:2"}, 2),
    ({"SLURM_NTASKS_PER_NODE": "3"}, 3),
    ({}, 1),
])
def test_slots_from_env(environ, slots):
    assert H.slots_from_env(environ) == slots


@pytest.mark.parametrize("environ", [{"SLURM_GPUS_PER_NODE": "a100"}, {"SLURM_GPUS_PER_NODE": "0"}])
def test_slots_from_env_rejects(environ):
    with pytest.raises(ValueError, match="SLURM_GPUS_PER_NODE"):
        H.slots_from_env(environ)


def test_hostfile_parsed_by_deepspeed(tmp_path, monkeypatch):
    """The file DeepSpeed's runner reads back (deepspeed.launcher.runner.fetch_hostfile) has every node of
    the list, in order, with the slots asked for."""
    from deepspeed.launcher.runner import fetch_hostfile

    monkeypatch.setenv("PATH", str(tmp_path))  # the Python expander, whether or not Slurm is installed
    out = tmp_path / "hostfile"
    assert H.main(["--nodelist", "gpu[01-03,07],login5", "--slots", "8", "-o", str(out)]) == 0
    pool = fetch_hostfile(str(out))
    assert list(pool.items()) == [("gpu01", 8), ("gpu02", 8), ("gpu03", 8), ("gpu07", 8), ("login5", 8)]


def test_hostfile_errors(capsys):
    assert H.main(["--nodelist", "n[1-2", "--slots", "1"]) == 2
    assert "node list" in capsys.readouterr().err
    assert H.main(["--nodelist", "n[1-2],n1", "--slots", "1"]) == 2
    assert "twice" in capsys.readouterr().err
    assert H.main(["--nodelist", "n1", "--slots", "0"]) == 2


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (Debian package `shellcheck`; .ci/run installs it)")
def test_shellcheck():
    """Every launch/, slurm/, bench/ and .ci/ script passes shellcheck (warnings and style notes included); a line
    that is right as written carries a `# shellcheck disable=SCxxxx # why` directive."""
    proc = subprocess.run(["shellcheck", "--format=gcc", *map(str, SHELL_SCRIPTS)], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sbatch_directives_precede_commands():
    """sbatch stops reading #SBATCH lines at the first command: every directive must come before it."""
    for script in REPO.glob("slurm/*.sbatch"):
        lines = script.read_text().splitlines()
        first_command = next(i for i, line in enumerate(lines[1:], 1) if line.strip() and not line.startswith("#"))
        assert not [line for line in lines[first_command:] if line.startswith("#SBATCH")], script


@pytest.mark.integration
def test_hostfile_cli_runs_as_script(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "launch/slurm_hostfile.py"), "--nodelist", "n[1-2]",
                           "--slots", "2"], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "n1 slots=2\nn2 slots=2\n"


@pytest.mark.parametrize("command_exit, expected, says", [
    (137, 1, "a rank was killed by signal 9 (SIGKILL): the kernel's OOM killer (see dmesg), a kill -9, or srun "
             "ending a rank stuck after another failed (the first error above is the cause); exit 1 (srun exited 137)"),
    (247, 1, "a rank was killed by signal 9 (SIGKILL)"),  # DeepSpeed's launch.py: the rank's -9
    (130, 130, "SIGINT killed the ranks (a second one, or one during start-up): no checkpoint at the stop"),
    (75, 75, "training exited with status 75"), (74, 74, "training exited with status 74"),
    (1, 1, "training exited with status 1"),
    (77, 77, "training diverged (exit 77; rank 0's line above names the step and the healthy checkpoint): not "
             "requeued"),
])
def test_run_preemptible_maps_a_rank_killed_by_a_signal_to_a_documented_exit_code(command_exit, expected, says):
    """What the batch script exits with when srun's tasks end: albert-dist train's codes pass through; a task
    killed by a signal (srun: 128 + N) is not one of them: 1, naming the signal (130 for SIGINT)."""
    script = (f"MASTER_ADDR=127.0.0.1 SLURM_JOB_ID=1; source slurm/common.sh; "
              f"run_preemptible true -- bash -c 'exit {command_exit}'; echo \"rc=$?\"")
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert f"rc={expected}" in proc.stdout.splitlines()[-1], proc.stdout + proc.stderr
    assert says in proc.stdout, proc.stdout


@pytest.mark.parametrize("count, command_exit, expected, says", [
    (None, 137, 0, "crash requeue 1 of at most 3"),  # srun: the stopped rank's SIGKILL outranks the 76
    (None, 76, 0, "crash requeue 1 of at most 3"),
    ("1 3", 137, 76, "not requeueing: 3 crash requeue(s) of job 1 already"),
])
def test_run_preemptible_requeues_a_hang_a_bounded_number_of_times(tmp_path, count, command_exit, expected, says):
    """The ranks' watchdog wrote its report (<run dir>/watchdog/<job>/hang.json) and the live ranks exited 76; srun
    then SIGKILLed the stopped rank (its status 137). Not a crash: the line is repeated, exit 76, and the job is
    requeued as a crash is (`crash_requeue`: its `--resume auto` continues), at most ALBERT_MAX_CRASH_REQUEUES times
    (the count file `<job id> <count>`), then exit 76."""
    run, bin_dir = tmp_path / "run", tmp_path / "bin"
    bin_dir.mkdir()
    run.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "scontrol").chmod(0o755)
    events = [{"event": "start", "t": 1010.0, "step": 10, "begin_t": 1000.0, "launch_t": 1000.0, "load_s": 1.0},
              {"event": "interval", "t": 1020.0, "step": 13, "from_step": 10, "elapsed_s": 10.0, "phases": {}}]
    (run / "goodput.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))  # the attempt progressed
    if count is not None:
        (run / ".crash_requeues").write_text(count)
    line = "hang: no progress for over 300 s; 1 of 2 rank(s) stopped reporting: rank 1 (host n2, pid 7) at step 40"
    command = tmp_path / "train.sh"  # the training step: the watchdog's report, then srun's status
    command.write_text(f"mkdir -p {run}/watchdog/new\necho '{{\"line\": \"{line}\"}}' > {run}/watchdog/new/hang.json\n"
                       f"exit {command_exit}\n")
    script = (f"MASTER_ADDR=127.0.0.1 SLURM_JOB_ID=1 RUN_DIR={run} PYTHON={sys.executable}; source slurm/common.sh; "
              f"ALBERT_LAUNCH_TIME=1000.0; run_preemptible true -- bash {command}; echo \"rc=$?\"")
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert f"rc={expected}" in proc.stdout.splitlines()[-1], proc.stdout + proc.stderr
    assert line in proc.stdout and says in proc.stdout, proc.stdout
    requeued = (tmp_path / "scontrol.log").read_text() if (tmp_path / "scontrol.log").exists() else ""
    assert ("requeue 1" in requeued.splitlines()) == (expected == 0), requeued



@pytest.mark.parametrize("cause, expected, says", [
    ("store", 0, "exit 75: requeueing job 1 (store requeue 1 of at most 3; restart 1)"),
    (None, 0, "exit 75: requeueing job 1 (store requeue 1 of at most 3; restart 1)"),  # no checkpoint at the stop
    ("signal", 75, "training exited with status 75"),  # `scancel --signal=INT`: a stop asked for
])
def test_run_preemptible_requeues_the_ranks_own_75_of_a_store_outage_keeping_the_node(tmp_path, cause, expected, says):
    """The ranks exited 75 with no SIGUSR1 to the batch shell: their stop checkpoint records why (`stop_cause`).
    An object store that stayed unavailable (or no checkpoint at the stop, which only a store that never answered
    leaves) is requeued within ALBERT_MAX_CRASH_REQUEUES, the node kept (no `ExcNodeList`); a stop asked for with
    SIGINT is not. Before, every such 75 ended the job for a person to resubmit."""
    run, bin_dir = tmp_path / "run", tmp_path / "bin"
    bin_dir.mkdir()
    run.mkdir()
    out = tmp_path / "job.out"  # the job's output, where srun names a failed task's node (the crash path's pick)
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.log\n'
                                      f'[[ $1 == -o ]] && echo "JobId=1 StdOut={out}"\nexit 0\n')
    (bin_dir / "scontrol").chmod(0o755)
    events = [{"event": "start", "t": 1010.0, "step": 10, "begin_t": 1000.0, "launch_t": 1000.0, "load_s": 1.0},
              {"event": "interval", "t": 1020.0, "step": 13, "from_step": 10, "elapsed_s": 10.0, "phases": {}}]
    (run / "goodput.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))  # the attempt progressed
    command = tmp_path / "train.sh"  # the training step: srun's line, the ranks' stop checkpoint, then their 75
    meta = json.dumps({"step": 13, "reason": "stop", **({"stop_cause": cause} if cause else {})})
    command.write_text(f"echo 'srun: error: n2: task 1: Exited with exit code 75' >> {out}\n"
                       + (f"mkdir -p {run}/checkpoints/step_13\necho step_13 > {run}/checkpoints/latest\n"
                          f"echo '{meta}' > {run}/checkpoints/step_13/albert_dist.json\n" if cause else "") + "exit 75\n")
    script = (f"MASTER_ADDR=127.0.0.1 SLURM_JOB_ID=1 RUN_DIR={run} PYTHON={sys.executable}; source slurm/common.sh; "
              f"ALBERT_LAUNCH_TIME=1000.0; run_preemptible true -- bash {command}; echo \"rc=$?\"")
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert f"rc={expected}" in proc.stdout.splitlines()[-1], proc.stdout + proc.stderr
    assert says in proc.stdout, proc.stdout
    requeued = (tmp_path / "scontrol.log").read_text() if (tmp_path / "scontrol.log").exists() else ""
    assert ("requeue 1" in requeued.splitlines()) == (expected == 0), requeued
    assert "ExcNodeList" not in requeued and "node n2" not in proc.stdout, proc.stdout  # the store is no node's fault

# A stand-in `srun` records each call's argv (one file per call, one word a line); a training call writes the run's
# resolved config.yaml as the trainer would (what the cell's check reads), without the overrides FAKE_SRUN_DROP
# names (a run that trained another model).
FAKE_SRUN = r'''#!/bin/bash
n=$(find "$SRUN_LOG" -name '*.argv' | wc -l)
printf '%s\n' "$@" > "$SRUN_LOG/$n.argv"
[[ " $* " == *" train "* ]] || exit 0
exec "$PYTHON" - "$@" <<'PY'
import os, sys
from pathlib import Path
from albert_dist.config import load_config, to_yaml
argv = sys.argv[sys.argv.index("train") + 1:]
config, drop = argv[argv.index("--config") + 1], os.environ.get("FAKE_SRUN_DROP")
overrides = [a for a in argv if "=" in a and not a.startswith("-") and not (drop and a.startswith(drop))]
cfg = load_config(config, overrides)
Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
(Path(cfg.run_dir) / "config.yaml").write_text(to_yaml(cfg))
PY
'''


def _batch_job(tmp_path: Path, script: str, *args: str, **environ: str) -> tuple[subprocess.CompletedProcess, list]:
    """slurm/<script> as (array task 1 of) job 78 in a scratch checkout (links to the package, configs and bench),
    under a fake Slurm: the batch shell's variables (tests/fixtures/slurm_env.py, without SLURM_STEP_ID) and the
    stand-in `srun`. Returns the job and the argv of each srun call, in order."""
    from tests.fixtures.slurm_env import slurm_step

    checkout, bin_dir, log = tmp_path / "checkout", tmp_path / "bin", tmp_path / "srun-calls"
    for d in (checkout / "slurm", bin_dir, log):
        d.mkdir(parents=True)
    for name in ("common.sh", script):
        shutil.copy(REPO / "slurm" / name, checkout / "slurm")
    for name in ("albert_dist", "configs", "bench", "launch"):
        (checkout / name).symlink_to(REPO / name)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {k: v for k, v in slurm_step(0, 0, 0, ntasks=1, nodelist="n1", tasks_per_node="1", job_id="78").items()
           if k != "SLURM_STEP_ID"}
    env.update(SLURM_ARRAY_JOB_ID="77", SLURM_ARRAY_TASK_ID="1", SLURM_JOB_NAME="albert", MASTER_ADDR="127.0.0.1",
               GLUE_DIR=str(tmp_path), PYTHON=sys.executable, SRUN_LOG=str(log), HOME=str(tmp_path),
               PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", **environ)
    proc = subprocess.run(["bash", f"slurm/{script}", *args], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=120)
    calls = [(log / f"{i}.argv").read_text().splitlines() for i in range(len(list(log.iterdir())))]
    return proc, calls


def _sharing_study_job(tmp_path: Path, study_args: str, drop: str = "") -> tuple[subprocess.CompletedProcess, list]:
    """slurm/sharing_study.sbatch as array task 1 (ffn) of array job 77 (`_batch_job`)."""
    return _batch_job(tmp_path, "sharing_study.sbatch", ALBERT_STUDY_ARGS=study_args, FAKE_SRUN_DROP=drop)


@pytest.mark.integration
@pytest.mark.parametrize("study_args", ["--stepz 10", "--steps 10 --finetune-args '--epochs 1", "--modes all",
                                        "--steps 10 max_steps=oops"])
def test_the_sharing_study_job_with_flags_that_do_not_parse_trains_nothing(tmp_path, study_args):
    """The issue's job array: ALBERT_STUDY_ARGS was word-split, `sharing_study.py overrides` exited 2 inside an
    unchecked `mapfile < <(...)`, and every task trained the recipe's default model under its cell's name. Now a
    flag that does not parse (or an override the config refuses) ends the job before any srun."""
    proc, calls = _sharing_study_job(tmp_path, study_args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert calls == [] and not (tmp_path / "checkout/runs").exists(), calls


@pytest.mark.integration
def test_the_sharing_study_job_hands_srun_the_cells_overrides_and_checks_its_run(tmp_path):
    """Good flags, a quoted multi-word value among them: the cell's overrides reach the training srun, the
    fine-tune srun gets the flags as one string (split by the study as a shell would), and the run is checked
    to be the cell's model before it is fine-tuned."""
    study_args = "--steps 10 --layers 2 --finetune-args '--max-train-samples 200 --epochs 1'"
    proc, calls = _sharing_study_job(tmp_path, study_args)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    train, finetune = calls
    run_dir = tmp_path / "checkout/runs/sharing-77/ffn"
    assert train[train.index("--config") + 1:train.index("--config") + 5] == [
        "configs/pretrain/albert-tiny-wikitext2.yaml", "--resume", "auto", f"run_dir={run_dir}"]
    assert {"model.sharing=ffn", "max_steps=10", "model.num_hidden_layers=2", "model.num_hidden_groups=1"} <= set(train)
    assert finetune[2:] == [sys.executable, "bench/downstream/sharing_study.py", "--modes", "ffn", "--out",
                            "runs/sharing-77", f"--args={study_args}", "finetune", "--glue-dir", str(tmp_path)]
    assert "ffn: runs/sharing-77/ffn has what the cell asked for" in proc.stdout


@pytest.mark.integration
def test_a_sharing_study_cell_that_trained_another_model_fails_before_fine_tuning(tmp_path):
    proc, calls = _sharing_study_job(tmp_path, "--steps 10", drop="model.sharing=")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert len(calls) == 1 and "model.sharing is 'all', the cell asked for 'ffn'" in proc.stderr, proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("script, how", [("pretrain.sbatch", "argument"), ("pretrain.sbatch", "recipe"),
                                         ("deepspeed.sbatch", "argument")])
def test_a_batch_job_runs_in_the_run_directory_its_ranks_use(tmp_path, script, how):
    """`sbatch slurm/pretrain.sbatch run_dir=X` trained in X, but the batch shell named runs/slurm-<job id> in its
    log (slurm/deepspeed.sbatch wrote its hostfile there), and a recipe's run_dir was overridden. Now the run
    directory is the one the ranks resolve (run_dir= argument > ALBERT_RUN_DIR > recipe > runs/slurm-<job id>)."""
    chosen = tmp_path / "chosen"
    args, environ = [f"run_dir={chosen}", "max_steps=3"], {"ALBERT_RUN_DIR": str(tmp_path / "env-dir")}
    if how == "recipe":
        recipe = tmp_path / "mine.yaml"
        recipe.write_text((REPO / "configs/pretrain/albert-tiny-wikitext.yaml").read_text() + f"\nrun_dir: {chosen}\n")
        args, environ = ["max_steps=3"], {"ALBERT_CONFIG": str(recipe)}
    # deepspeed.sbatch's nossh mode: one srun of per-node launchers, the stand-in's to record
    environ.update(ALBERT_SLURM_CPU="1", ALBERT_DS_LAUNCHER="nossh", ALBERT_DIST="albert-dist")
    proc, calls = _batch_job(tmp_path, script, *args, **environ)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    train = calls[-1]
    assert [a for a in train if a.startswith("run_dir=")][-1] == f"run_dir={chosen}" and f"run dir {chosen};" in proc.stdout
    assert (chosen / "config.yaml").is_file() and not (tmp_path / "checkout/runs").exists()
    assert (chosen / "hostfile").is_file() == (script == "deepspeed.sbatch")


@pytest.mark.integration
def test_a_deepspeed_batch_job_whose_port_cannot_be_derived_starts_nothing(tmp_path):
    """`export MASTER_PORT=$(...)` hid the failure of the command inside it (export's own status is 0): the job
    went on to launch with an empty port. Now a step that builds the launch command and fails ends the job."""
    proc, calls = _batch_job(tmp_path, "deepspeed.sbatch", "max_steps=3", SLURM_JOB_ID="not-a-number",
                             ALBERT_SLURM_CPU="1", ALBERT_DS_LAUNCHER="nossh", ALBERT_DIST="albert-dist")
    assert proc.returncode != 0 and calls == [], (proc.stdout, proc.stderr)
    assert "invalid literal for int()" in proc.stderr and "hostfile" not in proc.stdout
