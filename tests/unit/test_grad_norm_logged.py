"""The logged gradient norm at fp32 ZeRO-0, where DeepSpeed 0.19 reports none (`engine.clip_fp32_gradients` drops
`clip_grad_norm_`'s value): `albert_dist.engine.loss.optimizer_step` computes it, and it must equal the norm
DeepSpeed's own ZeRO-1 optimiser reports for the same first step (same init, same batch, one rank)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from albert_dist.engine import metric_names as names

REPO = Path(__file__).resolve().parents[2]
SHORT = ["max_steps=1", "engine.train_micro_batch_size_per_gpu=2", "data.max_seq_length=32",
         "data.max_predictions_per_seq=4", "data.num_workers=0", "data.eval_examples=2", "tracking.enabled=false",
         "progress_bar=false", "log_interval_steps=1", "engine.gradient_clipping=1.0"]


def _first_grad_norm(stage: int, run_dir: Path) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "albert_dist.cli", "train", "--config",
                           "configs/pretrain/albert-tiny-wikitext.yaml", *SHORT, f"engine.zero_stage={stage}",
                           f"run_dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if names.TRAIN_GRAD_NORM in r)[names.TRAIN_GRAD_NORM]


@pytest.mark.timeout(900)
def test_zero0_fp32_logs_the_grad_norm_deepspeed_zero1_reports(tmp_path):
    zero0, zero1 = _first_grad_norm(0, tmp_path / "z0"), _first_grad_norm(1, tmp_path / "z1")
    assert math.isfinite(zero1) and zero1 > 0.1  # at initialisation the norm is O(1), not 0
    assert zero0 == pytest.approx(zero1, rel=1e-4)
