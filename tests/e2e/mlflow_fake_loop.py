"""A stand-in training job for the MLflow e2e tests: the app's tracker (`albert_dist.apps.pretrain.run_tracking.open_tracker`,
one rank), fake checkpoints, deterministic metrics (loss = 10 / step, mlm_accuracy = step / 100) so the tests
can check every logged value.

    python mlflow_fake_loop.py --run-dir D --steps 10 --save-every 4 [--connect-timeout S]

The tracking URI comes from $MLFLOW_TRACKING_URI. Prints ``RUN_ID=<id>`` (``None`` while the server has not
answered).
"""
from __future__ import annotations

import argparse
import logging
import os

import torch

from albert_dist.apps.pretrain.run_tracking import open_tracker
from albert_dist.tracking.config import TrackingConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--experiment", default="fake_loop")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--connect-timeout", type=float, default=30.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = TrackingConfig(experiment_name=args.experiment, flush_interval_s=0.2, retry_backoff_s=0.2,
                         max_backoff_s=2.0, close_timeout_s=120.0, connect_timeout_s=args.connect_timeout,
                         log_system_metrics=False)
    tracker = open_tracker(cfg, args.run_dir, rank=0)
    print(f"RUN_ID={tracker.run_id}", flush=True)
    tracker.log_params({"model": {"hidden_size": 8, "num_hidden_groups": 2}, "derived": {"world_size": 1}})
    for step in range(1, args.steps + 1):
        tracker.log_metrics({"loss": 10.0 / step, "mlm_accuracy": step / 100.0}, step)
        if step % args.save_every == 0:
            tag_dir = os.path.join(args.run_dir, "checkpoints", f"step_{step}")
            os.makedirs(tag_dir, exist_ok=True)
            torch.save({"w": torch.full((1000,), float(step))}, os.path.join(tag_dir, "rank0.pt"))
            tracker.log_checkpoint(tag_dir, step)
    tracker.close("FINISHED")


if __name__ == "__main__":
    main()
