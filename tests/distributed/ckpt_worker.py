"""One rank of a checkpoint test job: the real `Trainer`, plus what the tests need to look inside.

    python tests/distributed/ckpt_worker.py --config C [--dump PATH [--dump-at-end]] [--dump-end PATH] [--no-guard]
                                            [--crash-save-step N --crash-rank R] [k=v ...]

RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT come from the environment (as torchrun sets them).
--dump PATH: after setup (i.e. right after a resume) every rank joins DeepSpeed's collective gathers and rank 0
saves {name: fp32 parameter, exp_avg, exp_avg_sq} + step + lr to PATH; with --dump-at-end the same is done
after training instead; --dump-end PATH dumps after training as well (both in one job). The dump also holds
"groups": every param group's hyper-parameters. --no-guard: skip
`albert_dist.engine.optim.repair_optimizer_after_load` (the ZeRO-3 reshard control: DeepSpeed's own load).
--crash-save-step N: rank R dies (os._exit(CRASH_EXIT)) inside the save of step N,
after DeepSpeed wrote its files and before the ranks agree the checkpoint is complete. --enospc-step N: on rank
--enospc-rank, DeepSpeed's writer raises OSError(ENOSPC) for the first file of the save of step N (a full disk
as `write` reports it, after the first bytes), so the save protocol's error handling runs for real.
--fail-phase P (with --fail-rank R, default 1): an exception on rank R only, in phase P: "setup" (the training
loader is built from a saved state whose data fingerprint does not match: loader.py's ValueError, raised in a
DataLoader worker when there are workers), "loop" (the data stream raises at its 4th batch, in a worker when
there are workers), "eval" (the evaluation at step 2 raises), "save" (the save of step 2 raises before its first
collective). The other ranks are then waiting in a collective.
"""
from __future__ import annotations

import argparse
import os
import sys

import pytest
import torch

CRASH_EXIT = 17


def dump_state(trainer, path: str) -> None:
    """Full (unpartitioned) fp32 parameters and Adam moments, gathered by DeepSpeed (collective), and every param
    group's hyper-parameters."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from albert_dist.engine.optim import group_hyperparameters

    optimizer = trainer.engine.optimizer
    if hasattr(optimizer, "_lazy_init_hp_params_optimizer_state"):
        # DeepSpeed 0.19 ZeRO-1/2 links the moments of every group to the parameters' fragments after the
        # *first group's* first step only, so later groups (ALBERT's no-decay group) stay unlinked and
        # safe_get_full_optimizer_state fails for them; link again now that every group has its state.
        optimizer._hp_optimizer_states_linked = False
        optimizer._lazy_init_hp_params_optimizer_state()
    out = {"step": trainer.step, "lr": trainer.engine.get_lr()[0], "params": {},
           "groups": group_hyperparameters(optimizer)}
    for name, param in trainer.engine.module.named_parameters():
        out["params"][name] = (safe_get_full_fp32_param(param).clone(),
                               safe_get_full_optimizer_state(param, "exp_avg").clone(),
                               safe_get_full_optimizer_state(param, "exp_avg_sq").clone())
    if trainer.dist_env.rank == 0:
        torch.save(out, path)


def inject_failure(mp: pytest.MonkeyPatch, phase: str, job: dict) -> None:
    """Make this rank raise in `phase` (see the module docstring); patched before any worker forks."""
    from albert_dist.apps.pretrain import trainer as trainer_module
    from albert_dist.data import loader as data_loader
    from albert_dist.engine.checkpoint import save as ckpt_save
    from albert_dist.apps.pretrain.trainer import Trainer

    stream = data_loader.PretrainingStream
    if phase == "setup":
        build, load = trainer_module.build_train_loader, stream.load_state_dict

        def build_from_saved_state(*args, **kwargs):
            built = build(*args, **kwargs)
            built.load_state_dict(built.state_dict())  # as a resume does: the workers restore the stream's state
            return built

        def stale_state(self, state):  # a state saved under another corpus: the real fingerprint check fails
            return load(self, {**state, "fingerprint": "0123456789abcdef"})

        mp.setattr(trainer_module, "build_train_loader", build_from_saved_state)
        mp.setattr(stream, "load_state_dict", stale_state)
    elif phase == "loop":
        iterate = stream.__iter__

        def failing_stream(self):
            for i, batch in enumerate(iterate(self)):
                if i == 3:
                    raise RuntimeError("injected: the data stream failed at its 4th batch")
                yield batch

        mp.setattr(stream, "__iter__", failing_stream)
    elif phase == "eval":
        evaluate = Trainer.evaluate

        def failing_evaluate(self):
            if self.step >= 2:
                raise RuntimeError(f"injected: evaluation failed at step {self.step}")
            return evaluate(self)

        mp.setattr(Trainer, "evaluate", failing_evaluate)
    elif phase == "save":
        rng_state = ckpt_save.rng_state

        def failing_rng_state():
            step = job["trainer"].step
            if step >= 2:
                raise RuntimeError(f"injected: the save of step {step} failed")
            return rng_state()

        mp.setattr(ckpt_save, "rng_state", failing_rng_state)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--dump")
    parser.add_argument("--dump-at-end", action="store_true")
    parser.add_argument("--dump-end")
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("--crash-save-step", type=int)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--run", action="store_true", help="albert_dist.apps.pretrain.main.main (the app's main and exit codes) "
                                                           "instead of setup/train")
    parser.add_argument("--enospc-step", type=int)
    parser.add_argument("--enospc-rank", type=int, default=0)
    parser.add_argument("--fail-phase", choices=["setup", "loop", "eval", "save"])
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from albert_dist.apps.pretrain import main as train
    from albert_dist.config import load_config
    from albert_dist.engine.checkpoint import save as ckpt_save
    from albert_dist.distributed.env import discover
    from albert_dist.job.console import configure_logging
    from albert_dist.apps.pretrain.preflight import plan_job
    from albert_dist.apps.pretrain.trainer import Trainer

    import deepspeed.ops

    job: dict = {}  # "trainer": the job's Trainer (built by train.main with --run)

    class RecordedTrainer(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            job["trainer"] = self

    with pytest.MonkeyPatch.context() as mp:
        # Plain gloo collectives instead of DeepSpeed's JIT-built shared-memory op: its build takes minutes on
        # a busy machine and a process killed during it (these tests kill ranks) leaves a stale file lock.
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
        if args.crash_save_step is not None:
            barrier = ckpt_save._barrier

            def crashing_barrier() -> None:
                trainer = job["trainer"]
                if trainer.step == args.crash_save_step and trainer.dist_env.rank == args.crash_rank:
                    os._exit(CRASH_EXIT)
                barrier()

            mp.setattr(ckpt_save, "_barrier", crashing_barrier)
        if args.enospc_step is not None:
            import errno

            from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

            save = TorchCheckpointEngine.save

            def full_disk_save(self, state_dict, path):
                trainer = job["trainer"]
                if trainer.step == args.enospc_step and trainer.dist_env.rank == args.enospc_rank:
                    with open(path, "wb") as fh:  # what a full disk leaves: the start of the file
                        fh.write(b"PK\x03\x04")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                return save(self, state_dict, path)

            mp.setattr(TorchCheckpointEngine, "save", full_disk_save)
        if args.fail_phase is not None and int(os.environ.get("RANK", "0")) == args.fail_rank:
            inject_failure(mp, args.fail_phase, job)
        if args.no_guard:
            from albert_dist.engine.checkpoint import load as ckpt_load

            mp.setattr(ckpt_load, "repair_optimizer_after_load", lambda engine, expected: [])
        if args.run:  # the app's main: its exit codes
            mp.setattr(train, "Trainer", RecordedTrainer)
            return train.main(args.config, args.overrides)
        env = discover()
        configure_logging(env.rank)
        cfg = load_config(args.config, args.overrides)
        trainer = RecordedTrainer(plan_job(cfg, env))
        try:
            trainer.setup()
            if args.dump and not args.dump_at_end:
                dump_state(trainer, args.dump)
            code = trainer.train()
            if args.dump and args.dump_at_end:
                dump_state(trainer, args.dump)
            if args.dump_end:
                dump_state(trainer, args.dump_end)
        finally:
            trainer.close("FINISHED")
    return code


if __name__ == "__main__":
    from albert_dist.apps.pretrain.main import end_process

    exit_code = main(sys.argv[1:])
    end_process(exit_code)  # as `albert-dist train` ends a rank of a job (albert_dist.job.stop.end_rank)
    sys.exit(exit_code)
