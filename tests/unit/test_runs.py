"""The one rule of which weights a run means (albert_dist.runs.source, docs/checkpoints.md "Which weights a run
means"), on run directories laid out as the trainer leaves them (checkpoint metadata and final model files written
here; no weights are read): the newest verified checkpoint, the final model when it records the same step or no
checkpoint is left, ``--step N``; what each command prints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from albert_dist.runs import SourceNotFound, choose, find

MODEL = {"vocab_size": 90, "hidden_size": 32}


def _checkpoint(ckpt_dir: Path, step: int, good: bool = True) -> None:
    tag = ckpt_dir / f"step_{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    files = {"mp_rank_00_model_states.pt": 10 if good else 11}
    (tag / "albert_dist.json").write_text(json.dumps({"step": step, "world_size": 1, "zero_stage": 0,
                                                      "config_hash": "h", "files": files,
                                                      "config": {"model": MODEL}}))


def _run(root: Path, checkpoints: tuple[int, ...], final: int | None | str) -> Path:
    """A run directory: config.yaml, checkpoints step_<N>, and a final model recording step `final` ("old": a
    final model from before the step was recorded; None: no final model)."""
    root.mkdir()
    (root / "config.yaml").write_text(yaml.safe_dump({"model": MODEL, "max_steps": 99}))
    for step in checkpoints:
        _checkpoint(root / "checkpoints", step)
    if final is not None:
        fp32 = root / "final_model" / "fp32"
        fp32.mkdir(parents=True)
        (fp32 / "model.yaml").write_text(yaml.safe_dump(MODEL))
        if final != "old":
            (fp32 / "step.json").write_text(json.dumps({"step": final}))
    return root


@pytest.mark.parametrize("newest, final, has_final, step, expected", [
    (41, 20, True, None, "checkpoint"),   # the run: finished at 20, continued, stopped at 41
    (20, 20, True, None, "final"),        # a finished run: the same weights, already consolidated
    (None, 20, True, None, "final"),      # no checkpoint left
    (None, None, True, None, "final"),    # ... nor a recorded step
    (20, None, True, None, "checkpoint"),  # an unrecorded final model is not taken over a checkpoint
    (20, None, False, None, "checkpoint"),
    (None, None, False, None, None),
    (41, 20, True, 20, "final"),          # --step 20: the final model records it
    (41, 20, True, 3, None),              # --step 3: the caller looks for checkpoint step_3
])
def test_the_rule(newest, final, has_final, step, expected):
    assert choose(newest, final, has_final, step) == expected


def test_a_continued_and_stopped_run_means_its_newest_checkpoint_everywhere(tmp_path):
    run = _run(tmp_path / "run", (3, 20, 41), 20)
    found = find(run)
    assert (found.kind, found.step, found.weights) == ("checkpoint", 41, run / "checkpoints" / "step_41")
    assert found.took() == f"{run} -> step_41, newest verified checkpoint"
    assert found.model == MODEL and found.run_dir == run
    assert find(run / "checkpoints").step == 41
    assert find(run, step=3).took() == f"{run} -> step_3, --step 3"
    at_20 = find(run, step=20)
    assert (at_20.kind, at_20.weights) == ("state_dict", run / "final_model" / "fp32")
    with pytest.raises(SourceNotFound, match=r"--step 5: no checkpoint .* \(retained steps: \[3, 20, 41\]\)"):
        find(run, step=5)


def test_a_finished_run_means_its_final_model_and_a_broken_newest_checkpoint_is_skipped(tmp_path):
    finished = _run(tmp_path / "finished", (10, 20), 20)
    assert find(finished).took() == (f"{finished} -> final model (step 20), the final model, the same step as the "
                                     "newest verified checkpoint")
    broken = _run(tmp_path / "broken", (10,), "old")
    _checkpoint(broken / "checkpoints", 30, good=False)  # a save cut short: skipped, as --resume auto does
    assert find(broken).weights == broken / "checkpoints" / "step_10"
    only_final = _run(tmp_path / "only-final", (), "old")
    found = find(only_final)
    assert (found.kind, found.step, found.why) == ("state_dict", 99, "the final model, no checkpoint left")
    with pytest.raises(SourceNotFound, match="without a final model and without a checkpoint"):
        find(_run(tmp_path / "empty", (), None))
