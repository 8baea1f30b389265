"""The trainer's record at a log step counts the optimizer steps DeepSpeed skipped (inf/NaN gradients), which
DeepSpeed itself does silently while the step counter advances, and warns when the count rises."""
from __future__ import annotations

import logging
import time
import types

import torch

from albert_dist.apps.pretrain import trainer as T
from albert_dist.config import TrainConfig
from albert_dist.engine import metric_names as names
from albert_dist.distributed.env import DistEnv


class Interval:
    """`MetricAccumulator.reduce`'s record of a quiet interval."""

    def reduce(self) -> dict[str, float]:
        return {**{q: 1.0 for q in names.EVAL_QUANTITIES}, "mlm_dropped": 0.0, "grad_norm": 1.0,
                "tokens_per_s": 1.0, "samples_per_s": 1.0, "positions_per_s": 1.0, "data_wait_s": 0.0,
                "data_wait_share": 0.0}


def test_skipped_steps_are_logged_and_a_rise_is_warned(caplog):
    trainer = object.__new__(T.Trainer)
    logged: list[tuple[int, dict]] = []
    trainer.cfg = TrainConfig(max_steps=10, log_interval_steps=5)
    trainer.dist_env = DistEnv(0, 1, 0, 1, 0, "127.0.0.1", 29500)
    trainer.device, trainer.flops_per_position = torch.device("cpu"), 1.0
    trainer.peaks = T.Peaks(1.0, "given", 1.0, "given")
    trainer.tracker = types.SimpleNamespace(log_metrics=lambda record, step: logged.append((step, record)))
    trainer._pace = (time.perf_counter(), 0)
    trainer.engine = types.SimpleNamespace(skipped_steps=1)  # one skipped before a resume: DeepSpeed restores it
    trainer._skipped_seen = 1
    with caplog.at_level(logging.WARNING, logger=T.__name__):
        trainer.step = 5
        trainer._log_train(Interval(), 1e-3, 1.0)
        assert not caplog.records
        trainer.engine.skipped_steps, trainer.step = 3, 10  # two more in steps 6-10
        trainer._log_train(Interval(), 1e-3, 1.0)
    assert [(step, rec[names.TRAIN_SKIPPED_STEPS]) for step, rec in logged] == [(5, 1.0), (10, 3.0)]
    assert [r.getMessage() for r in caplog.records] == [
        "2 optimizer step(s) up to step 10 skipped by DeepSpeed (inf/NaN gradients): no weight update and no "
        "learning-rate step for them; 3 skipped in all"]
