"""Every model preset trains: one short CPU step through the real `albert-dist train` (tiny data, 1 rank).

`--config configs/pretrain/albert-tiny-wikitext.yaml model.preset=<name>` must take the whole model section
from configs/model/<name>.yaml (the recipe's own model fields are replaced), run a step and a validation,
write a checkpoint and the resolved config. albert-xxlarge (223M parameters: ~3.6 GB of fp32 weights,
gradients and AdamW moments, more than this shared test machine gives one test) runs its forward (full
logits) and backward on the meta device instead. The runs' output (a pipe, as in a log file) also shows the
console: one short line per log interval and validation, no progress bar, none of the filtered noise.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import read_metrics, run_cli

from albert_dist.job import console

from albert_dist.engine import metric_names as names

REPO = Path(__file__).resolve().parents[2]
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
#: The shortest job the trainer runs: 1 step of 1 sequence of 16 tokens, ZeRO-0, no loader workers.
SHORT = ["max_steps=1", "engine.zero_stage=0", "engine.train_micro_batch_size_per_gpu=1", "data.max_seq_length=16",
         "data.max_predictions_per_seq=2", "data.num_workers=0", "data.eval_examples=2", "tracking.enabled=false",
         "progress_bar=false", "log_interval_steps=1"]


def _preset_fields(name: str) -> dict:
    """The preset file read with plain PyYAML (independently of the package's loader)."""
    return yaml.safe_load((REPO / "configs" / "model" / f"{name}.yaml").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("name", ["albert-tiny", "albert-base", "albert-large", "albert-xlarge"])
def test_preset_trains_one_step_through_the_cli(name, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("train", "--config", RECIPE, f"model.preset={name}", *SHORT, f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    expected = _preset_fields(name)
    assert {k: resolved[k] for k in expected} == expected  # the preset, not the recipe's 128 positions
    records = read_metrics(run_dir)
    train = next(r for r in records if names.TRAIN_LOSS in r)
    assert train["step"] == 1 and math.isfinite(train[names.TRAIN_LOSS])
    # At initialisation the MLM loss is about ln V (a near-uniform prediction over the vocabulary).
    assert abs(train[names.TRAIN_MLM_LOSS] - math.log(expected["vocab_size"])) < 1.5
    assert any(names.VAL_LOSS in r for r in records)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_1"
    # the console of a run whose output is a file: the short lines, no progress bar, no known noise
    output = proc.stdout + proc.stderr
    lines = [x for x in output.splitlines() if "| loss " in x or "| val loss " in x]
    assert len(lines) == 2 and all(len(x) <= 120 for x in lines), lines
    assert re.search(r"^\[rank0 [\d:]+\] step 1/1 \| loss \d+\.\d{3} \| mlm acc +\d+\.\d% \| lr ", lines[0])
    assert "\r" not in output and "it/s" not in output and "step/s" not in output
    for _, message in console.NOISY_LOG_RECORDS + console.NOISY_WARNINGS:
        assert message not in output


def test_xxlarge_preset_runs_on_the_meta_device():
    from albert_dist.config import load_config
    from albert_dist.model import AlbertForPreTraining

    cfg = load_config(REPO / RECIPE, ["model.preset=albert-xxlarge", *SHORT])
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.model.intermediate_size) == (4096, 12, 16384)
    with torch.device("meta"):
        model = AlbertForPreTraining(cfg.model)
        ids = torch.zeros(1, 16, dtype=torch.long)
        # full logits: the loss path gathers the labelled positions, a data-dependent shape meta cannot run
        mlm, sop = model.logits(ids, torch.ones_like(ids), torch.zeros_like(ids))
        assert mlm.shape == (1, 16, 30000) and sop.shape == (1, 2)
        (mlm.sum() + sop.sum()).backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
