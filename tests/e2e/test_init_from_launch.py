"""`model.init_from` end to end. The bar: a transformers ALBERT saved as the hub's (uncased tokenizer) continues
for 3 steps at lr 1e-12 through `launch/pretrain_local.sh 2 model.init_from=DIR` (the real deepspeed launcher, 2
CPU ranks, ZeRO-2), and the exported model holds the source's every tensor and tokenizes as the source does.
ALBERT's two phases: configs/pretrain/albert-tiny-phase2.yaml runs after albert-tiny-phase1.yaml (shortened)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import clean_env, read_metrics, run_cli

from albert_dist.engine import metric_names as names

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")
from fixtures.hub_albert import MIXED_TEXT, make_hub_albert  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
QUIET = ["tracking.enabled=false", "progress_bar=false", "eval_interval_steps=0", "data.eval_examples=8"]


def _tensors(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def test_init_from_hf_bar(tmp_path):
    import torch

    hub = make_hub_albert(tmp_path / "hub")
    run_dir = tmp_path / "run"
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", str(REPO / "launch" / "pretrain_local.sh"), "2", f"model.init_from={hub}",
                           "max_steps=3", "optimizer.lr=1e-12", "optimizer.warmup_steps=0", "log_interval_steps=1",
                           "data.max_seq_length=64", "engine.train_micro_batch_size_per_gpu=4", *QUIET],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert [r["step"] for r in read_metrics(run_dir, names.TRAIN_LOSS)] == [1, 2, 3]
    exported = run_dir / "final_model" / "hf"
    source, result = _tensors(hub), _tensors(exported)
    assert set(source) <= set(result)
    for key, tensor in source.items():  # lr 1e-12 for 3 steps: fp32's resolution, no more
        torch.testing.assert_close(result[key], tensor, rtol=1e-6, atol=1e-9, msg=key)
    ids = transformers.AutoTokenizer.from_pretrained(exported)(MIXED_TEXT)["input_ids"]
    assert ids == transformers.AutoTokenizer.from_pretrained(hub)(MIXED_TEXT)["input_ids"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["tokenizer_path"] == str(hub)


def test_phase_two_recipe_runs_after_phase_one(tmp_path):
    """Both recipes as a user runs them, one process each, shortened: phase 2 is a new run (steps from 1, its
    own warmup) with phase 1's architecture (512 positions), tokenizer and final weights (2 small steps away).
    Phase 2 at ZeRO-3: the source's weights go in before `deepspeed.initialize` partitions them, and the export
    gathers them back (at ZeRO-2, the recipe's stage, test_init_from_hf_bar compares every tensor)."""
    import torch

    one, two = tmp_path / "phase1", tmp_path / "phase2"
    small = [*QUIET, "data.num_workers=0", "checkpoint.save_interval_steps=0", "log_interval_steps=1",
             "max_steps=2"]
    first = run_cli("train", "--config", "configs/pretrain/albert-tiny-phase1.yaml", *small, f"run_dir={one}",
                    "data.max_seq_length=32", "engine.train_micro_batch_size_per_gpu=2", env=clean_env())
    assert first.returncode == 0, first.stderr[-5000:]
    second = run_cli("train", "--config", "configs/pretrain/albert-tiny-phase2.yaml", *small, f"run_dir={two}",
                     f"model.init_from={one}", "engine.train_micro_batch_size_per_gpu=1", "optimizer.warmup_steps=1",
                     "engine.zero_stage=3", env=clean_env())
    assert second.returncode == 0, second.stderr[-5000:]
    config = yaml.safe_load((two / "config.yaml").read_text())
    assert config["model"]["max_position_embeddings"] == config["data"]["max_seq_length"] == 512
    assert config["model"] == {**yaml.safe_load((one / "config.yaml").read_text())["model"], "init_from": str(one)}
    lrs = [r[names.TRAIN_LR] for r in read_metrics(two, names.TRAIN_LR)]
    # a new run: steps from 1, its own schedule (the recipe's lr after a 1-step warmup, not phase 1's decayed one)
    assert [r["step"] for r in read_metrics(two, names.TRAIN_LR)] == [1, 2] and lrs[0] == pytest.approx(0.001)
    start, end = _tensors(one / "final_model" / "fp32"), _tensors(two / "final_model" / "fp32")
    drift = max((end[k] - start[k]).abs().max().item() for k in start)
    assert 0 < drift < 0.005  # AdamW moves each weight at most ~lr per step; a fresh init differs by ~0.02
