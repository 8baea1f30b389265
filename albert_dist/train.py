"""`albert-dist train`: the app around the training loop (arguments, preflight checks, exit codes).

    albert-dist train --config configs/pretrain/<recipe>.yaml [dotted.key=value ...] [--resume auto|PATH]

Works under the deepspeed launcher (`deepspeed --num_gpus N --no_local_rank --module albert_dist.cli train
...`), torchrun, srun, and plain `python -m albert_dist.cli train ...` (one rank); gloo on CPU, nccl on GPU
(`albert_dist.engine.distributed`). The config, the batch arithmetic for the launcher's world size and the
input files are checked here before any process group starts (bad config: exit code 2, nothing started);
then `albert_dist.trainer.Trainer` runs the job.

Exit codes (`albert_dist.exit_codes`): 0 done, 1 crash, 2 config/input error, 74 a checkpoint could not be
written (disk full, ...), 75 stopped by SIGTERM/SIGUSR1
after a checkpoint (`albert_dist.engine.stop`; a requeue script reruns with `--resume auto`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from albert_dist.config import TrainConfig, check_derived, load_config
from albert_dist.engine import checkpoint as ckpt
from albert_dist.engine import memory
from albert_dist.engine.deepspeed_config import build_deepspeed_config
from albert_dist.engine.distributed import discover, setup_logging
from albert_dist.trainer import Trainer
from albert_dist.exit_codes import EXIT_CONFIG_ERROR, EXIT_CRASHED, EXIT_OK, EXIT_PREEMPTED, EXIT_SAVE_FAILED


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="albert-dist train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': continue from the newest complete checkpoint of run_dir (start fresh if none); "
                             "PATH: a checkpoint directory or step_<N> directory")
    # The deepspeed launcher appends --local_rank unless started with --no_local_rank; LOCAL_RANK is in the env.
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resume-from", default=None, metavar="RUN_ID|runs:/RUN_ID",
                        help="continue an MLflow run: download its newest complete checkpoint, resume exactly, "
                             "keep logging into the same run (albert_dist.tracking)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. engine.zero_stage=3")
    return parser.parse_intermixed_args(list(argv))


def cli(argv: Sequence[str]) -> int:
    """Entry point of `albert-dist train`; returns the exit code (see the module docstring). Never exits."""
    args = _parse_args(argv)
    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={args.resume}")
    try:
        env = discover()
        setup_logging(env.rank)
        cfg = load_config(args.config, overrides)
        check_derived(cfg, env.world_size)
        build_deepspeed_config(cfg.engine, env.world_size)  # precision / accelerator checks
        check_inputs(cfg)
        memory.preflight(cfg, env.world_size, env.local_rank, log=env.rank == 0)  # the memory line; refusal on a GPU
        if cfg.checkpoint.resume == "auto" and cfg.run_dir is None and cfg.checkpoint.dir is None:
            raise ValueError("--resume auto needs a fixed place to look: set run_dir=... (or checkpoint.dir=...)")
        if args.resume_from is not None:  # MLflow resume: checked here, before any process group
            from albert_dist.tracking.tracker import parse_run_ref

            try:
                parse_run_ref(args.resume_from)
            except ValueError as err:
                raise ValueError(f"--resume-from: {err}") from err
            if not cfg.tracking.enabled:
                raise ValueError("--resume-from needs tracking.enabled=true")
        planned = args.resume_from is None  # an MLflow run's checkpoint is fetched after the process group
        point = plan_checkpoint_resume(cfg, env.world_size, log=env.rank == 0) if planned else None
    except (ValueError, FileNotFoundError, ckpt.CheckpointError) as err:
        print(f"albert-dist train: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    trainer = Trainer(cfg, recipe_name=Path(args.config).stem, resume_from=args.resume_from,
                      resume_point=point, resume_planned=planned)
    return trainer.run()


def plan_checkpoint_resume(cfg: TrainConfig, world_size: int, log: bool = True) -> Optional[ckpt.ResumePoint]:
    """The checkpoint `checkpoint.resume` names (`ckpt.plan_resume`: the newest one that verifies), checked
    against the config (`ckpt.check_drift`), before any process group; None for a fresh start.

    Raises:
        ckpt.ConfigDriftError: a model field differs from the checkpoint's (every such field, both values).
        ckpt.CheckpointError: the checkpoint (or every checkpoint of the directory) does not verify.
        FileNotFoundError: an explicit `checkpoint.resume` path holds no checkpoint.
    """
    from albert_dist.config import to_container

    resume = cfg.checkpoint.resume
    if resume is None:
        return None
    ckpt_dir = cfg.checkpoint.dir or (str(Path(cfg.run_dir) / "checkpoints") if cfg.run_dir else None)
    if resume == "auto" and ckpt_dir is None:
        raise ValueError("--resume auto needs a fixed place to look: set run_dir=... (or checkpoint.dir=...)")
    point = ckpt.plan_resume(resume, ckpt_dir or resume, log=log)
    if point is not None:
        ckpt.check_drift(point, to_container(cfg), world_size)
    return point


def check_inputs(cfg: TrainConfig) -> None:
    """Check the files a job reads before any process group starts, so a typo is exit code 2 with one line.

    Checks every local data source (paths exist, globs match, jsonl/parquet records hold `text_field`;
    `albert_dist.data.sources.discover_files`, `check_text_field`), the
    tokenizer (exists, ALBERT's special ids, at most `model.vocab_size` pieces: a larger vocabulary would
    index past the embedding table) and `data.max_seq_length <= model.max_position_embeddings` (same reason).
    The checkpoint to resume is checked by `plan_checkpoint_resume`.

    Raises:
        ValueError: naming the field and value (data.train[i].paths, data.tokenizer_path, model.vocab_size,
            data.max_seq_length).
    """
    from albert_dist.data.sources import check_text_field, discover_files
    from albert_dist.data.tokenizer import load_tokenizer

    for split in ("train", "validation"):
        for i, src in enumerate(getattr(cfg.data, split)):
            if src.format != "hub":  # hub datasets are resolved (and fail) when streamed
                where = f"data.{split}[{i}]"
                check_text_field(src, where, discover_files(src, where))
    if cfg.data.max_seq_length > cfg.model.max_position_embeddings:  # positions past the table: IndexError
        raise ValueError(f"data.max_seq_length ({cfg.data.max_seq_length}) must be <= "
                         f"model.max_position_embeddings ({cfg.model.max_position_embeddings})")
    try:
        pieces = load_tokenizer(cfg.data.tokenizer_path).get_piece_size()
    except ValueError as exc:  # the loader knows the file, not the config field that named it
        raise ValueError(f"data.tokenizer_path: {exc}") from None
    if pieces > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the {pieces} pieces of "
                         f"data.tokenizer_path {cfg.data.tokenizer_path!r}")


__all__ = ["EXIT_OK", "EXIT_CRASHED", "EXIT_CONFIG_ERROR", "EXIT_SAVE_FAILED", "EXIT_PREEMPTED", "check_inputs", "cli",
           "plan_checkpoint_resume"]
