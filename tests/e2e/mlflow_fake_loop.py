"""A stand-in training job for the MLflow e2e tests: N ranks (gloo), the real `MLflowTracker`, fake
checkpoints, deterministic metrics (loss = 10 / step, mlm_accuracy = step / 100) so the tests can check
every logged value.

Run by the tests as one process per rank with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set:
    python mlflow_fake_loop.py --run-dir D --steps 10 --save-every 4 [--resume-from RUN] [--crash-after N]
The tracking URI comes from $MLFLOW_TRACKING_URI. Prints ``RUN_ID=<id>`` on every rank (``None`` while the
server has not answered).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time

import torch
import torch.distributed as dist

from albert_dist.tracking.checkpoints import download_checkpoint
from albert_dist.tracking.config import TrackingConfig
from albert_dist.tracking.tracker import MLflowTracker, parse_run_ref


def loss_at(step: int) -> float:
    return 10.0 / step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--experiment", default="fake_loop")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--resume-from", default=None)
    p.add_argument("--crash-after", type=int, default=None)
    p.add_argument("--connect-timeout", type=float, default=30.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s")
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = TrackingConfig(experiment_name=args.experiment, flush_interval_s=0.2, retry_backoff_s=0.2,
                         max_backoff_s=2.0, close_timeout_s=120.0, connect_timeout_s=args.connect_timeout,
                         log_system_metrics=False)
    resume = parse_run_ref(args.resume_from) if args.resume_from else None
    tracker = MLflowTracker(cfg, run_dir=args.run_dir, rank=rank, world_size=world, resume_run_id=resume)
    print(f"RUN_ID={tracker.run_id}", flush=True)
    ckpt_root = os.path.join(args.run_dir, "checkpoints")
    start = 0
    if resume is not None:
        if rank == 0:
            step, tag_dir = download_checkpoint(tracker._client, resume, ckpt_root)
        if world > 1:
            dist.barrier()
        with open(os.path.join(ckpt_root, open(os.path.join(ckpt_root, "latest")).read(), "state.json")) as f:
            start = json.load(f)["step"]
        for r in range(world):  # every rank's shard came back
            assert os.path.exists(os.path.join(ckpt_root, f"step_{start}", f"rank{r}.pt"))
    tracker.log_params({"model": {"hidden_size": 8, "num_hidden_groups": 2},
                        "derived": {"world_size": world}})
    for step in range(start + 1, args.steps + 1):
        x = torch.tensor([float(rank)])
        if world > 1:
            dist.all_reduce(x)
        tracker.log_metrics({"loss": loss_at(step), "mlm_accuracy": step / 100.0}, step)
        if step % args.save_every == 0:
            tag_dir = os.path.join(ckpt_root, f"step_{step}")
            os.makedirs(tag_dir, exist_ok=True)
            torch.save({"rank": rank, "w": torch.full((1000,), float(step))}, os.path.join(tag_dir, f"rank{rank}.pt"))
            if rank == 0:
                with open(os.path.join(tag_dir, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
            if world > 1:
                dist.barrier()
            tracker.log_checkpoint(tag_dir, step)
        if args.crash_after == step:
            if rank == 0:  # the newest checkpoint reached the server, then the job dies (no close)
                saved = step - step % args.save_every
                end = time.monotonic() + 60
                while saved not in tracker.checkpoints_uploaded and time.monotonic() < end:
                    time.sleep(0.1)
            if world > 1:
                dist.barrier()
            os._exit(3)
    tracker.close("FINISHED")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
