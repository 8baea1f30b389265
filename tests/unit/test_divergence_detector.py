"""Divergence detection (`albert_dist.engine.divergence`) against hand-computed values, its config, its testing
switch, and what it does to checkpoints (`CheckpointManager.confirm` / `quarantine`, retention's `healthy`).

The real runs (exit 77, a rollback that skips its window) are tests/distributed/test_divergence.py.
"""
from __future__ import annotations

import math
import types

import pytest
import torch

from albert_dist.config import load_config
from albert_dist.engine.checkpoint.layout import read_latest, write_latest
from albert_dist.engine.checkpoint.manager import CheckpointManager
from albert_dist.engine.checkpoint.retention import prune
from albert_dist.engine.divergence import (INJECT_ENV, DivergenceConfig, DivergenceMonitor, injected_steps,
                                           saved_window, stream_batches)
from test_checkpoint_manager import make_ckpt

RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"


def monitor(**cfg) -> DivergenceMonitor:
    return DivergenceMonitor(DivergenceConfig(**cfg), torch.device("cpu"))


def feed(mon: DivergenceMonitor, losses, first_step: int = 1) -> None:
    for i, loss in enumerate(losses):
        mon.add_loss(first_step + i, torch.tensor(loss, dtype=torch.float32))


def test_a_spike_is_a_loss_over_z_sigma_above_the_window_hand_computed():
    # window [1, 2]: mean 1.5, unbiased std 1/sqrt(2) = 0.70711; loss 3 is (3 - 1.5) / 0.70711 = 2.12132 sigma above
    mon = monitor(spike_window_steps=4, spike_zscore=2.0)  # active from max(2, 4 // 2) = 2 earlier steps
    feed(mon, [1.0, 2.0, 3.0])
    verdict = mon.read(3)
    assert (verdict.first_step, verdict.spike_steps, verdict.nonfinite_steps) == (3, 1, 0)
    assert verdict.spike_zscore == pytest.approx(1.5 / math.sqrt(0.5), rel=1e-12)
    mon = monitor(spike_window_steps=4, spike_zscore=2.2)  # 2.12 < 2.2: no spike
    feed(mon, [1.0, 2.0, 3.0])
    assert mon.read(3) is None


def test_the_window_rolls_only_the_last_steps_count_and_a_fall_is_no_spike():
    # window of 4: at step 7 it holds [1, 2, 1, 2] (mean 1.5, std 0.57735), the two 100s rolled out:
    # 3.9 is (3.9 - 1.5) / 0.57735 = 4.157 sigma above; with the 100s in, it would be far below the mean
    mon = monitor(spike_window_steps=4, spike_zscore=4.0)
    feed(mon, [100.0, 100.0])
    assert mon.read(2) is None
    feed(mon, [1.0, 2.0, 1.0, 2.0], first_step=3)  # steps 3-4 fall far below: one-sided, no flag
    assert mon.read(6) is None
    feed(mon, [3.9], first_step=7)
    verdict = mon.read(7)
    assert verdict.first_step == 7 and verdict.spike_zscore == pytest.approx(2.4 / math.sqrt(1 / 3), rel=1e-7)  # 3.9 as float32


def test_the_spike_test_waits_for_half_a_window_of_history():
    mon = monitor(spike_window_steps=8, spike_zscore=1.0)  # active from 4 earlier steps
    feed(mon, [1.0, 1.1, 1.0, 1e6])  # 3 earlier steps only
    assert mon.read(4) is None
    feed(mon, [1e9], first_step=5)  # now 4 earlier (the 1e6 among them: mean 250000.775, std 499999.6)
    assert mon.read(5).first_step == 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_flags_its_step_and_the_first_one_is_named(bad):
    mon = monitor()
    feed(mon, [2.0, 2.0, bad, 2.0, bad])
    verdict = mon.read(5)
    assert (verdict.first_step, verdict.nonfinite_steps, verdict.read_step) == (3, 2, 5)
    assert verdict.reasons() == "a non-finite loss (2 steps)"
    assert mon.read(5) is None  # read: cleared


def test_a_run_of_consecutive_skipped_steps_flags_at_its_length():
    # engine.skipped_steps after steps 1-7: runs of 2 (steps 2-3) then 3 (steps 5-7): the second reaches 3
    mon = monitor(spike_window_steps=0, max_skipped_steps=3)
    out = types.SimpleNamespace(mlm_loss_sum=torch.tensor(8.0), mlm_count=torch.tensor(4),
                                sop_loss_sum=torch.tensor(1.0), sop_count=torch.tensor(2))
    for step, skipped in enumerate([0, 1, 2, 2, 3, 4], start=1):
        mon.add_step(step, [out], skipped)
    assert mon.read(6) is None
    mon.add_step(7, [out], 5)
    verdict = mon.read(7)
    assert (verdict.first_step, verdict.skipped_run, verdict.spike_steps) == (5, 3, 0)
    assert verdict.reasons() == "3 consecutive steps skipped by DeepSpeed for inf/NaN gradients"


def test_the_step_loss_is_mlm_per_masked_token_plus_sop_per_sequence_over_the_micro_steps():
    outs = [types.SimpleNamespace(mlm_loss_sum=torch.tensor(6.0), mlm_count=torch.tensor(3),
                                  sop_loss_sum=torch.tensor(1.0), sop_count=torch.tensor(2)),
            types.SimpleNamespace(mlm_loss_sum=torch.tensor(4.0), mlm_count=torch.tensor(2),
                                  sop_loss_sum=torch.tensor(0.5), sop_count=torch.tensor(0))]
    assert DivergenceMonitor.step_loss(outs).item() == pytest.approx(10.0 / 5 + 1.5 / 2)


def test_add_step_reads_nothing_from_the_device(monkeypatch):
    """The per-step half is device ops only: every host read of a tensor raises while it runs."""
    mon = monitor(spike_window_steps=4, max_skipped_steps=2)
    out = types.SimpleNamespace(mlm_loss_sum=torch.tensor(8.0), mlm_count=torch.tensor(4),
                                sop_loss_sum=torch.tensor(1.0), sop_count=torch.tensor(2))

    def forbidden(*a, **k):
        raise AssertionError("host read of a tensor in add_step")

    with monkeypatch.context() as mp:
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
            mp.setattr(torch.Tensor, name, forbidden)
        for step in range(1, 9):
            mon.add_step(step, [out], max(0, step - 5))  # skipped at steps 6-8
    assert mon.unread == 8 and mon.read(8) is not None  # the skipped run flagged


def test_the_window_saved_with_a_checkpoint_continues_the_spike_test():
    mon = monitor(spike_window_steps=4, spike_zscore=4.0)
    feed(mon, [100.0, 100.0, 1.0, 2.0, 1.0, 2.0])
    assert mon.window_state() == [1.0, 2.0, 1.0, 2.0]  # oldest first, the 100s rolled out
    saved = [{"sums": [], "loss_window": mon.window_state()}]
    resumed = monitor(spike_window_steps=4, spike_zscore=4.0)
    resumed.restore_window(saved_window(saved, rank=0))
    feed(resumed, [3.9], first_step=7)
    assert resumed.read(7).first_step == 7  # as without the restart (test above)
    assert saved_window([], 0) == [] and saved_window([{"sums": []}], 3) == []


def test_config_is_checked_field_by_field():
    assert DivergenceConfig().policy == "rollback" and DivergenceConfig().min_history == 64
    with pytest.raises(ValueError, match=r"divergence.policy: Invalid value 'pause', expected one of \['stop', 'rollback'\]"):
        load_config(RECIPE, ["divergence.policy=pause"])  # the line the CLI prints, exit 2
    with pytest.raises(ValueError, match=r"divergence.policy must be one of \('stop', 'rollback'\), got 'pause'"):
        DivergenceConfig(policy="pause")
    for field, value in (("max_rollbacks", -1), ("spike_window_steps", 1), ("spike_zscore", 0.0),
                         ("spike_zscore", float("inf")), ("max_skipped_steps", -2)):
        with pytest.raises(ValueError, match=rf"divergence.{field} must be"):
            DivergenceConfig(**{field: value})
    assert load_config(RECIPE, ["divergence.policy=stop"]).divergence.policy == "stop"


def test_the_testing_switch_names_steps():
    assert injected_steps({}) == frozenset()
    assert injected_steps({INJECT_ENV: "5"}) == {5} and injected_steps({INJECT_ENV: " 3,9 "}) == {3, 9}
    for bad in ("0", "x", "4,-1"):
        with pytest.raises(ValueError, match=rf"\${INJECT_ENV} must be step numbers >= 1"):
            injected_steps({INJECT_ENV: bad})


def test_stream_batches_reads_the_cursor_of_every_stream_state_in_a_loader_state():
    plain = {"_num_yielded": 6, "dataset_state": {"fingerprint": "f", "batches": 6, "before": {}}}
    workers = {"_snapshot": {"_worker_snapshots": {"worker_0": {"dataset_state": {"fingerprint": "f", "batches": 4}},
                                                   "worker_1": {"dataset_state": {"fingerprint": "f", "batches": 3}}}}}
    assert stream_batches(plain) == 6 and stream_batches(workers) == 7
    assert stream_batches({"fingerprint": "f"}) is None  # iteration not started


# ---------------------------------------------------------------------------------- checkpoints (rank 0 alone)
def manager(ckpt_dir, keep_last: int = 1) -> CheckpointManager:
    cfg = types.SimpleNamespace(keep_last=keep_last, on_save_error="fail")
    return CheckpointManager(cfg, ckpt_dir, rank=0, world_size=1, config={}, config_hash="h", seed=0)


def test_retention_keeps_the_healthy_checkpoint_whatever_keep_last(tmp_path):
    d = tmp_path / "c"
    for step in (3, 6, 9):
        make_ckpt(d, step)
    assert prune(d, keep_last=1, healthy="step_3") == ["step_6"]
    assert sorted(p.name for p in d.iterdir()) == ["step_3", "step_9"]


def test_a_checkpoint_is_healthy_once_the_step_after_it_read_clean_and_divergence_quarantines_the_rest(tmp_path):
    d = tmp_path / "c"
    mgr = manager(d)
    for step in (3, 6, 9):
        make_ckpt(d, step)
        write_latest(d, f"step_{step}")
        mgr._unconfirmed.append(step)  # what maybe_save records after a save
        if step == 3:
            mgr.confirm(4)  # the read at step 4 covered step 4, whose loss measured step_3's weights
    mgr.confirm(9)  # a read at step 9 confirms step_6, not step_9 (its weights are not measured yet)
    assert mgr.healthy == "step_6"
    assert mgr.quarantine(first_step=10) == ["step_9"]  # flagged at 10: step_9's weights led there
    assert sorted(p.name for p in d.iterdir()) == ["latest", "step_3", "step_6", "step_9_diverged"]
    assert read_latest(d) == "step_6" and mgr.healthy == "step_6"
    assert mgr.quarantine(first_step=7) == ["step_6"] and read_latest(d) == "step_3" and mgr.healthy is None
