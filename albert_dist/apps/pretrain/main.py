"""`albert-dist train`: the app's main (preflight checks, exit codes, try/finally around the job; the arguments are
`albert_dist.cli.train`'s).

    albert-dist train --config configs/pretrain/<recipe>.yaml [dotted.key=value ...] [--resume auto|PATH]

Works under the deepspeed launcher (`deepspeed --num_gpus N --no_local_rank --module albert_dist.cli train
...`; without `--no_local_rank`, `albert_dist.cli` takes the launcher's `--local_rank` away), torchrun, srun,
and plain `python -m albert_dist.cli train ...` (one rank); gloo on CPU, nccl on GPU
(`albert_dist.distributed.group`). The config, the batch arithmetic for the launcher's world size, the input
files, the checkpoint to resume (and what the config's changes mean there) and the memory fit are checked
before any process group starts (`albert_dist.apps.pretrain.preflight`; a bad one: exit code 2, one line, nothing started);
rank 0 also takes the run directory's lock there (`albert_dist.job.lock`: a second job on it is refused
the same way, naming the holder), naming the directory first when `run_dir` is unset. The ranks
agree on the verdict over the rendezvous store before any of them starts the process group
(`albert_dist.distributed.rendezvous`), so a refusal on any rank ends every rank at once; then
`albert_dist.apps.pretrain.trainer.Trainer` runs the job.

Exit codes (`albert_dist.exit_codes`), decided here and nowhere else: 0 done, 1 crash (the traceback logged
once, on the rank that failed; every rank ends within a bound, `albert_dist.job.stop.exit_deadline`), 2
config/input error or run directory in use, 74 a checkpoint could not be written (disk full, ...), 75 stopped
by SIGTERM/SIGUSR1/SIGINT after a checkpoint (`albert_dist.job.stop`; a requeue script reruns with
`--resume auto`), or the object store stayed unavailable for ``data.store_retry_s`` (after a checkpoint when a
training loader gave up: `albert_dist.apps.pretrain.trainer`; elsewhere, one line: the last checkpoint is where a rerun starts),
76 a rank stopped making progress (`albert_dist.job.watchdog`: its line names the rank; an error of a collective
after it fired is the hang's too),
77 training diverged and the policy stopped it (`albert_dist.engine.divergence`: one line on rank 0 naming the step
and the newest healthy checkpoint; no final model; the MLflow run ends FAILED),
78 a training file or object of the plan is gone (`InputVanished`: one line; after a checkpoint when the source is
an object store, whose batches are fetched before the stop agreement).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from albert_dist.config import load_config
from albert_dist.apps.pretrain.init_from import read_source
from albert_dist.runs.source import FINAL_MODEL
from albert_dist.engine.checkpoint.drift import ConfigDriftError
from albert_dist.engine.checkpoint.layout import CheckpointError
from albert_dist.engine.checkpoint.save import CheckpointSaveError
from albert_dist.engine.divergence import TrainingDiverged
from albert_dist.distributed.env import DistEnv, discover
from albert_dist.distributed.rendezvous import PreflightRefused, agree, open_store
from albert_dist.job.console import configure_logging
from albert_dist.job.lock import RunDirLock
from albert_dist.job.stop import StopFlag, end_rank, exit_deadline, peer_failure
from albert_dist.job import watchdog
from albert_dist.exit_codes import (EXIT_CONFIG_ERROR, EXIT_CRASHED, EXIT_DIVERGED, EXIT_HUNG, EXIT_INPUT_VANISHED,
                                   EXIT_OK, EXIT_PREEMPTED, EXIT_SAVE_FAILED, InputVanished, TryAgainLater,
                                   error_line)
from albert_dist.apps.pretrain.preflight import preflight
from albert_dist.apps.pretrain.trainer import Trainer
from albert_dist.tracking.tracker import RunMovedOn

logger = logging.getLogger(__name__)

#: What a refused job raises: before the process group these are exit code 2 with one line.
_REFUSED = (ValueError, FileNotFoundError, CheckpointError)


def main(config: str, overrides: Sequence[str] = (), resume_from: Optional[str] = None) -> int:
    """The app's main (`albert-dist train`; its front end is `albert_dist.cli.train`): train the recipe at
    `config` with dotted `overrides` (``checkpoint.resume=auto`` for ``--resume auto``), or continue the MLflow
    run `resume_from`. Returns the exit code (see the module docstring) and never exits: the one place where
    exceptions become exit codes (`_exit_code`), and where the job is closed (tracker ended with FINISHED/KILLED/FAILED,
    loader workers stopped, process group destroyed) whatever happens."""
    overrides = list(overrides)
    trainer: Optional[Trainer] = None
    locks: list[RunDirLock] = []
    status = "FAILED"
    # Stop signals from the start: one during the preflight stops the job after its first step, and a launcher's
    # SIGTERM to the ranks still running when one exits cannot make their own exit code a signal's (see finally).
    stop = StopFlag()
    stop.install()
    multi_rank = False
    env = None  # until discovered: a rank that cannot tell its place prints its own refusal
    try:
        env = discover()
        multi_rank = env.world_size > 1
        configure_logging(env.rank)
        # Before anything that may fail: a rank 0 refusing the job can still tell the other ranks, which would
        # otherwise wait in the rendezvous for the process-group timeout (albert_dist.distributed.rendezvous).
        store = open_store(env)
        error: Optional[Exception] = None
        try:
            cfg = load_config(config, overrides, read_source)
            # inputs, --resume-from, the job's plan, the memory fit, rank 0's run-dir locks (albert_dist.apps.pretrain.preflight)
            plan, locks = preflight(cfg, env, resume_from, recipe_name=Path(config).stem)
            trainer = Trainer(plan, resume_from=resume_from, store=store, stop=stop)
        except Exception as err:  # noqa: BLE001 - every rank must hear of it; re-raised below
            error = err
        agree(store, env, None if error is None else str(error).strip() or type(error).__name__)
        if error is not None:
            raise error
        trainer.setup()
        code = trainer.train()
        status = "FINISHED" if code == EXIT_OK else "KILLED"
        if code == EXIT_OK:
            trainer.export_trained_model()
        if trainer.dist_env.rank == 0:
            logger.info("outputs in %s (config.yaml, ds_config.json, metrics.jsonl, checkpoints/%s)",
                        trainer.run_dir.resolve(), f", {FINAL_MODEL}/" if code == EXIT_OK else "")
        return code
    except Exception as err:  # noqa: BLE001 - every error becomes the exit code, in one place
        return _exit_code(err, env, trainer)
    finally:
        try:
            if trainer is not None:
                trainer.close(status)
        finally:
            for lock in locks:  # last: the run directory is free once the job is closed
                lock.release()
            if multi_rank:  # the exit code is decided: a rank of a job keeps absorbing stop signals to its end
                stop.retire()
            else:  # one process (also a caller's own, e.g. a test): as it was
                stop.restore()


def _exit_code(err: Exception, env: Optional[DistEnv], trainer: Optional[Trainer]) -> int:
    """The exit code of a job `main` ended with `err` (called in its except clause: a traceback logged here is
    `err`'s), after logging or printing its one line; `env` is this rank's place (None when it could not be
    discovered), `trainer` the job's (None before it was built)."""
    # Every error after the process group started: this rank ends within a bound whatever its cleanup waits on
    # (albert_dist.job.stop.exit_deadline); its peers' collectives then fail, and they end the same way.
    if isinstance(err, watchdog.JobHung) or watchdog.fired() is not None:  # its line is logged: no traceback
        exit_deadline(EXIT_HUNG)
        logger.warning("ended by the hang watchdog (%s: %s); exit %d", type(err).__name__,
                       (str(err).strip().splitlines() or [""])[0][:200], EXIT_HUNG)
        return EXIT_HUNG
    if isinstance(err, TryAgainLater):  # a store down outside the training loader (preflight, validation): one line
        if trainer is None or not trainer.started:
            print(error_line("albert-dist train", err), file=sys.stderr)
            return EXIT_PREEMPTED
        exit_deadline(EXIT_PREEMPTED)
        logger.error("%s; exit %d (--resume auto continues from the last checkpoint)", err, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    if isinstance(err, InputVanished):  # a local training file gone (no prefetch: no checkpoint at the stop), or
        # a validation file: one line, the newest checkpoint intact
        if trainer is None or not trainer.started:
            print(error_line("albert-dist train", err), file=sys.stderr)
            return EXIT_INPUT_VANISHED
        exit_deadline(EXIT_INPUT_VANISHED)
        logger.error("%s; exit %d (restore it, then --resume auto continues from the newest checkpoint; or start a "
                     "new run_dir on the corpus as it is now)", err, EXIT_INPUT_VANISHED)
        return EXIT_INPUT_VANISHED
    if isinstance(err, TrainingDiverged):  # every rank raised it at the same step: rank 0's one line
        exit_deadline(EXIT_DIVERGED)
        if env is None or env.rank == 0:
            logger.error("%s; exit %d", err, EXIT_DIVERGED)
        return EXIT_DIVERGED
    if isinstance(err, CheckpointSaveError):  # one line: the path and the errno say it all
        exit_deadline(EXIT_SAVE_FAILED)
        logger.error("%s; exit %d", err, EXIT_SAVE_FAILED)
        return EXIT_SAVE_FAILED
    if isinstance(err, _REFUSED):
        if isinstance(err, PreflightRefused) or trainer is None or not trainer.started:
            # Refused before any process group: nothing ran. One line for the job (a launcher merges the ranks'
            # output: 64 ranks refusing one config printed it 64 times): rank 0's, which holds the verdict, its
            # own refusal or the first other rank's ("rank k: ..."); the other ranks exit 2 silently.
            if env is None or env.rank == 0:
                print(error_line("albert-dist train", err), file=sys.stderr)
            return EXIT_CONFIG_ERROR
        if isinstance(err, (ConfigDriftError, RunMovedOn)):  # --resume-from: the downloaded checkpoint's config
            # differs; --resume auto: the MLflow run went on from another directory (one line, nothing trained)
            exit_deadline(EXIT_CONFIG_ERROR)
            logger.error("%s", err)
            return EXIT_CONFIG_ERROR
        exit_deadline(EXIT_CRASHED)
        logger.exception("training failed")
        return EXIT_CRASHED
    exit_deadline(EXIT_CRASHED)
    if peer_failure(err):  # another rank failed first: its traceback is the job's one
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        logger.error("a collective failed because another rank stopped (its log has the cause): %s: %s; exit %d",
                     type(err).__name__, first, EXIT_CRASHED)
    else:
        logger.exception("training failed")  # the one traceback
    return EXIT_CRASHED


def end_process(code: int) -> None:
    """After `main` returned `code`: a rank of a multi-rank job exits at once with it, without the interpreter's
    finalization (`albert_dist.job.stop.end_rank`: a finished rank could abort in the teardown of gloo's
    and DeepSpeed's C++ objects); a single process returns, so an in-process caller keeps its interpreter."""
    try:
        multi_rank = discover().world_size > 1
    except ValueError:  # no consistent job environment: main already said so; nothing to end early
        return
    if multi_rank:
        end_rank(code)


__all__ = ["main", "EXIT_OK", "EXIT_CRASHED", "EXIT_CONFIG_ERROR", "EXIT_SAVE_FAILED", "EXIT_PREEMPTED", "EXIT_HUNG",
           "EXIT_DIVERGED",
           "end_process"]
