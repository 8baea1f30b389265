"""Divergence on the real trainer, 2 gloo ranks, the tiny job of tests/fixtures/ranks.py through the app's main
(`albert_dist.apps.pretrain.main.main`: its exit codes), as issue 43 measured it on the quickstart recipe.

* stop: 8 healthy steps, then ``--resume auto optimizer.lr=10000``: the loss of step 10 (the first forward on the
  weights step 9's update made) is ~1e9; the job exits 77 with one line naming the step and the healthy
  checkpoint; step_9 (saved before its weights were measured) is renamed step_9_diverged, `latest` = step_8,
  which ``keep_last=1`` retention kept, and no final model is written.
* rollback: ``ALBERT_INJECT_NONFINITE_STEP=5`` poisons step 5; the job rolls back once to step_3 (step_4's weights
  led to the flagged step: quarantined), skips the data of steps 4-5, finishes with exit 0 and ``train/rollbacks``
  = 1; its final weights equal, bit for bit, those of an independent run: the healthy run's step_3 with the loader
  cursor of its step_5 spliced in, resumed to the end.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import read_metrics

from albert_dist.engine import metric_names as names
from albert_dist.engine.checkpoint.layout import read_latest, verify, write_latest
from albert_dist.engine.checkpoint.state import CLIENT_KEY
from albert_dist.engine.divergence import INJECT_ENV, stream_batches
from albert_dist.exit_codes import EXIT_DIVERGED
from fixtures.ranks import CONFIG, Job, run_ok

pytestmark = pytest.mark.distributed

MODEL_STATES = "mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(CONFIG)
    return path


def run(config: Path, run_dir: Path, overrides: list[str]) -> tuple[list[int], Job]:
    job = Job(2, config, run_dir, ["--run"], overrides)
    return job.wait(), job


def test_lr_1e4_after_healthy_steps_stops_with_77_and_latest_is_the_last_healthy_checkpoint(config, tmp_path):
    run_dir = tmp_path / "run"
    run_ok(2, config, run_dir, ["--run"])  # 8 healthy steps: step_3, step_6, step_8 and a final model
    shutil.rmtree(run_dir / "final_model")
    codes, job = run(config, run_dir, ["checkpoint.resume=auto", "optimizer.lr=10000", "max_steps=30",
                                       "checkpoint.keep_last=1", "divergence.policy=stop",
                                       "divergence.spike_window_steps=8"])
    log = job.log_tail()
    assert codes == [EXIT_DIVERGED] * 2, f"exit codes {codes}\n{log}"
    ckpt = run_dir / "checkpoints"
    assert ("training diverged at step 10: a loss spike" in log
            and f"the newest healthy checkpoint is {ckpt / 'step_8'} (latest names it" in log), log
    assert log.count("training diverged at step") == 1  # rank 0's one line
    assert read_latest(ckpt) == "step_8" and verify(ckpt / "step_8") is None
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["step_8", "step_9_diverged"]
    assert not (run_dir / "final_model").exists()


def final_module(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "step_8" / MODEL_STATES, weights_only=False)["module"]


def test_a_poisoned_step_rolls_back_once_skips_its_window_and_equals_a_run_that_skips_it(config, tmp_path,
                                                                                       monkeypatch):
    every_step = ["checkpoint.save_interval_steps=1", "checkpoint.keep_last=10", "data.num_workers=0"]
    # the healthy run: checkpoints at every step
    healthy = tmp_path / "healthy"
    run_ok(2, config, healthy, ["--run"], every_step)
    # the rolled-back run
    rolled = tmp_path / "rolled"
    monkeypatch.setenv(INJECT_ENV, "5")
    codes, job = run(config, rolled, every_step)
    monkeypatch.delenv(INJECT_ENV)
    assert codes == [0, 0], f"exit codes {codes}\n{job.log_tail()}"
    rollbacks = read_metrics(rolled, names.TRAIN_ROLLBACKS)
    assert [(r["step"], r[names.TRAIN_ROLLBACKS], r[names.TRAIN_ROLLBACK_FROM_STEP]) for r in rollbacks] == [(3, 1, 5)]
    ga = 2  # micro-batches per step and rank (tests/fixtures/ranks.py)
    assert (rollbacks[0][names.TRAIN_ROLLBACK_SKIPPED_FIRST], rollbacks[0][names.TRAIN_ROLLBACK_SKIPPED_LAST]) == \
        (3 * ga + 1, 5 * ga)  # steps 4-5's micro-batches
    assert (rolled / "checkpoints" / "step_4_diverged").is_dir()  # its weights gave the poisoned loss: quarantined
    # the loader's cursor at the end: 8 steps trained on, the 2 skipped steps' batches never again
    final_state = torch.load(rolled / "checkpoints" / "step_8" / MODEL_STATES, weights_only=False)[CLIENT_KEY]
    assert [stream_batches(s) for s in final_state["data_states"]] == [(8 + 2) * ga] * 2
    # the independent reference: healthy step_3's weights, optimiser and RNGs with step_5's data cursor, resumed
    ref = tmp_path / "ref"
    (ref / "checkpoints").mkdir(parents=True)
    shutil.copytree(healthy / "checkpoints" / "step_3", ref / "checkpoints" / "step_3")
    states = torch.load(ref / "checkpoints" / "step_3" / MODEL_STATES, weights_only=False)
    later = torch.load(healthy / "checkpoints" / "step_5" / MODEL_STATES, weights_only=False)[CLIENT_KEY]
    states[CLIENT_KEY]["data_states"] = later["data_states"]
    size = (ref / "checkpoints" / "step_3" / MODEL_STATES).stat().st_size
    torch.save(states, ref / "checkpoints" / "step_3" / MODEL_STATES)
    meta = ref / "checkpoints" / "step_3" / "albert_dist.json"  # the file list's size of the rewritten file
    meta.write_text(meta.read_text().replace(f'"{MODEL_STATES}": {size}',
                                             f'"{MODEL_STATES}": {(ref / "checkpoints" / "step_3" / MODEL_STATES).stat().st_size}'))
    write_latest(ref / "checkpoints", "step_3")
    run_ok(2, config, ref, ["--run"], [*every_step, "checkpoint.resume=auto"])
    got, want = final_module(rolled), final_module(ref)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    # and not the healthy run's: the window was really skipped
    assert not all(torch.equal(got[n], t) for n, t in final_module(healthy).items())
    losses = lambda d: {r["step"]: r[names.TRAIN_LOSS] for r in read_metrics(d, names.TRAIN_LOSS) if r["step"] > 3}
    assert {s: v for s, v in losses(rolled).items()} == losses(ref)  # steps 4-8 after the rollback
