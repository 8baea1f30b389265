"""One rank of a ZeRO-3 reshard test job: the real `Trainer`, dumping the full optimiser state.

    python tests/distributed/reshard_worker.py --config C [--dump-load PATH] [--dump-end PATH] [--no-guard] [k=v ...]

RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT come from the environment (as torchrun sets them).
--dump-load PATH: right after setup (i.e. right after a resume), --dump-end PATH: after training; every rank
joins DeepSpeed's collective gathers and rank 0 saves {"step", "params": {name: (fp32 parameter, exp_avg,
exp_avg_sq)}, "groups": every param group's hyper-parameters} to PATH. --no-guard: skip
`albert_dist.engine.optim.repair_optimizer_after_load` (the control: DeepSpeed's own load).
"""
from __future__ import annotations

import argparse
import sys

import pytest
import torch


def dump_state(trainer, path: str) -> None:
    """Full fp32 parameters and Adam moments (DeepSpeed's safe_get_full_*, collective) and group hparams."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from albert_dist.engine.optim import group_hyperparameters

    out = {"step": trainer.step, "params": {}, "groups": group_hyperparameters(trainer.engine.optimizer)}
    for name, param in trainer.engine.module.named_parameters():
        out["params"][name] = (safe_get_full_fp32_param(param).clone(),
                               safe_get_full_optimizer_state(param, "exp_avg").clone(),
                               safe_get_full_optimizer_state(param, "exp_avg_sq").clone())
    if trainer.dist_env.rank == 0:
        torch.save(out, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--dump-load")
    parser.add_argument("--dump-end")
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import deepspeed.ops

    from albert_dist.config import load_config
    from albert_dist.engine import optim
    from albert_dist.engine.trainer import Trainer

    trainer = Trainer(load_config(args.config, args.overrides))
    with pytest.MonkeyPatch.context() as mp:
        # Plain gloo collectives instead of DeepSpeed's JIT-built shared-memory op (see ckpt_worker.py).
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
        if args.no_guard:
            mp.setattr(optim, "repair_optimizer_after_load", lambda engine, expected: [])
        try:
            trainer.setup()
            if args.dump_load:
                dump_state(trainer, args.dump_load)
            code = trainer.train()
            if args.dump_end:
                dump_state(trainer, args.dump_end)
        finally:
            trainer.close("FINISHED")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
