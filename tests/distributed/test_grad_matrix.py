"""Gradient-correctness matrix: shared ALBERT parameters under DeepSpeed ZeRO 0-3 on 2 gloo ranks.

Cells: sharing {all, attention, ffn, none} x ZeRO {0, 1, 2, 3} x gradient accumulation {1, 3} x activation
checkpointing {off, on}, fp32 (64 cells), on a 7-layer / 3-group / 2-inner-block model with tiny widths,
dropout 0, the project's TrainConfig -> DeepSpeed config, AdamW and gradient clipping (active: the reference
gradient norm exceeds the clip). For each cell, against single-process references on the same global batch
(see `grad_matrix_worker`):

(a) every parameter's full gradient (gathered under ZeRO-2/3, accumulated over the GA micro-batches and
    averaged by DeepSpeed over GA x ranks) equals the sum of its copies' gradients in the unrolled, unshared
    model (`albert_dist.model.unroll.unroll`) - scaled error <= 1e-5;
(b) the parameters after one optimiser step equal a plain single-process PyTorch step - scaled error <= 1e-5;
    the updates (after - before, ~1e-2 of a weight, so cancellation costs digits) <= 1e-4.

ZeRO-3 cells set `stage3_param_persistence_threshold=0` (DeepSpeed keeps parameters below 1e5 elements
unpartitioned by default, i.e. all of this model) and assert that every parameter is partitioned.

bf16 variant (gradients and weights <= 1e-2, updates <= 2e-2 against references that mirror bf16 arithmetic), a subset of 17 cells (see
`grad_matrix_worker.bf16_cells`). The ZeRO-1 cells with gradient accumulation 3 are strict xfails: DeepSpeed
0.19.8's BF16_Optimizer gets them wrong (measured; see `_bf16_param`).

Controls, proving the comparison can fail: reentrant activation checkpointing under ZeRO-2 must raise
DeepSpeed's "Gradient computed twice for this partition"; a reference that takes one copy's gradient instead of
the sum over the reuses must disagree with the gradients of every cell that has shared parameters by far more
than the tolerance.

All cells run in ONE spawned 2-rank process group (module-scoped fixture); each cell is its own test.
"""
from __future__ import annotations

import pytest

import grad_matrix_worker as gm

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]

FP32_CELLS = gm.fp32_cells()
BF16_CELLS = gm.bf16_cells()
CONTROL_CELLS = gm.control_cells()
#: Tolerances on `grad_matrix_worker.scaled_errors` (per tensor, worst tensor of the cell).
FP32_TOL = 1e-5
FP32_UPDATE_TOL = 1e-4
BF16_TOL = 1e-2
#: bf16 updates (after - before of the fp32 master weights), whole-model relative L2: a quantity derived from
#: the gradients, measured up to 1.1e-2 when the gradients agree to 0.7e-2.
BF16_UPDATE_TOL = 2e-2
CLIP = 0.5


@pytest.fixture(scope="module")
def matrix() -> dict[str, dict]:
    # Control cells last: an exception inside DeepSpeed's backward leaves nothing behind that a later
    # deepspeed.initialize would reuse, but keep the regular cells independent of that anyway.
    return gm.run_matrix(FP32_CELLS + BF16_CELLS + CONTROL_CELLS, timeout_s=1400)


def _check_cell(result: dict, grad_tol: float, param_tol: float, update_tol: float) -> None:
    assert "error" not in result, result.get("traceback", result.get("error"))
    problems = []
    checks = [("grad_error", grad_tol), ("param_error", param_tol), ("update_error", update_tol),
              ("master_param_error", param_tol), ("master_update_error", update_tol)]
    for key, tol in checks:
        if key in result:
            value, name = result[key]
            if not value <= tol:
                problems.append(f"{key} {value:.3g} > {tol:g} at {name}")
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("cell", FP32_CELLS, ids=lambda c: c.id)
def test_fp32_cell(matrix, cell):
    result = matrix[cell.id]
    _check_cell(result, FP32_TOL, FP32_TOL, FP32_UPDATE_TOL)
    if cell.zero_stage == 3:
        assert result["unpartitioned"] == [], "ZeRO-3 left parameters unpartitioned"
    # The config under test is the project's, not a hand-written dict.
    ds = result["ds_config"]
    assert ds["zero_optimization"]["stage"] == cell.zero_stage
    assert ds["gradient_accumulation_steps"] == cell.gradient_accumulation_steps
    assert ds["train_batch_size"] == gm.MICRO_BATCH * cell.gradient_accumulation_steps * gm.WORLD_SIZE


def _refused(cell) -> bool:
    """bf16 + ZeRO-1 + gradient accumulation: EngineConfig refuses it, so the cell builds no engine."""
    return cell.precision == "bf16" and cell.zero_stage == 1 and cell.gradient_accumulation_steps > 1


def _bf16_param(cell):
    if _refused(cell):
        # Measured: DeepSpeed 0.19.8's BF16_Optimizer (bf16 + ZeRO-1 + fp32 gradient accumulation) gave a
        # gradient ~100 % off the reference with gradient accumulation 3 (GA 1 and ZeRO-2/3 agree to < 1 %),
        # with and without activation checkpointing, for every sharing mode, including "none". The engine
        # config now refuses the combination; these cells check that it does, before any engine is built.
        mark = pytest.mark.xfail(strict=True, raises=AssertionError,
                                 reason="bf16 + ZeRO-1 + GA > 1 is refused by EngineConfig (DeepSpeed 0.19.8 "
                                        "BF16_Optimizer disagreed with the reference)")
        return pytest.param(cell, id=cell.id, marks=mark)
    return pytest.param(cell, id=cell.id)


def test_bf16_zero1_accumulation_is_refused(matrix):
    refused = [c for c in BF16_CELLS if _refused(c)]
    assert refused
    for cell in refused:
        error = matrix[cell.id].get("error", "")
        assert error.startswith("ValueError") and "engine.zero_stage=1" in error, error


@pytest.mark.parametrize("cell", [_bf16_param(c) for c in BF16_CELLS])
def test_bf16_cell(matrix, cell):
    """bf16 against references that mirror bf16 arithmetic (see `grad_matrix_worker.reference`): per-tensor
    gradient and weight errors <= 1e-2; updates, which are below bf16's resolution for many weights, are
    compared through the fp32 master weights as a whole-model relative L2 error <= 2e-2."""
    result = matrix[cell.id]
    assert "error" not in result, result.get("traceback", result.get("error"))
    problems = []
    for key, tol in (("grad_error", BF16_TOL), ("param_error", BF16_TOL), ("master_param_error", BF16_TOL),
                     ("update_global_l2_error", BF16_UPDATE_TOL)):
        value, name = result[key]
        if not value <= tol:
            problems.append(f"{key} {value:.3g} > {tol:g} at {name}")
    assert not problems, "; ".join(problems)
    assert result["ds_config"]["bf16"] == {"enabled": True}
    if cell.zero_stage == 3:
        assert result["unpartitioned"] == []


def test_clipping_is_active(matrix):
    """The reference gradient norm exceeds the clip in every cell, so clipping (a global norm over partitioned,
    shared parameters) is part of what (b) compares."""
    norms = {cid: r["grad_norm_ref"] for cid, r in matrix.items() if "grad_norm_ref" in r}
    assert len(norms) == len(FP32_CELLS) + len([c for c in BF16_CELLS if not _refused(c)])
    assert all(r["ds_config"]["gradient_clipping"] == CLIP for r in matrix.values() if "ds_config" in r)
    # > 1.5 x clip: DeepSpeed and the reference scale every gradient by at most 2/3.
    assert min(norms.values()) > 1.5 * CLIP, norms


def test_control_reentrant_checkpointing_fails_under_zero2(matrix):
    (cell,) = CONTROL_CELLS
    result = matrix[cell.id]
    assert "error" in result, "reentrant checkpointing of a reused module was expected to break ZeRO-2"
    assert "Gradient computed twice for this partition" in result["error"]


def test_control_wrong_reference_is_detected(matrix):
    """Comparing with one copy's gradient instead of the sum over the reuses fails in every shared cell."""
    shared = [c for c in FP32_CELLS + BF16_CELLS if c.sharing != "none" and not _refused(c)]
    worst_detection = {c.id: matrix[c.id]["first_copy_grad_error"][0] for c in shared}
    assert min(worst_detection.values()) > 100 * BF16_TOL, worst_detection
