"""`albert-dist train`: the app's main (arguments, preflight checks, exit codes, try/finally around the job).

    albert-dist train --config configs/pretrain/<recipe>.yaml [dotted.key=value ...] [--resume auto|PATH]

Works under the deepspeed launcher (`deepspeed --num_gpus N --no_local_rank --module albert_dist.cli train
...`; without `--no_local_rank`, `albert_dist.cli` takes the launcher's `--local_rank` away), torchrun, srun,
and plain `python -m albert_dist.cli train ...` (one rank); gloo on CPU, nccl on GPU
(`albert_dist.engine.distributed`). The config, the batch arithmetic for the launcher's world size, the input
files and the checkpoint to resume (and what the config's changes mean there) are checked before any process
group starts (a bad one: exit code 2, one line, nothing started); then `albert_dist.trainer.Trainer` runs the job.

Exit codes (`albert_dist.exit_codes`), decided here and nowhere else: 0 done, 1 crash (the traceback logged
once), 2 config/input error, 74 a checkpoint could not be written (disk full, ...), 75 stopped by
SIGTERM/SIGUSR1 after a checkpoint (`albert_dist.engine.stop`; a requeue script reruns with `--resume auto`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from albert_dist.config import TrainConfig, load_config
from albert_dist.data.files import check_text_field
from albert_dist.data.paths import discover_files
from albert_dist.data.tokenizer import load_tokenizer
from albert_dist.engine import checkpoint as ckpt
from albert_dist.engine import memory
from albert_dist.engine.distributed import discover, setup_logging
from albert_dist.exit_codes import (EXIT_CONFIG_ERROR, EXIT_CRASHED, EXIT_OK, EXIT_PREEMPTED, EXIT_SAVE_FAILED,
                                   error_line)
from albert_dist.tracking.tracker import parse_run_ref
from albert_dist.trainer import Trainer

logger = logging.getLogger(__name__)

#: What a refused job raises: before the process group these are exit code 2 with one line.
_REFUSED = (ValueError, FileNotFoundError, ckpt.CheckpointError)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="albert-dist train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="recipe YAML, e.g. configs/pretrain/albert-tiny-wikitext.yaml")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': continue from the newest complete checkpoint of run_dir (start fresh if none); "
                             "PATH: a checkpoint directory or step_<N> directory")
    parser.add_argument("--resume-from", default=None, metavar="RUN_ID|runs:/RUN_ID",
                        help="continue an MLflow run: download its newest complete checkpoint, resume exactly, "
                             "keep logging into the same run (albert_dist.tracking)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. engine.zero_stage=3")
    return parser.parse_intermixed_args(list(argv))


def cli(argv: Sequence[str]) -> int:
    """Entry point of `albert-dist train` (the app's main); returns the exit code (see the module docstring)
    and never exits: the one place where exceptions become exit codes, and where the job is closed (tracker
    ended with FINISHED/KILLED/FAILED, loader workers stopped, process group destroyed) whatever happens."""
    args = _parse_args(argv)
    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={args.resume}")
    trainer: Optional[Trainer] = None
    status = "FAILED"
    try:
        setup_logging(discover().rank)
        cfg = load_config(args.config, overrides)
        check_inputs(cfg)
        if args.resume_from is not None:
            check_resume_from(args.resume_from, cfg)
        trainer = Trainer(cfg, recipe_name=Path(args.config).stem, resume_from=args.resume_from)
        memory.preflight(cfg, trainer.dist_env.world_size, trainer.dist_env.local_rank,  # the memory line; exit 2
                         log=trainer.dist_env.rank == 0)  # on a GPU it exceeds
        trainer.setup()
        code = trainer.train()
        status = "FINISHED" if code == EXIT_OK else "KILLED"
        if code == EXIT_OK:
            trainer.export_final_model()
        if trainer.dist_env.rank == 0:
            logger.info("outputs in %s (config.yaml, ds_config.json, metrics.jsonl, checkpoints/%s)",
                        trainer.run_dir.resolve(), ", final_model/" if code == EXIT_OK else "")
        return code
    except ckpt.CheckpointSaveError as err:  # one line: the path and the errno say it all
        logger.error("%s; exit %d", err, EXIT_SAVE_FAILED)
        return EXIT_SAVE_FAILED
    except _REFUSED as err:
        if trainer is None or not trainer.started:  # refused before any process group: nothing ran
            print(error_line("albert-dist train", err), file=sys.stderr)
            return EXIT_CONFIG_ERROR
        if isinstance(err, ckpt.ConfigDriftError):  # --resume-from: the downloaded checkpoint's config differs
            logger.error("%s", err)
            return EXIT_CONFIG_ERROR
        logger.exception("training failed")
        return EXIT_CRASHED
    except Exception:
        logger.exception("training failed")  # the one traceback
        return EXIT_CRASHED
    finally:
        if trainer is not None:
            trainer.close(status)


def check_resume_from(ref: str, cfg: TrainConfig) -> None:
    """`--resume-from` names an MLflow run and tracking is on (its checkpoint is fetched after the process group).

    Raises:
        ValueError: naming `--resume-from` and the value, or `tracking.enabled`.
    """
    try:
        parse_run_ref(ref)
    except ValueError as err:
        raise ValueError(f"--resume-from: {err}") from err
    if not cfg.tracking.enabled:
        raise ValueError("--resume-from needs tracking.enabled=true")


def check_inputs(cfg: TrainConfig) -> None:
    """Check the files a job reads before any process group starts, so a typo is exit code 2 with one line.

    Checks every local data source (paths exist, globs match, formats known, not only 0-byte files,
    jsonl/parquet records hold `text_field`; `albert_dist.data.paths.discover_files`,
    `albert_dist.data.files.check_text_field`), the
    tokenizer (exists, ALBERT's special ids, at most `model.vocab_size` pieces: a larger vocabulary would
    index past the embedding table) and `data.max_seq_length <= model.max_position_embeddings` (same reason).
    The checkpoint to resume is checked when the `Trainer` is built (`ckpt.resume_plan`).

    Raises:
        ValueError: naming the field and value (data.train[i].paths, data.tokenizer_path, model.vocab_size,
            data.max_seq_length).
    """
    for split in ("train", "validation"):
        for i, src in enumerate(getattr(cfg.data, split)):
            if src.format != "hub":  # hub datasets are resolved (and fail) when streamed
                where = f"data.{split}[{i}]"
                files = discover_files(src, where)
                check_text_field(src, where, files)
                if all(os.path.getsize(f) == 0 for f in files):
                    raise ValueError(f"{where}: {src.paths!r} holds only empty files ({len(files)} files)")
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


__all__ = ["EXIT_OK", "EXIT_CRASHED", "EXIT_CONFIG_ERROR", "EXIT_SAVE_FAILED", "EXIT_PREEMPTED", "check_inputs",
           "check_resume_from", "cli"]
