"""Which weights `runs/x` means (albert_dist.runs, docs/checkpoints.md "Which weights a run means"), the issue-45
scenario at a small size: a run finishes (final_model/ written at step 4), is continued with ``--resume auto
max_steps=400`` and stopped with Ctrl-C (exit 75, `latest` = step_M). `albert-dist export`, `model.init_from` and
`albert-dist finetune` then take the same weights, step_M's (DeepSpeed's own consolidation of that checkpoint is
the reference), each printing what it took; before albert_dist.runs, model.init_from and finetune loaded
final_model/ (step 4) and finetune filed its scores under step M.
"""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import read_metrics

from albert_dist.cli import main as cli_main
from albert_dist.engine.checkpoint.layout import read_latest, step_of
from albert_dist.exit_codes import EXIT_PREEMPTED
from fixtures.ranks import CONFIG, Job

FIRST_STEPS = 4
TRAIN = [sys.executable, "-m", "albert_dist.cli", "train"]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> tuple[Path, int]:
    """The run directory and the step its Ctrl-C checkpoint holds."""
    root = tmp_path_factory.mktemp("runs")
    config, run = root / "tiny.yaml", root / "run"
    config.write_text(CONFIG)
    keep = "checkpoint.keep_last=100"  # step_3 stays, for --step 3
    job = Job(1, config, run, [], [f"max_steps={FIRST_STEPS}", keep], command=TRAIN)
    assert job.wait() == [0], job.log_tail()
    assert (run / "final_model" / "fp32" / "model.safetensors").is_file()
    job = Job(1, config, run, ["--resume", "auto"], ["max_steps=400", keep], command=TRAIN)
    deadline = time.time() + 240
    while not any(r["step"] >= FIRST_STEPS + 2 for r in read_metrics(run)):
        assert job.procs[0].poll() is None and time.time() < deadline, job.log_tail()
        time.sleep(0.1)
    job.procs[0].send_signal(signal.SIGINT)  # Ctrl-C: stop after this step, checkpoint it
    assert job.wait(timeout=120) == [EXIT_PREEMPTED], job.log_tail()
    stopped = step_of(read_latest(run / "checkpoints"))
    assert FIRST_STEPS + 2 <= stopped < 400
    return run, stopped


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    shared = sorted(set(got) & set(want))
    assert "albert.embeddings.word_embeddings.weight" in shared and len(shared) >= len(want) - 1
    for key in shared:
        assert torch.equal(got[key], want[key]), key


def test_export_init_from_and_finetune_take_the_newest_checkpoint_and_say_so(stopped_run, tmp_path, capsys,
                                                                              monkeypatch):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from albert_dist.config import load_config
    from albert_dist.apps.finetune.source import resolve as finetune_source
    from albert_dist.apps.pretrain.init_from import check, read_source, source_state
    from albert_dist.runs.weights import load_state_dict

    run, stopped = stopped_run
    reference = {k: v.float() for k, v in
                 get_fp32_state_dict_from_zero_checkpoint(str(run / "checkpoints"), tag=f"step_{stopped}").items()}
    final = load_state_dict(run / "final_model" / "fp32")  # step 4: what the other rules took
    assert not torch.equal(final["albert.embeddings.word_embeddings.weight"],
                           reference["albert.embeddings.word_embeddings.weight"])
    took = f"{run} -> step_{stopped}, newest verified checkpoint"

    capsys.readouterr()
    assert cli_main(["export", str(run), "--output", str(tmp_path / "hf"), "--fp32", str(tmp_path / "fp32.pt")]) == 0
    assert took in capsys.readouterr().out
    _same(load_state_dict(tmp_path / "fp32.pt"), reference)

    cfg = load_config(str(run.parent / "tiny.yaml"), [f"model.init_from={run}"], read_source)
    source = check(cfg, say=True)
    assert f"model.init_from: {took}" in capsys.readouterr().out and source.step == stopped
    _same(source_state(source)[0], reference)

    model = finetune_source(str(run), None, None, tmp_path / "cache")
    assert took in capsys.readouterr().out and model.step == stopped
    _same(model.encoder_state(), reference)

    # --step N where a command takes it: the run's first checkpoint, by export and finetune alike
    capsys.readouterr()
    assert cli_main(["export", str(run), "--step", "3", "--output", str(tmp_path / "hf3")]) == 0
    assert f"{run} -> step_3, --step 3" in capsys.readouterr().out
    assert finetune_source(str(run), 3, None, tmp_path / "cache").step == 3
