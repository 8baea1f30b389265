"""Datasheet dense peak FLOP/s of accelerators, the denominator of MFU (with `metrics.measure_peak_tflops`, the
achieved matmul peak, as the second one).

Dense means without 2:4 structured sparsity (datasheets print the sparse figure first, twice the dense one).
bf16 is the tensor-core figure (fp16 is the same on every device listed); fp32 is the non-tensor-core figure
(TF32 is not fp32: a run with TF32 matmuls allowed can exceed it).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class Peak(NamedTuple):
    """One device's dense peaks, TFLOP/s per device, and where the figures are printed."""
    bf16: float
    fp32: float
    source: str


_H100_SXM = Peak(989.5, 67.0, "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM, BF16 1,979 with "
                              "sparsity, FP32 67")
_A100 = Peak(312.0, 19.5, "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4): BF16 312 / 624 "
                          "sparse, FP32 19.5; 40 and 80 GB, SXM and PCIe alike")
#: (substring of torch.cuda.get_device_name(), peaks); the first match wins, so longer names come first
#: ("H100 NVL" before "H100", "L40S" before "L40" before "L4", "A100" before "A10", "GH200" before "H200").
DATASHEET_PEAKS: tuple[tuple[str, Peak], ...] = (
    ("GB200", Peak(2500.0, 80.0, "NVIDIA GB200 NVL72 spec (nvidia.com/en-us/data-center/gb200-nvl72), per GPU: "
                                 "FP16/BF16 5 PFLOPS sparse, FP32 80")),
    ("B200", Peak(2250.0, 75.0, "NVIDIA GB200 NVL72 spec page, HGX B200 column, per GPU: FP16/BF16 4.5 PFLOPS "
                                "sparse, FP32 75")),
    ("B100", Peak(1750.0, 60.0, "NVIDIA Blackwell architecture brief, HGX B100, per GPU: FP16/BF16 3.5 PFLOPS "
                                "sparse, FP32 60")),
    ("GH200", Peak(989.5, 67.0, "NVIDIA GH200 datasheet: H100 SXM figures (BF16 1,979 sparse, FP32 67)")),
    ("H200 NVL", Peak(835.5, 60.0, "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): NVL, BF16 1,671 "
                                   "sparse, FP32 60")),
    ("H200", Peak(989.5, 67.0, "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): SXM, BF16 1,979 "
                               "sparse, FP32 67")),
    ("H100 NVL", Peak(835.5, 60.0, "NVIDIA H100 datasheet (2024): NVL, BF16 1,671 sparse, FP32 60")),
    ("H100 PCIe", Peak(756.5, 51.2, "NVIDIA H100 datasheet: PCIe, BF16 1,513 sparse, FP32 51")),
    ("H100", _H100_SXM),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("H800", _H100_SXM._replace(source="NVIDIA H800 datasheet: H100 SXM compute (BF16 1,979 sparse, FP32 67)")),
    ("H20", Peak(148.0, 44.0, "NVIDIA H20 product brief: BF16 148 dense, FP32 44")),
    ("A100", _A100),
    ("A800", _A100._replace(source="NVIDIA A800 datasheet: A100 compute (BF16 312, FP32 19.5)")),
    ("L40S", Peak(362.05, 91.6, "NVIDIA L40S datasheet: BF16 362.05 (733 sparse), FP32 91.6")),
    ("L40", Peak(181.05, 90.5, "NVIDIA L40 datasheet: BF16 181.05 (362.1 sparse), FP32 90.5")),
    ("L4", Peak(121.0, 30.3, "NVIDIA L4 datasheet: BF16 242 sparse, FP32 30.3")),
    ("A10", Peak(125.0, 31.2, "NVIDIA A10 datasheet: BF16 250 sparse, FP32 31.2")),
)


def datasheet_peak(device_name: str, dtype: torch.dtype) -> Optional[tuple[float, str]]:
    """Dense peak TFLOP/s of the device named `device_name` (``torch.cuda.get_device_name()``) for matmuls in
    `dtype` (bfloat16/float16: the tensor-core figure; float32: the fp32 one) and the row's source, or None for
    a device not in :data:`DATASHEET_PEAKS` (CPUs included)."""
    for key, peak in DATASHEET_PEAKS:
        if key in device_name:
            value = peak.fp32 if dtype == torch.float32 else peak.bf16
            return value, f"datasheet {key} {'fp32' if dtype == torch.float32 else 'bf16'}: {peak.source}"
    return None
