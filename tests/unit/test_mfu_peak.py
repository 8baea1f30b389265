"""MFU's two peaks (`albert_dist.engine.metrics.resolve_peaks`): the datasheet table and the measured matmul."""
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
    datasheet, _, peak, source = metrics.resolve_peaks(None, torch.device("cpu"), torch.bfloat16)
    assert datasheet is None  # a CPU has no datasheet entry
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
    assert metrics.resolve_peaks(None, torch.device("cpu"), torch.float32).measured == 0.05
    assert calls == [torch.float32]


def test_measured_peak_is_positive():
    assert metrics.measure_peak_tflops(torch.device("cpu"), torch.bfloat16, seconds=0.01) > 0


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H200", torch.bfloat16, 989.5), ("NVIDIA H200", torch.float32, 67.0), ("NVIDIA H200 NVL", torch.bfloat16, 835.5),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.5), ("NVIDIA H100 PCIe", torch.bfloat16, 756.5),
    ("NVIDIA H100 NVL", torch.bfloat16, 835.5), ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312.0),
    ("NVIDIA A100-PCIE-40GB", torch.float32, 19.5), ("NVIDIA A10", torch.bfloat16, 125.0),
    ("NVIDIA L40S", torch.bfloat16, 362.05), ("NVIDIA L4", torch.bfloat16, 121.0), ("NVIDIA B200", torch.bfloat16, 2250.0),
    ("NVIDIA GH200 480GB", torch.bfloat16, 989.5), ("Tesla V100-SXM2-16GB", torch.bfloat16, None)])
def test_cuda_datasheet_peak_by_device_name_and_the_measured_one_beside_it(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(metrics, "measure_peak_tflops", lambda device, dtype, seconds=0.3: 700.0)
    monkeypatch.delenv(metrics.PEAK_TFLOPS_ENV, raising=False)
    peaks = metrics.resolve_peaks(None, torch.device("cuda", 0), dtype)
    assert (peaks.datasheet, peaks.measured) == (peak, 700.0)
    assert (peak is None) == ("no datasheet" in peaks.datasheet_source)
    # the config, then the environment, overrule the table; the measurement stays
    assert metrics.resolve_peaks(123.0, torch.device("cuda", 0), dtype)[:3] == (123.0, "engine.peak_tflops_per_device", 700.0)
    monkeypatch.setenv(metrics.PEAK_TFLOPS_ENV, "456")
    assert metrics.resolve_peaks(None, torch.device("cuda", 0), dtype).datasheet == 456.0


def test_cpu_with_a_given_peak_is_not_measured(monkeypatch):
    monkeypatch.setattr(metrics, "measure_peak_tflops", lambda device, dtype, seconds=0.3: pytest.fail("measured"))
    monkeypatch.delenv(metrics.PEAK_TFLOPS_ENV, raising=False)
    assert metrics.resolve_peaks(1.0, torch.device("cpu"), torch.float32) == (
        1.0, "engine.peak_tflops_per_device", None, "not measured (a peak is given)")
    monkeypatch.setenv(metrics.PEAK_TFLOPS_ENV, "-3")
    with pytest.raises(ValueError, match="ALBERT_DIST_PEAK_TFLOPS"):
        metrics.resolve_peaks(None, torch.device("cpu"), torch.float32)


def test_the_console_prints_cpu_mfu_as_n_a_without_a_datasheet_peak(monkeypatch):
    """On CPU the console showed MFU against a matmul timed at start-up on a shared machine: 30-98% for the same
    2-rank job from one start to the next, a number without meaning (issue 46). Now the line says n/a there; a
    given peak is shown, and an accelerator without a datasheet row still shows its measured peak."""
    from albert_dist.engine import metric_names as names
    from albert_dist.job import console

    monkeypatch.delenv(metrics.PEAK_TFLOPS_ENV, raising=False)
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    measured_only = {names.PERF_MFU_MEASURED_PEAK: 0.61}  # what the trainer logs on CPU without a peak
    assert metrics.shown_mfu(measured_only, cpu) is None
    line = console.train_line(20, 120, 9.06, 0.031, 1.87e-3, 2960.0, metrics.shown_mfu(measured_only, cpu), 138)
    assert line == "step  20/120 | loss 9.060 | mlm acc  3.1% | lr 1.87e-03 | tok/s 2.96k | mfu n/a | eta 2m18s"
    assert metrics.shown_mfu({names.PERF_MFU: 0.12}, cpu) == 0.12  # engine.peak_tflops_per_device given
    assert metrics.shown_mfu(measured_only, gpu) == 0.61
    assert metrics.shown_mfu({names.PERF_MFU: 0.4, names.PERF_MFU_MEASURED_PEAK: 0.5}, gpu) == 0.4
