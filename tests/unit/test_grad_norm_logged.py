"""The logged gradient norm at fp32 ZeRO-0, where DeepSpeed 0.19 reports none (`engine.clip_fp32_gradients` drops
`clip_grad_norm_`'s value): `albert_dist.engine.loss.optimizer_step` computes it, and it must equal the norm
DeepSpeed's own ZeRO-1 optimiser reports for the same first step (same init, same batch, one rank)."""
import math
from pathlib import Path

import pytest
from helpers import read_metrics, run_cli

from albert_dist.engine import metric_names as names

pytestmark = pytest.mark.integration
SHORT = ["max_steps=1", "engine.train_micro_batch_size_per_gpu=2", "data.max_seq_length=32",
         "data.max_predictions_per_seq=4", "data.num_workers=0", "data.eval_examples=2", "tracking.enabled=false",
         "progress_bar=false", "log_interval_steps=1", "engine.gradient_clipping=1.0"]


def _first_grad_norm(stage: int, run_dir: Path) -> float:
    proc = run_cli("train", "--config", "configs/pretrain/albert-tiny-wikitext.yaml", *SHORT,
                   f"engine.zero_stage={stage}", f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(run_dir, names.TRAIN_GRAD_NORM)[0][names.TRAIN_GRAD_NORM]


@pytest.mark.timeout(900)
def test_zero0_fp32_logs_the_grad_norm_deepspeed_zero1_reports(tmp_path):
    zero0, zero1 = _first_grad_norm(0, tmp_path / "z0"), _first_grad_norm(1, tmp_path / "z1")
    assert math.isfinite(zero1) and zero1 > 0.1  # at initialisation the norm is O(1), not 0
    assert zero0 == pytest.approx(zero1, rel=1e-4)
