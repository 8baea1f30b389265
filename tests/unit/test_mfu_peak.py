"""MFU's peak on CPU for low-precision runs (`albert_dist.engine.metrics.resolve_peak_tflops`)."""
import pytest
import torch

from albert_dist.engine import metrics


@pytest.mark.parametrize("bf16, fp32", [(0.0006, 0.04), (0.2, 0.04)])
def test_cpu_bf16_peak_is_the_faster_of_bf16_and_fp32(monkeypatch, bf16, fp32):
    """A slow bf16 kernel path (0.0006 TFLOP/s measured on a CPU without native bf16) must not become the peak
    of a run whose layers reach the fp32 speed (that logged mfu=7.70); a fast native bf16 path must be."""
    peaks = {torch.bfloat16: bf16, torch.float32: fp32}
    monkeypatch.setattr(metrics, "measure_peak_tflops", lambda device, dtype, seconds=0.3: peaks[dtype])
    monkeypatch.delenv(metrics.PEAK_TFLOPS_ENV, raising=False)
    peak, source = metrics.resolve_peak_tflops(None, torch.device("cpu"), torch.bfloat16)
    assert peak == max(bf16, fp32)
    assert "bfloat16" in source and "float32" in source
    # The mfu of a run at the fp32 matmul speed is then <= 1.
    flops_per_position = 1e9
    positions_per_s = fp32 * 1e12 / flops_per_position
    assert 0 < metrics.mfu(flops_per_position, positions_per_s, 1, peak) <= 1


def test_fp32_peak_is_measured_once_in_fp32(monkeypatch):
    calls = []
    monkeypatch.setattr(metrics, "measure_peak_tflops", lambda device, dtype, seconds=0.3: calls.append(dtype) or 0.05)
    monkeypatch.delenv(metrics.PEAK_TFLOPS_ENV, raising=False)
    assert metrics.resolve_peak_tflops(None, torch.device("cpu"), torch.float32)[0] == 0.05
    assert calls == [torch.float32]


def test_measured_peak_is_positive():
    assert metrics.measure_peak_tflops(torch.device("cpu"), torch.bfloat16, seconds=0.01) > 0
