"""The gradient norm at fp32 ZeRO-0 (`albert_dist.engine.grad_norm`): DeepSpeed 0.19 clips there with torch's fp32
`norm()` (5.75e-5 low on the tied embedding) and keeps no norm. The trainer installs ZeRO-1/2's float64 norm for
clipping and logging, so 8 clipped steps of ZeRO-0 and ZeRO-1 (same init, same batches, one rank) log the same
`train/grad_norm` at every step to 1e-6 and end with the same weights to fp32 rounding carried through 8 Adam
steps: measured 2.6e-6 on the tied embedding (of its largest weight; bound 1e-5) and at most 6.1e-6 on any tensor
(bound 2e-5). The control, the same ZeRO-0 run with DeepSpeed's own clipping, ends 1.7e-4 off on the tied embedding
(asserted > 5e-5), so the bounds tell the two clippings apart."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, clean_env, read_metrics, run_cli

from albert_dist.engine import metric_names as names
from albert_dist.engine.grad_norm import global_grad_norm

STEPS = 8
CLIP = 0.5
SHORT = [f"max_steps={STEPS}", "engine.train_micro_batch_size_per_gpu=2", "data.max_seq_length=32",
         "data.max_predictions_per_seq=4", "data.num_workers=0", "data.validation=[]", "tracking.enabled=false",
         "progress_bar=false", "log_interval_steps=1", f"engine.gradient_clipping={CLIP}", "optimizer.warmup_steps=0",
         "checkpoint.save_interval_steps=0", "eval_interval_steps=0"]
TIED = "albert.embeddings.word_embeddings.weight"

#: The control's entry point: the CLI with the trainer's exact clipping switched off (DeepSpeed's own fp32 one).
DEEPSPEED_CLIPPING = ("import sys, albert_dist.apps.pretrain.trainer as t; t.install_exact_clipping = lambda engine: False; "
                      "from albert_dist.cli import main; sys.exit(main(sys.argv[1:]))")


def _run(stage: int, run_dir: Path, deepspeed_clipping: bool = False) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(train/grad_norm of every step, the module's weights after the last step) of a 1-rank CLI run."""
    args = ["train", "--config", "configs/pretrain/albert-tiny-wikitext.yaml", *SHORT, f"engine.zero_stage={stage}",
            f"run_dir={run_dir}"]
    if deepspeed_clipping:
        proc = subprocess.run([sys.executable, "-c", DEEPSPEED_CLIPPING, *args], cwd=REPO, env=clean_env(),
                              capture_output=True, text=True, timeout=600)
    else:
        proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    norms = [r[names.TRAIN_GRAD_NORM] for r in read_metrics(run_dir, names.TRAIN_GRAD_NORM)]
    states = torch.load(run_dir / "checkpoints" / f"step_{STEPS}" / "mp_rank_00_model_states.pt",
                        map_location="cpu", weights_only=False)
    return norms, states["module"]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_zero0_fp32_clips_and_logs_with_zero1s_norm(tmp_path):
    (n0, w0), (n1, w1) = _run(0, tmp_path / "z0"), _run(1, tmp_path / "z1")
    assert len(n0) == len(n1) == STEPS
    assert all(math.isfinite(n) and n > CLIP for n in n1), n1  # clipping is active at every step
    for step, (a, b) in enumerate(zip(n0, n1), start=1):
        assert a == pytest.approx(b, rel=1e-6), f"step {step}: ZeRO-0 {a!r} vs ZeRO-1 {b!r}"
    scale = float(w1[TIED].abs().max())
    assert float((w0[TIED] - w1[TIED]).abs().max()) / scale < 1e-5
    for name in w1:
        assert float((w0[name] - w1[name]).abs().max()) <= 2e-5 * max(float(w1[name].abs().max()), 1e-3), name
    # Control: DeepSpeed's own ZeRO-0 clipping (fp32 norms) drifts from ZeRO-1 far beyond the bound above.
    _, w_ds = _run(0, tmp_path / "z0-deepspeed", deepspeed_clipping=True)
    assert float((w_ds[TIED] - w1[TIED]).abs().max()) / scale > 5e-5


def test_global_grad_norm_is_zero1s_float64_norm():
    """Per tensor in float64, squares summed, the sum rounded to fp32, its root: the float64 norm to fp32
    precision, on a 512k-element gradient with a wide range of magnitudes."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(8000, 64)), torch.nn.Parameter(torch.zeros(300)),
              torch.nn.Parameter(torch.zeros(5))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * torch.logspace(-6, 0, p.numel()).reshape(p.shape)
    params[2].grad = None  # skipped
    exact = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))
    norm = global_grad_norm(params)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    assert float(norm) == pytest.approx(exact, rel=1.2e-7)
    assert float(global_grad_norm([torch.nn.Parameter(torch.zeros(2))])) == 0.0
