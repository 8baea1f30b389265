"""Checkpoint/resume of the real trainer on 1, 2 and 4 gloo ranks (CPU, fp32, ZeRO-2, 1 thread per rank).

* a rank crashes inside a save and the other is killed with SIGKILL: `latest` still names the previous
  checkpoint; `--resume auto` loads it and the loss trajectory equals the uninterrupted run's, step for step.
* 2 -> 1 and 2 -> 4 ranks through DeepSpeed's universal checkpoint: fp32 parameters and both Adam moments equal
  those of the 2-rank run (gathered by DeepSpeed's safe_get_full_* on each side); training continues and the
  data loaders follow albert_dist.engine.checkpoint.reshard (no repeats: tested batch for batch in tests/unit/test_reshard).
* SIGUSR1 on one rank: all ranks stop after the same step, checkpoint it, and exit with EXIT_PREEMPTED.
The e2e test (tests/e2e/test_deepspeed_launcher.py) adds a SIGTERM mid-run through the real launcher.
"""
from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import clean_env, read_metrics, run_cli

from albert_dist.engine.checkpoint.layout import read_latest
from albert_dist.engine.checkpoint.choose import choose_checkpoint
from albert_dist.engine.checkpoint.state import CLIENT_KEY
from albert_dist.engine.checkpoint.reshard import RESHARDED_KEY
from albert_dist.engine import metric_names as names
from fixtures.ranks import CONFIG, Job, run_ok

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
CRASH_EXIT = 17
MAX_STEPS = 8

def train_records(run_dir: Path) -> dict[int, dict]:
    records = {}
    for rec in read_metrics(run_dir, names.TRAIN_LOSS):
        assert rec["step"] not in records, f"step {rec['step']} logged twice"
        records[rec["step"]] = rec
    return records


TRAJECTORY_KEYS = (*(names.TRAIN + q for q in names.EVAL_QUANTITIES), names.TRAIN_GRAD_NORM, names.TRAIN_LR)


def assert_same_trajectory(got: dict[int, dict], want: dict[int, dict]) -> None:
    assert sorted(got) == sorted(want) == list(range(1, MAX_STEPS + 1))
    for step in want:
        for k in TRAJECTORY_KEYS:
            assert got[step][k] == want[step][k], f"step {step} {k}: {got[step][k]} != {want[step][k]}"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory):
    """The uninterrupted 2-rank run: 8 steps, checkpoints at 3, 6, 8; full state dumped at the end."""
    root = tmp_path_factory.mktemp("ref")
    dump = root / "end.pt"
    job = run_ok(2, config, root / "run", ["--dump", str(dump), "--dump-at-end"])
    records = train_records(job.run_dir)
    assert records[MAX_STEPS][names.TRAIN_LOSS] < records[1][names.TRAIN_LOSS]
    return job.run_dir, records, torch.load(dump, weights_only=False)


def test_crash_in_save_and_kill9_then_resume_reproduces_the_trajectory(config, reference, tmp_path):
    """Rank 1 dies inside the save of step 6 (after DeepSpeed wrote its files, before the ranks agreed the
    checkpoint is complete); rank 0, waiting for it, is killed with SIGKILL, as a launcher does. `latest` still
    names step_3, which loads, and the resumed run reproduces the uninterrupted trajectory exactly."""
    _, want, _ = reference
    run_dir = tmp_path / "run"
    ckpt_dir = run_dir / "checkpoints"
    job = Job(2, config, run_dir, ["--crash-save-step", "6", "--crash-rank", "1"])
    assert job.procs[1].wait(timeout=240) == CRASH_EXIT, job.log_tail()
    time.sleep(1.0)
    assert job.procs[0].poll() is None  # rank 0 waits for the dead rank
    job.kill()  # kill -9
    assert job.procs[0].returncode == -signal.SIGKILL
    assert (ckpt_dir / "step_6").is_dir() and read_latest(ckpt_dir) == "step_3"
    point = choose_checkpoint("auto", ckpt_dir)
    assert (point.tag, point.step, point.world_size) == ("step_3", 3, 2)
    run_ok(2, config, run_dir, [], ["checkpoint.resume=auto"])
    # Steps 4 and 5 were logged by the killed run and again after the resume: the file keeps one record each.
    assert_same_trajectory(train_records(run_dir), want)
    assert read_latest(ckpt_dir) == "step_8"
    assert sorted(p.name for p in ckpt_dir.glob("step_*")) == ["step_3", "step_6", "step_8"]


def test_a_resume_between_log_steps_logs_the_uninterrupted_window(config, tmp_path):
    """Logged every 2 steps, checkpointed at 3: the save of step 4 crashes (rank 1 dies, rank 0 is killed), the
    job resumes from step_3, between two log steps. Its step-4 record covers steps 3 and 4, as the uninterrupted
    job's does, because the checkpoint holds every rank's open metric interval: equal to the last bit."""
    window = ["log_interval_steps=2", "max_steps=4"]
    want = train_records(run_ok(2, config, tmp_path / "ref", [], window).run_dir)
    run_dir = tmp_path / "run"
    job = Job(2, config, run_dir, ["--crash-save-step", "4", "--crash-rank", "1"], window)
    assert job.procs[1].wait(timeout=240) == CRASH_EXIT, job.log_tail()
    job.kill()
    assert read_latest(run_dir / "checkpoints") == "step_3"
    run_ok(2, config, run_dir, [], [*window, "checkpoint.resume=auto"])
    got = train_records(run_dir)
    assert sorted(got) == sorted(want) == [2, 4]
    for k in TRAJECTORY_KEYS:
        assert got[4][k] == want[4][k], f"step 4 {k}: {got[4][k]} != {want[4][k]}"


@pytest.mark.parametrize("world", [1, 4])
def test_universal_resume_on_another_world_size(config, reference, tmp_path, world):
    ref_dir, _, ref = reference
    dump = tmp_path / "loaded.pt"
    run_dir = tmp_path / "run"
    # Resume from the 2-rank step_8 checkpoint and train one more step (max_steps 9).
    run_ok(world, config, run_dir, ["--dump", str(dump)],
           [f"checkpoint.resume={ref_dir / 'checkpoints' / 'step_8'}", "max_steps=9"])
    got = torch.load(dump, weights_only=False)
    assert got["step"] == ref["step"] == MAX_STEPS
    assert got["params"].keys() == ref["params"].keys()
    for name, (param, exp_avg, exp_avg_sq) in ref["params"].items():
        g_param, g_avg, g_avg_sq = got["params"][name]
        assert torch.equal(g_param, param), name
        assert torch.equal(g_avg, exp_avg), name
        assert torch.equal(g_avg_sq, exp_avg_sq), name
        assert exp_avg_sq.abs().sum() > 0, name  # the moments are real, not freshly initialised
    # Training went on, with the data streams of the 2 old ranks mapped onto the new ranks.
    records = train_records(run_dir)
    assert list(records) == [MAX_STEPS + 1] and math.isfinite(records[MAX_STEPS + 1][names.TRAIN_LOSS])
    saved = torch.load(run_dir / "checkpoints" / "step_9" / "mp_rank_00_model_states.pt", weights_only=False)
    state = saved[CLIENT_KEY]
    assert state["world_size"] == world and len(state["data_states"]) == world
    for rank, data_state in enumerate(state["data_states"]):
        assert data_state[RESHARDED_KEY]
        members = [(m["rank"], m["world"], m["stride"], m["offset"], m["taken"]) for m in data_state["members"]]
        if world == 1:  # both old streams, alternately: GA 2 -> one batch from each
            assert members == [(0, 2, 1, 0, 1), (1, 2, 1, 0, 1)]
        else:  # old stream rank % 2 shared by 2 new ranks, 2 batches taken each
            assert members == [(rank % 2, 2, 2, rank // 2, 2)]
    assert len(list((run_dir / "checkpoints" / "step_9").glob("*optim_states.pt"))) == world


def test_signal_on_one_rank_stops_all_at_the_same_step_with_a_checkpoint(config, tmp_path):
    """SIGUSR1 reaching only rank 1 (signals arrive at ranks at different times): both ranks stop after the same
    step, checkpoint it and exit with EXIT_PREEMPTED."""
    from albert_dist.exit_codes import EXIT_PREEMPTED

    run_dir = tmp_path / "run"
    job = Job(2, config, run_dir, [], ["max_steps=200", "checkpoint.save_interval_steps=0"])
    deadline = time.time() + 240
    while not any(r["step"] >= 2 for r in read_metrics(run_dir)):
        assert all(p.poll() is None for p in job.procs), job.log_tail()
        assert time.time() < deadline
        time.sleep(0.2)
    job.procs[1].send_signal(signal.SIGUSR1)
    codes = job.wait(timeout=120)
    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED], job.log_tail()
    last = max(train_records(run_dir))
    assert 2 <= last < 200
    assert read_latest(run_dir / "checkpoints") == f"step_{last}"
    assert choose_checkpoint("auto", run_dir / "checkpoints").step == last


# ------------------------------------------------------------------------------ robustness (issue 13)
def _copy_checkpoints(reference, run_dir: Path) -> Path:
    ref_dir, _, _ = reference
    shutil.copytree(ref_dir / "checkpoints", run_dir / "checkpoints")
    return run_dir / "checkpoints"


def _log_lines(job: Job, needle: str) -> list[str]:
    return [line for log in job.logs for line in Path(log.name).read_text(errors="replace").splitlines()
            if needle in line]


# A truncated newest checkpoint and a `latest` naming a missing step are rules of `plan.choose_checkpoint`, tested
# in tests/unit/test_checkpoint_manager.py; the trainer's `--resume auto` goes through that plan (tested above:
# test_crash_in_save_and_kill9_then_resume_reproduces_the_trajectory, which also re-saves over a broken step).


def test_disk_full_during_a_save_keeps_latest_removes_the_partial_checkpoint_and_exits_74(config, tmp_path):
    """OSError(ENOSPC) injected into DeepSpeed's writer on rank 1 in the save of step 6 (after it wrote a few
    bytes): both ranks exit EXIT_SAVE_FAILED with one line naming the file and the errno, step_6 is gone and
    `latest` still names step_3."""
    from albert_dist.exit_codes import EXIT_SAVE_FAILED

    run_dir = tmp_path / "run"
    job = Job(2, config, run_dir, ["--run", "--enospc-step", "6", "--enospc-rank", "1"])
    codes = job.wait()
    assert codes == [EXIT_SAVE_FAILED, EXIT_SAVE_FAILED], job.log_tail()
    ckpt_dir = run_dir / "checkpoints"
    assert read_latest(ckpt_dir) == "step_3" and not (ckpt_dir / "step_6").exists()
    assert choose_checkpoint("auto", ckpt_dir).tag == "step_3"
    path = ckpt_dir / "step_6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    lines = _log_lines(job, "disk full writing")
    assert len(lines) == 2, lines  # one per rank, no traceback
    assert all(f"disk full writing {path} (errno 28 ENOSPC" in line and "still names step_3" in line for line in lines)
    assert not _log_lines(job, "Traceback")


def test_disk_full_with_on_save_error_continue_trains_on_and_saves_at_the_next_interval(config, tmp_path):
    run_dir = tmp_path / "run"
    job = run_ok(1, config, run_dir, ["--run", "--enospc-step", "3"], ["checkpoint.on_save_error=continue"])
    ckpt_dir = run_dir / "checkpoints"
    assert sorted(train_records(run_dir)) == list(range(1, MAX_STEPS + 1))
    assert sorted(p.name for p in ckpt_dir.glob("step_*")) == ["step_6", "step_8"]
    assert read_latest(ckpt_dir) == "step_8"
    assert len(_log_lines(job, "training continues (checkpoint.on_save_error=continue)")) == 1


# ----------------------------------------------------------------------------- disk headroom (issue 20)
@pytest.fixture
def tmpfs(tmp_path):
    """A real, small file system: a tmpfs mounted at tmp_path/fs (needs root, as CI's runner is); `size(bytes)`
    mounts it. Skips when it cannot mount."""
    mounted = []

    def size(n: int) -> Path:
        where = tmp_path / "fs"
        where.mkdir(exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={n}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    yield size
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_disk_full_retention_makes_room_before_the_save_and_the_message_gives_the_space_needed(config, tmpfs,
                                                                                             tmp_path):
    """The issue's 40 MB tmpfs, scaled to this model: a file system holding two checkpoints but not three.
    keep_last=2 used to need room for keep_last + 1 checkpoints (exit 74 at the third save); now the oldest goes
    before the save. A lowered keep_last applies when the job resumes (before its first save). With no room even
    for one checkpoint, the save fails with exit 74 and the message says how much a checkpoint needs. The small
    file system holds the checkpoints only (`checkpoint.dir`), not the run's final model and logs."""
    from albert_dist.engine.checkpoint import retention
    from albert_dist.exit_codes import EXIT_SAVE_FAILED

    ckpt_size = 2.5 * 2**20  # the tiny config's checkpoint on one rank (2.4-2.5 MiB)
    fs = tmpfs(int(2.6 * ckpt_size))
    run_dir, ckpt_dir = tmp_path / "run", fs / "checkpoints"
    steps = ["checkpoint.save_interval_steps=2", f"checkpoint.dir={ckpt_dir}", "checkpoint.keep_last=2"]
    first = run_ok(1, config, run_dir, ["--run"], steps + ["max_steps=6"])
    assert sorted(p.name for p in ckpt_dir.glob("step_*")) == ["step_4", "step_6"]
    made_room = _log_lines(first, "before saving")
    assert len(made_room) == 1 and "removed step_2 before saving" in made_room[0], made_room
    size = retention.checkpoint_bytes(ckpt_dir / "step_6")
    assert 2.2 * 2**20 < size < 2.7 * 2**20, size

    second = run_ok(1, config, run_dir, ["--run"], steps[:2] + ["checkpoint.keep_last=1", "max_steps=8",
                                                                "checkpoint.resume=auto"])
    log = Path(second.logs[0].name).read_text()
    assert log.index("retention (keep_last=1): removed step_4") < log.index("resumed from"), log[-3000:]
    assert sorted(p.name for p in ckpt_dir.glob("step_*")) == ["step_8"]

    ballast = retention.free_bytes(fs) - 2**20  # leave 1 MiB: not even room for one more checkpoint
    (fs / "ballast").write_bytes(b"\0" * ballast)
    third = Job(1, config, run_dir, ["--run"], steps[:2] + ["max_steps=10", "checkpoint.resume=auto"])
    assert third.wait() == [EXIT_SAVE_FAILED], third.log_tail()
    lines = _log_lines(third, "not saved: disk full writing")
    assert len(lines) == 1 and "errno 28 ENOSPC" in lines[0] and "still names step_8" in lines[0], lines
    needed = float(lines[0].split("a checkpoint of this job needs about ")[1].split(" MiB")[0])
    assert needed == pytest.approx(size / 2**20, abs=0.05), lines[0]
    assert f"(step_8 took {needed:.1f} MiB)" in lines[0], lines[0]
    free = float(re.search(r"([\d.]+) MiB were free in ", lines[0]).group(1))
    assert 0.5 < free <= 1.0, lines[0]
    assert _log_lines(third, "this save will probably fail (kept: step_8)")
    assert read_latest(ckpt_dir) == "step_8" and not (ckpt_dir / "step_10").exists()


def test_resume_with_another_model_config_is_exit_2_before_any_process_group(config, reference, tmp_path):
    ref_dir, _, _ = reference
    run_dir = tmp_path / "never"
    step_8 = ref_dir / "checkpoints" / "step_8"
    proc = run_cli("train", "--config", str(config), "--resume", str(step_8), f"run_dir={run_dir}",
                   "model.sharing=none", "model.hidden_size=48", env=clean_env(CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"checkpoint {step_8} has model.hidden_size=32, the config has model.hidden_size=48; " \
           f"model.sharing='all', the config has model.sharing='none'" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_resume_with_a_larger_max_steps_follows_the_new_schedule_from_the_saved_step(config, reference, tmp_path):
    """The LR rule: after resuming step 8 of an 8-step run with max_steps=12, step s runs at
    lr * lr_factor(s - 1, warmup, 12) (DeepSpeed alone ran step 9 at the old schedule's end, lr 0.0)."""
    from albert_dist.engine.optim import lr_factor

    ref_dir, _, _ = reference
    run_dir = tmp_path / "run"
    job = run_ok(2, config, run_dir, [], [f"checkpoint.resume={ref_dir / 'checkpoints' / 'step_8'}", "max_steps=12"])
    records = train_records(run_dir)
    assert sorted(records) == [9, 10, 11, 12]
    for step, rec in records.items():
        assert rec[names.TRAIN_LR] == pytest.approx(0.003 * lr_factor(step - 1, 2, 12), rel=1e-12, abs=0), step
    assert records[9][names.TRAIN_LR] > 0
    assert _log_lines(job, "max_steps changed (8 -> 12): the run trains on to the new max_steps")


def test_zero3_three_groups_consolidated_as_safetensors_and_pickle_export_to_transformers(config, tmp_path):
    """A 2-rank ZeRO-3 run with 3 layer groups -> `albert-dist export step_2 --fp32 X` (DeepSpeed's
    get_fp32_state_dict_from_zero_checkpoint; X as safetensors and as pickle) -> export X again -> transformers
    loads both with no missing or unexpected key, decoder == word embeddings, logits = the live model's."""
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    from albert_dist.model import AlbertForPreTraining
    from albert_dist.cli import main
    from albert_dist.config import load_model_config
    from albert_dist.runs.weights import load_state_dict

    run_dir, dump = tmp_path / "run", tmp_path / "live.pt"
    run_ok(2, config, run_dir, ["--dump", str(dump), "--dump-at-end"],
           ["engine.zero_stage=3", "model.num_hidden_groups=3", "max_steps=2", "checkpoint.save_interval_steps=0"])
    live_params = {name: p for name, (p, _, _) in torch.load(dump, weights_only=False)["params"].items()}
    model_cfg = load_model_config(run_dir / "config.yaml")
    assert model_cfg.num_hidden_groups == 3
    live = AlbertForPreTraining(model_cfg).eval()
    missing, unexpected = live.load_state_dict(live_params, strict=False)
    assert missing == ["predictions.decoder.weight"] and not unexpected  # tied: one parameter, one name

    ids = torch.randint(5, model_cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    with torch.no_grad():
        want_mlm, want_sop = live.logits(ids, mask, types)
    step_2 = run_dir / "checkpoints" / "step_2"
    for fmt in ("safetensors", "pt"):
        fp32 = tmp_path / f"fp32.{fmt}"
        for source, out in ((step_2, tmp_path / f"hf_ds_{fmt}"), (fp32, tmp_path / f"hf_{fmt}")):
            args = [str(source), "--config", str(run_dir / "config.yaml"), "--output", str(out)]
            assert main(["export", *args, *(["--fp32", str(fp32)] if source == step_2 else [])]) == 0
            hf, info = transformers.AlbertForPreTraining.from_pretrained(out, output_loading_info=True)
            assert not info["missing_keys"] and not info["unexpected_keys"], (fmt, info)
            hf.eval()
            assert torch.equal(hf.predictions.decoder.weight, hf.albert.embeddings.word_embeddings.weight)
            with torch.no_grad():
                got = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
            torch.testing.assert_close(got.prediction_logits, want_mlm, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got.sop_logits, want_sop, rtol=1e-5, atol=1e-5)
        consolidated = load_state_dict(fp32)
        for name, param in live_params.items():
            assert torch.equal(consolidated[name], param), (fmt, name)  # every group, bit for bit
        assert any(".albert_layer_groups.2." in n for n in consolidated)
    with safe_open(str(tmp_path / "fp32.safetensors"), "pt") as f:
        assert "predictions.decoder.weight" not in set(f.keys())  # the alias safetensors cannot store


# ------------------------------------------------------------- what a config change means on resume (issue 21)
def test_resume_with_a_new_lr_uses_it_from_the_next_step(config, reference, tmp_path):
    """optimizer.lr 0.003 -> 0.006 at step_6 (the table: "applies"): steps 7 and 8 log twice the reference's lr;
    step 7's loss equals the reference's (same weights, data and RNG), step 8's does not (step 7's update used
    the new lr; before the fix the checkpoint's peak lr was kept and both steps were bit-identical)."""
    ref_dir, want, _ = reference
    run_dir = tmp_path / "run"
    job = run_ok(2, config, run_dir, [], [f"checkpoint.resume={ref_dir / 'checkpoints' / 'step_6'}",
                                         "optimizer.lr=0.006"])
    got = train_records(run_dir)
    assert sorted(got) == [7, 8]
    for step in (7, 8):
        assert got[step][names.TRAIN_LR] == pytest.approx(2 * want[step][names.TRAIN_LR], rel=1e-12, abs=0), step
    assert got[7][names.TRAIN_LOSS] == want[7][names.TRAIN_LOSS]
    assert got[8][names.TRAIN_LOSS] != want[8][names.TRAIN_LOSS]
    assert _log_lines(job, "optimizer.lr changed (0.003 -> 0.006): the run uses the new peak lr from the next step")
    assert not _log_lines(job, "Traceback")


def test_resume_converting_the_partition_layout_and_restarting_the_streams(config, reference, tmp_path):
    """step_8 resumed on the same 2 ranks with engine.zero_optimization.round_robin_gradients set ("convert": another
    ZeRO-2 partition layout) and data.whole_word_masking flipped ("restart_streams": before, the loader raised its
    fingerprint ValueError and the job hung): the checkpoint goes through DeepSpeed's universal checkpoint, the
    parameters and both Adam moments load exactly, the streams restart and say so, the job trains on."""
    _, _, ref = reference
    run_dir, dump = tmp_path / "run", tmp_path / "loaded.pt"
    ckpt_dir = _copy_checkpoints(reference, tmp_path / "copy")
    shutil.rmtree(ckpt_dir / "step_8_universal", ignore_errors=True)  # another test may have converted it
    job = run_ok(2, config, run_dir, ["--dump", str(dump)],
                 [f"checkpoint.resume={ckpt_dir / 'step_8'}", "max_steps=9",
                  "engine.zero_optimization.round_robin_gradients=true", "data.whole_word_masking=false"])
    got = torch.load(dump, weights_only=False)
    assert got["step"] == ref["step"] == MAX_STEPS
    for name, tensors in ref["params"].items():
        for what, g, w in zip(("param", "exp_avg", "exp_avg_sq"), got["params"][name], tensors):
            assert torch.equal(g, w), f"{name} {what}"
    assert _log_lines(job, "round_robin_gradients changed (None -> True): the run converts the checkpoint with "
                           "DeepSpeed's universal-checkpoint tool")
    assert _log_lines(job, f"resumed from {ckpt_dir}/step_8_universal at step 8")
    assert _log_lines(job, "the data streams restart from the corpus start because data.whole_word_masking changed "
                           "(True -> False)")
    assert list(train_records(run_dir)) == [MAX_STEPS + 1] and not _log_lines(job, "Traceback")


def test_export_of_a_run_directory_needs_neither_config_nor_tokenizer(reference, tmp_path):
    """`albert-dist export RUN_DIR`: the newest verified checkpoint (step_8), its config from albert_dist.json, the
    run's tokenizer; transformers loads the result with the run's final weights."""
    transformers = pytest.importorskip("transformers")
    from albert_dist.cli import main

    ref_dir, _, ref = reference
    out = tmp_path / "hf"
    assert main(["export", str(ref_dir), "--output", str(out)]) == 0
    assert (out / "spiece.model").read_bytes() == (REPO / "data/sample/spiece.model").read_bytes()
    hf = transformers.AlbertForPreTraining.from_pretrained(out)
    name = "albert.embeddings.word_embeddings.weight"
    assert torch.equal(dict(hf.named_parameters())[name].detach(), ref["params"][name][0])
