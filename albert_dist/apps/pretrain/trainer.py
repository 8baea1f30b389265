"""The pretraining loop on a DeepSpeed engine: `Trainer` (the app around it is `albert_dist.apps.pretrain.main`).

One optimiser step = `engine.gradient_accumulation_steps` micro-steps of forward, `engine.backward`,
`engine.step` (DeepSpeed reduces and steps at the last one, because its config carries the same count).
The backward pass of step s takes `mlm_loss + sop_weight_at(cfg.objective, s) * sop_loss`
(`albert_dist.engine.objective`), each normalised over the whole global batch: MLM per masked token, SOP per
labelled sequence (`albert_dist.engine.loss`). Every `log_interval_steps`: losses (``train/loss`` = mlm_loss +
sop_loss, unweighted, so runs with different SOP schedules compare), sop_weight, accuracies, lr, grad norm,
steps DeepSpeed skipped (``train/``), tokens/s, samples/s, MFU (``perf/``) and peak memory (``mem/``) go to
the tracker (rank 0).
Every `eval_interval_steps` and after the last step: validation on the fixed validation set (``val/``); names
in `albert_dist.engine.metric_names`. Every `checkpoint.save_interval_steps` and at the end: a
checkpoint (`albert_dist.engine.checkpoint`).

SIGTERM, SIGUSR1 or SIGINT (`albert_dist.job.stop`): the current step finishes, all ranks agree on stopping at
the same step (a MAX all-reduce of the flag after every step, a host tensor over gloo: no device drain), a
checkpoint is written (recorded as a stop's) and `train()` returns `EXIT_PREEMPTED` (`albert_dist.exit_codes`). A
training source in an object store stops the job the same way when a rank's loader gives up on it
(`albert_dist.data.sources.store.StoreUnavailable`, after ``data.store_retry_s``): such a job fetches the next step's
batches before the agreement (the loader's state taken before them is what the checkpoint saves), so the rank
that has none stops with the others instead of leaving them in the step's collectives. A file or object of the
plan found gone there (`albert_dist.exit_codes.InputVanished`) stops it the same way, with `EXIT_INPUT_VANISHED`.

Divergence (`albert_dist.engine.divergence`): every step adds its loss to flags kept on the device; they are read at
log steps and before every save (`_check_divergence`), so no checkpoint holds flagged weights. Flagged: roll back to
the newest healthy checkpoint and go on past the data since it, or raise `TrainingDiverged` (exit 77).

Hangs: the loop marks each phase (data, forward_backward, optimizer_step, logging, evaluation, checkpoint_save,
stop_agreement) for the hang watchdog `setup()` starts (`albert_dist.job.watchdog`: a rank stopped past
``engine.step_timeout_s`` ends the job with exit 76, named); the collectives time out after it, as a backstop.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from albert_dist.config import TrainConfig, config_hash, to_container, to_yaml
from albert_dist.data.sources import store
from albert_dist.data.loader import build_train_loader, next_batch
from albert_dist.data.pretraining import drop_full_mask
from albert_dist.engine.checkpoint.choose import newest_verified
from albert_dist.engine.checkpoint.layout import read_latest, tag_for
from albert_dist.engine.checkpoint.load import UNIVERSAL_CHECKPOINT_INFO
from albert_dist.engine.checkpoint.manager import CheckpointManager
from albert_dist.engine.checkpoint.resume import LoadPlan, rng_kept
from albert_dist.engine.checkpoint.state import seed_all
from albert_dist.job import console
from albert_dist.engine import metric_names as names
from albert_dist.distributed.collectives import broadcast_object, host_group, is_multi_rank
from albert_dist.distributed.group import init_distributed
from albert_dist.engine.evaluation import Evaluator
from albert_dist.engine.compile import compile_engine, eager
from albert_dist.engine.divergence import (WINDOW_KEY, DivergenceMonitor, TrainingDiverged, Verdict, injected_steps,
                                          saved_window, stream_batches)
from albert_dist.engine.grad_norm import install_exact_clipping
from albert_dist.engine.loss import optimizer_step
from albert_dist.engine.metrics import (MetricAccumulator, Peaks, mfu, peak_memory_bytes, resolve_peaks,
                                       shown_mfu)
from albert_dist.engine.objective import sop_weight_at
from albert_dist.engine.optim import build_optimizer, build_scheduler
from albert_dist.engine.stragglers import StragglerMonitor
from albert_dist.engine.checkpoint.reshard import ReshardedLoader
from albert_dist.job.stop import IgnoreStopSignals, StopFlag, stop_loader_workers
from albert_dist.job.watchdog import FOLDER as WATCHDOG_FOLDER, Allowances, Watchdog
from albert_dist.exit_codes import EXIT_INPUT_VANISHED, EXIT_OK, EXIT_PREEMPTED, InputVanished
from albert_dist.apps.pretrain.init_from import check as check_init_from, load_into
from albert_dist.model import AlbertForPreTraining
from albert_dist.model.flops import pretraining_flops_per_sequence
from albert_dist.apps.pretrain.preflight import JobPlan, load_plan_for
from albert_dist.apps.pretrain.run_tracking import build_tracker, fetch_run_checkpoint, log_trained_model
from albert_dist.tracking.base import JsonlTracker, NullTracker
from albert_dist.tracking.goodput import CHECKPOINT_SAVE, DATA_WAIT, EVALUATION, GoodputRecorder

logger = logging.getLogger(__name__)

#: What a rank whose loader gave up on the object store puts into the stop agreement (above any signal number).
STORE_STOP_FLAG = 128.0
#: ... whose loader found a file or object of its plan gone (`InputVanished`): above the store's, so that the job
#: ends with EXIT_INPUT_VANISHED (not requeued) whatever the other ranks saw.
VANISHED_STOP_FLAG = 256.0
#: The rendezvous store's key of the run directory rank 0's preflight named (`Trainer._run_dir_before_group`).
_RUN_DIR_KEY = "albert_dist/run_dir"


def _in_object_store(cfg: TrainConfig) -> bool:
    """A training source in an object store: its loader may retry for ``data.store_retry_s``."""
    return any(store.is_url(p) for src in cfg.data.train for p in src.paths)


def every(step: int, n: int, last: bool = False) -> bool:
    """The loop's one cadence rule: periodic work (log, eval, save) runs at step `step` when `last` (the final
    step, or a stop) or when `n` > 0 divides `step`. `n` = 0 means only at the last step."""
    return last or (n > 0 and step % n == 0)


class Trainer:
    """One pretraining job in two halves: `__init__` does everything that needs no process group, `setup()` the
    rest; `train()` runs the loop, `export_trained_model()` writes the result, `close()` releases everything.
    `albert_dist.apps.pretrain.main.main` (the app's main) drives them and turns exceptions into exit codes.

    `__init__` (no process group, no files written) takes the job's plan from the preflight, its one maker
    (`albert_dist.apps.pretrain.preflight.preflight`, or its `plan_job` alone: the config as the world size makes
    it, the rank's place, the world-size arithmetic, the DeepSpeed config, the load plan of the checkpoint
    `checkpoint.resume` names and what the config's changes mean there), and neither discovers nor resolves
    them again. It raises
    `ValueError` for a job without a run directory (`run_dir` unset and no plan naming one on rank 0). With
    `resume_from` (an MLflow run, `--resume-from`) the load plan is made in `setup()`, after the download the
    process group makes possible.

    Attributes after `setup()`: `engine` (DeepSpeedEngine), `train_loader`, `step` (optimiser steps done),
    `run_dir`, `ckpt_dir`, `dist_env`, `tracker`, `checkpoints` (the job's `manager.CheckpointManager`), `watchdog`
    (the hang watchdog, stopped when `train()` finishes or in `close()`). Every attribute is declared in `__init__`,
    None until `setup()` builds it (tests/unit/test_trainer_parts.py).
    """

    def __init__(self, plan: JobPlan, resume_from: Optional[str] = None,
                 store: Any = None, stop: Optional[StopFlag] = None):
        self.dist_env = plan.env  # this rank's place, the app's one discovery
        self.cfg: TrainConfig = plan.cfg  # as the world size makes it (gradient_accumulation_steps: auto resolved)
        cfg = self.cfg
        self.store = store  # the job's rendezvous store, opened by the app (albert_dist.distributed.rendezvous)
        self.resume_from = resume_from  # MLflow run to continue (--resume-from)
        self.global_batch, self.ds_config, self.load_plan = plan.global_batch, plan.ds_config, plan.load_plan
        self.train_pieces = plan.train_pieces  # the preflight's plan of the training sources for this world size
        self.init_source = plan.init_source  # model.init_from's source, checked by the preflight
        self._named_run_dir = plan.run_dir  # rank 0 without a fixed run_dir: named and locked by the preflight
        if cfg.run_dir is None and self.dist_env.rank == 0 and plan.run_dir is None:
            raise ValueError("run_dir is unset and no preflight named one (albert_dist.apps.pretrain.preflight.preflight names "
                             "and locks runs/<recipe>-<UTC time> on rank 0): set run_dir")
        self.config, self.config_hash = to_container(cfg), config_hash(cfg)
        self.started = False  # the process group is up: errors are no longer a refused config
        self.step = 0
        self._acc: Optional[MetricAccumulator] = None  # the loop's open metric interval (saved with a checkpoint)
        self._saved_interval: list = []  # a resumed checkpoint's open interval, every saved rank's
        self.tracker: Any = NullTracker()
        # The parts `setup()` builds, None until then (the engine and the loader through the checkpoint manager's
        # resume, `_build_engine` and `_build_loader`)
        self.run_dir: Optional[Path] = None  # the run's directory, agreed by every rank
        self.ckpt_dir: Optional[Path] = None  # checkpoint.directory(run_dir)
        self.checkpoints: Optional[CheckpointManager] = None  # the job's checkpoints: resume, save, rollback
        self.engine: Any = None  # the DeepSpeedEngine
        self.n_params: Optional[int] = None  # the model's parameter count (`_build_engine`)
        self.ga_steps: Optional[int] = None  # micro-steps per optimiser step, DeepSpeed's (`_build_engine`)
        self.train_loader: Any = None  # the training loader, or a `ReshardedLoader` over the saved streams
        self._train_iter: Any = None  # its iterator (the loader workers run while it lives)
        self.device: Optional[torch.device] = None  # the engine's device
        self.flops_per_position: Optional[float] = None  # model FLOPs per trained position, for MFU
        self.peaks: Optional[Peaks] = None  # MFU's denominators (rank 0; unknown elsewhere)
        self._skipped_seen = 0  # DeepSpeed's skipped optimizer steps already reported (`train`, `_log_train`)
        self._pace: Optional[tuple[float, int]] = None  # (perf_counter, step) where `train` started: the ETA
        # The app's (installed before its preflight, kept to the process's end), or the trainer's own
        self._stop, self._own_stop = (stop, False) if stop is not None else (StopFlag(), True)
        self._evaluator: Optional[Evaluator] = None  # built at the first evaluation
        self._loader_state: Optional[dict] = None  # the loader's state before batches fetched ahead (`_prefetch`)
        self._next_batches: list = []
        self._fetch_s = 0.0  # the last `_fetch_step`'s wait for data, seconds
        self._unavailable: Optional[Exception] = None  # StoreUnavailable or InputVanished (`_prefetch`)
        self._store_flag = 0.0  # the agreed flag of the first `_prefetch` (`train`)
        self._host_group: Any = None  # the stop flag's process group (`setup`, `_agree_stop`)
        self._stragglers: Optional[StragglerMonitor] = None  # per-rank step times (`train`, `_log_train`)
        self.divergence: Optional[DivergenceMonitor] = None  # the loop's divergence flags (`train`)
        self.rollbacks = 0  # divergence rollbacks of this job (`_check_divergence`)
        self._skipped_to: Optional[int] = None  # the stream's cursor at the last rollback: what it skipped up to
        self._poison = set(injected_steps())  # the testing switch's steps, each poisoned once (engine/divergence.py)
        self.goodput = GoodputRecorder()  # rank 0's goodput events (`train`, `close`); records nothing until started
        self.watchdog: Optional[Watchdog] = None  # the hang watchdog (`setup` starts it, `train` stops it)
        self.allowances = Allowances(cfg.engine.init_timeout_s, cfg.engine.step_timeout_s,
                                     cfg.data.store_retry_s if _in_object_store(cfg) else 0.0)

    # ----------------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """Start the process group (over `store`, the rendezvous store the app's preflight used, if given to
        `__init__`), resume (`CheckpointManager.resume`: engine, loaders, RNGs, the open metric interval;
        fetching the MLflow run's checkpoint first for `resume_from`), open the tracker."""
        cfg = self.cfg
        # First: a stop signal during start-up is then a stop after the first step, not a traceback per rank.
        self._stop.install()
        # The hang watchdog's timeouts bound the collectives too, with a margin: it fires first (docs/faults.md)
        timeout_s = self.allowances.collective_timeout_s
        if self.store is not None:
            self.store.set_timeout(timedelta(seconds=timeout_s))
        run_dir = self._run_dir_before_group()  # where NCCL's flight recorder dumps (None: known after the group)
        if run_dir is not None:
            (Path(run_dir) / WATCHDOG_FOLDER).mkdir(parents=True, exist_ok=True)
        self.dist_env = init_distributed(store=self.store, timeout_s=timeout_s, flight_recorder_prefix=None
                                         if run_dir is None else str(Path(run_dir) / WATCHDOG_FOLDER / "nccl_trace_rank_"),
                                         dist_env=self.dist_env)
        self.started = True
        self._host_group = host_group(timeout_s)  # the stop flag's (`_agree_stop`)
        rank, world = self.dist_env.rank, self.dist_env.world_size
        self.run_dir = Path(run_dir if run_dir is not None else self._agree_run_dir())
        job = broadcast_object(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) if rank == 0 else None)
        self.watchdog = Watchdog(self.run_dir, job, rank, world, self.allowances).start()
        self.ckpt_dir = Path(cfg.checkpoint.directory(str(self.run_dir)))
        self.checkpoints = CheckpointManager(cfg.checkpoint, self.ckpt_dir, rank=rank, world_size=world,
                                                  config=self.config, config_hash=self.config_hash,
                                                  seed=cfg.seed, plan=self.load_plan)
        if rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        def fetch(ckpt_dir: Path) -> LoadPlan:  # MLflow: the run's newest complete checkpoint, as "auto"
            fetch_run_checkpoint(cfg.tracking, self.resume_from, ckpt_dir, rank, self.dist_env.local_rank)
            return self._plan("auto", ckpt_dir)

        resumed = self.checkpoints.resume(self._build_engine, self._build_loader,
                                          fetch=fetch if self.resume_from is not None else None)
        self.engine, self.train_loader, self.step = resumed.engine, resumed.loader, resumed.step
        self.watchdog.at_step(self.step)  # a rank hung in its first step after a resume is named at this step, not 0
        self._saved_interval = resumed.metrics_states
        with rng_kept():  # the first step must see the RNG state the resume set
            self._train_iter = iter(self.train_loader)  # draws the loader workers' base seed
            device = self.engine.device
            self.device = torch.device(device) if not isinstance(device, torch.device) else device
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.engine.precision, torch.float32)
            seq = cfg.data.max_seq_length
            self.flops_per_position = pretraining_flops_per_sequence(cfg.model, seq, cfg.data.prediction_slots) / seq
            self.peaks = (resolve_peaks(cfg.engine.peak_tflops_per_device, self.device, dtype) if rank == 0
                          else Peaks(None, "", None, ""))
            self.tracker = self._build_tracker(resumed_step=None if resumed.point is None else resumed.step)
        # per-rank step times (`train`, `_log_train`); collective: every rank's host name
        self._stragglers = StragglerMonitor(rank, world, self._host_group, self.device, self.engine.module)
        if rank == 0:
            logger.info("run directory %s; %s; %d parameters; global batch %d; MFU peaks, TFLOP/s/device: %s (%s), "
                        "%s (%s)", self.run_dir, self.dist_env.describe(), self.n_params, self.global_batch,
                        _tflops(self.peaks.datasheet), self.peaks.datasheet_source, _tflops(self.peaks.measured),
                        self.peaks.measured_source)
            params = dict(self.config)
            params["derived"] = {"world_size": world, "train_batch_size": self.global_batch,
                                 "n_parameters": self.n_params, "config_hash": self.config_hash}
            self.tracker.log_params(params)
            note = cfg.data.masking_cap_note()
            if note:  # not an error (ALBERT's own recipe does it), but a masking rate the user may not expect
                logger.warning("%s", note)

    def _plan(self, resume: Optional[str], ckpt_dir: Optional[str | Path]) -> LoadPlan:
        """`albert_dist.apps.pretrain.preflight.load_plan_for` this job; rank 0 warns."""
        return load_plan_for(self.cfg, resume, ckpt_dir, self.dist_env.world_size, log=self.dist_env.rank == 0)

    def _build_engine(self, overrides: dict) -> Any:
        """The model, optimiser and schedule in a DeepSpeedEngine whose config is the job's plus `overrides`
        (what the resume needs); rank 0 writes that config to `<run_dir>/ds_config.json`."""
        # Imported here: DeepSpeed's import costs seconds and logs its accelerator choice, which a refused
        # config or `--help` should not pay, and which must come after configure_logging's noise filter.
        import deepspeed

        cfg, world = self.cfg, self.dist_env.world_size
        ds_config = {**self.ds_config, **overrides}
        if self.dist_env.rank == 0:
            (self.run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=2))
        seed_all(cfg.seed)  # identical initial weights on every rank (ZeRO-3 partitions each rank's copy)
        # The static MLM gather (one shape for every batch, no host sync): as many slots as a row can hold.
        model = AlbertForPreTraining(cfg.model, max_predictions_per_seq=cfg.data.prediction_slots)
        if cfg.model.init_from is not None and self.load_plan.point is None and self.resume_from is None:
            # every rank, before deepspeed.initialize: ZeRO-3 then partitions the source's values
            source = self.init_source or check_init_from(cfg)
            load_into(model, source)
            if self.dist_env.rank == 0:
                logger.info("weights from model.init_from %s (%s)", source.ref, source.weights)
        # ds_to_universal refuses checkpoints of modules without this attribute (DeepSpeed 0.19).
        model.universal_checkpoint_info = dict(UNIVERSAL_CHECKPOINT_INFO)
        self.n_params = sum(p.numel() for p in model.parameters())
        optimizer, after_initialize = build_optimizer(model, cfg.optimizer)
        scheduler = build_scheduler(optimizer, cfg.optimizer, cfg.max_steps)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=ds_config)
        after_initialize(engine)  # LAMB: DeepSpeed's partition map
        install_exact_clipping(engine)  # ZeRO-0 fp32: clip with ZeRO-1/2's float64 norm (engine/grad_norm.py)
        if cfg.engine.compile:
            compile_engine(engine, cfg.engine.compile_scope)
        self.ga_steps = engine.gradient_accumulation_steps()
        if self.ga_steps != cfg.engine.gradient_accumulation_steps:  # the loop and DeepSpeed must agree
            raise RuntimeError(f"DeepSpeed runs {self.ga_steps} accumulation steps, the config says "
                               f"{cfg.engine.gradient_accumulation_steps} (world size {world})")
        return engine

    def _build_loader(self, base_rank: int, base_world: int) -> Any:
        """The training loader of stream `base_rank` of `base_world` (`albert_dist.engine.checkpoint.reshard`);
        its sources' pieces are the preflight's when planned for this world size, else planned for `base_world`."""
        from deepspeed.accelerator import get_accelerator  # imported by _build_engine already (it comes first)

        pieces = self.train_pieces if base_world == self.dist_env.world_size else None
        # A step's micro-batches in flight, made while the previous step computes; page-locked on CUDA only
        # (pinning needs a CUDA context, and on CPU the copy is no copy)
        loader = build_train_loader(self.cfg.data, self.cfg.engine.train_micro_batch_size_per_gpu, base_rank,
                                    base_world, pieces,
                                    micro_batches_per_step=self.ds_config["gradient_accumulation_steps"],
                                    pin_memory=get_accelerator().device_name() == "cuda")
        # A SIGTERM to the whole process group (scancel, the deepspeed launcher) would kill the loader's
        # workers (torch installs a dying SIGTERM handler in them) in the middle of the step we finish.
        loader.worker_init_fn = IgnoreStopSignals(loader.worker_init_fn)
        return loader

    def _run_dir_before_group(self) -> Optional[str]:
        """The run directory when every rank can know it before the process group: cfg.run_dir, or rank 0's
        preflight's (`JobPlan.run_dir`) through the rendezvous store; None without a store (`_agree_run_dir`)."""
        if self.cfg.run_dir is not None:
            return self.cfg.run_dir
        if self.store is None:
            return None if self.dist_env.world_size > 1 else self._named_run_dir
        if self.dist_env.rank == 0:
            self.store.set(_RUN_DIR_KEY, str(self._named_run_dir))
        return self.store.get(_RUN_DIR_KEY).decode()

    def _mark(self, phase: str) -> None:
        """The hang watchdog's phase mark (`albert_dist.job.watchdog.Watchdog.mark`; raises its `JobHung`)."""
        if self.watchdog is not None:
            self.watchdog.mark(phase)

    def _agree_run_dir(self) -> str:
        """cfg.run_dir, or the directory rank 0's preflight named and locked (`JobPlan.run_dir`), broadcast: the
        ranks' clocks differ, so each naming its own would not agree."""
        if self.cfg.run_dir is not None:
            return self.cfg.run_dir
        return broadcast_object(self._named_run_dir if self.dist_env.rank == 0 else None)

    def _build_tracker(self, resumed_step: Optional[int]):
        """The job's tracker: console + metrics.jsonl on rank 0 (started afresh, or cut back to the resumed
        checkpoint's step) and, unless tracking.enabled is false, the MLflow run over it (collective;
        `albert_dist.apps.pretrain.run_tracking.build_tracker`)."""
        rank = self.dist_env.rank
        local = JsonlTracker(self.run_dir, resumed_step=resumed_step or 0) if rank == 0 else NullTracker()
        return build_tracker(self.cfg, self.run_dir, rank, self.dist_env.world_size, local,
                             local_rank=self.dist_env.local_rank, resume_from=self.resume_from,
                             resuming=self.cfg.checkpoint.resume is not None, resumed_step=resumed_step,
                             model=self.engine.module)

    # ------------------------------------------------------------------------------------------------ loop
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, Optional[torch.Tensor]]:
        """A loader batch on the device, as the model takes it: no `attention_mask` when the host copy shows
        no padding (`drop_full_mask`: attention then runs without a mask, FlashAttention's form)."""
        return {k: None if v is None else v.to(self.device, non_blocking=True)
                for k, v in drop_full_mask(batch).items()}

    def train(self) -> int:
        """Run optimiser steps until max_steps or a stop signal; returns EXIT_OK or EXIT_PREEMPTED."""
        cfg, engine = self.cfg, self.engine
        rank = self.dist_env.rank
        acc = self._acc = MetricAccumulator(self.device)
        if rank == 0:  # the run's goodput events: this attempt starts here (albert_dist.tracking.goodput)
            self.goodput = GoodputRecorder(self.run_dir)
            self.goodput.start(self.step, self.checkpoints.load_s)
        # A checkpoint written between log steps: the first record covers the same steps as without the restart
        acc.restore(self._saved_interval, rank, self.dist_env.world_size)
        self._skipped_seen = int(engine.skipped_steps)  # DeepSpeed restores it from a checkpoint
        strag = self._stragglers
        self.divergence = DivergenceMonitor(cfg.divergence, self.device, self._skipped_seen)
        self.divergence.restore_window(saved_window(self._saved_interval, rank))  # the spike test goes on at once
        self._saved_interval = []
        engine.train()
        # a terminal only: in a log file the bar's carriage-return updates interleave with the log lines
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   disable=not console.progress_bar_enabled(cfg.progress_bar, rank, sys.stderr))
        self._pace = (time.perf_counter(), self.step)  # ETA: this process's mean pace, evaluations included
        # An object-store source: the next step's batches come before the stop agreement (module docstring)
        prefetch = _in_object_store(cfg)
        if prefetch and self.step < cfg.max_steps and self._prefetch():  # no step since the checkpoint loaded
            bar.close()
            return self._stop_for_store(self._store_flag, saved=False)
        try:
            with logging_redirect_tqdm():
                while self.step < cfg.max_steps:
                    lr = engine.get_lr()[0]  # the lr this step's update uses
                    sop_weight = sop_weight_at(cfg.objective, self.step)  # and its SOP weight
                    # All micro-batches first: the loss is normalised by the step's label counts (engine/loss.py).
                    # The loader keeps GA batches in flight, so they were made while the last step computed;
                    # what is left is the wait, timed on the host (no device sync; `_fetch_step`).
                    batches = self._next_batches if prefetch else self._fetch_step()
                    acc.add_data_wait(self._fetch_s)
                    strag.start_compute()
                    poison = self.step + 1 in self._poison  # the testing switch (engine/divergence.py)
                    self._poison.discard(self.step + 1)
                    result = optimizer_step(engine, batches, sop_weight, poison=poison, on_phase=self._mark)
                    for out, batch in zip(result.outputs, batches):
                        acc.add_micro_step(out, batch["attention_mask"], batch["input_ids"].shape)
                    self.step += 1
                    if self.watchdog is not None:
                        self.watchdog.step_done(self.step)
                    last = self.step == cfg.max_steps
                    acc.add_step(result.grad_norm)
                    strag.end_step(self._fetch_s)
                    self.divergence.add_step(self.step, result.outputs, engine.skipped_steps)  # no host sync
                    if every(self.step, cfg.log_interval_steps, last):
                        self.goodput.mark("interval", self.step)
                        self._mark("logging")
                        record = self._log_train(acc, lr, sop_weight)
                        bar.set_postfix(loss=f"{record[names.TRAIN_LOSS]:.3f}", refresh=False)
                    bar.update(1)  # after the postfix, so the bar shows this step's loss, not the previous one's
                    self._loader_state, unavailable = None, False
                    if prefetch and not last:
                        unavailable = self._prefetch(agree=False)
                    paused = time.perf_counter()  # eval and save time is not training throughput
                    if every(self.step, cfg.eval_interval_steps, last):
                        self.evaluate()
                    flag = self._agree_stop(float(unavailable))
                    stop = flag > 0
                    if stop and rank == 0:  # every rank is alive and agrees: now it can be promised
                        gone = flag >= VANISHED_STOP_FLAG
                        logger.warning("every rank stops after step %d%s: checkpoint, then exit %d", self.step,
                                       " (a training file is gone; its rank's log names it)" if gone else
                                       " (a data loader gave up on the object store; its rank's log names the URL)"
                                       if flag >= STORE_STOP_FLAG else "",
                                       EXIT_INPUT_VANISHED if gone else EXIT_PREEMPTED)
                    # Read at log steps and before saves: a rollback goes on from its checkpoint's step
                    if self._check_divergence(every(self.step, cfg.log_interval_steps, last)
                                              or every(self.step, cfg.checkpoint.save_interval_steps, last or stop)):
                        bar.update(self.step - bar.n)
                        if stop:
                            logger.warning("stopped by signal after the rollback to step %d; exit %d", self.step,
                                           EXIT_PREEMPTED)
                            return EXIT_PREEMPTED
                        continue
                    cause = "input" if flag >= VANISHED_STOP_FLAG else "store" if flag >= STORE_STOP_FLAG else "signal"
                    self.save(last=last or stop, stop=stop, stop_cause=cause)
                    acc.exclude(time.perf_counter() - paused)
                    if stop:
                        if flag >= STORE_STOP_FLAG:
                            return self._stop_for_store(flag)
                        logger.warning("stopped by signal at step %d after a checkpoint; exit %d", self.step,
                                       EXIT_PREEMPTED)
                        return EXIT_PREEMPTED
        finally:
            bar.close()
            strag.close()
        self.save(last=True)  # max_steps already reached when resuming from a non-final checkpoint
        if self.watchdog is not None:
            self.watchdog.stop()
        return EXIT_OK

    def _agree_stop(self, extra: float = 0.0) -> float:
        """The largest stop flag of every rank (one MAX all-reduce per optimiser step): 0 to go on, a signal number,
        or `STORE_STOP_FLAG` (``extra``) from a rank whose loader gave up on the object store.

        A host tensor over a gloo group (`host_group`), never the device: on a GPU the flag's copy to the device
        and the read of the reduced value would drain the device's queue after every step. Every rank calls this
        after the same step, so all see the same flag and stop together. (Agreeing only every k steps would keep
        a device collective, drain every k-th step and stop up to k-1 steps late.)"""
        self._mark("stop_agreement")
        flag = torch.tensor([max(int(self._stop.signum), int(extra))], dtype=torch.int32)
        if is_multi_rank():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._host_group)
        return float(flag.item())

    def _check_divergence(self, due: bool, roll_back: bool = True) -> bool:
        """When `due` and steps were trained since the last read: read the divergence flags (collective,
        `DivergenceMonitor.read`). Nothing flagged: False. Flagged: with ``divergence.policy=rollback``, `roll_back`
        and rollbacks left, `_roll_back` and True; else raises `TrainingDiverged` (exit 77: `albert_dist.apps.pretrain.main`),
        whose message names the step and the newest healthy checkpoint."""
        if not due or self.divergence is None or not self.divergence.unread:
            return False
        verdict = self.divergence.read(self.step, group=self._host_group)
        if verdict is None:
            self.checkpoints.confirm(self.step)  # the checkpoints before this step are healthy
            return False
        self.checkpoints.quarantine(verdict.first_step)  # those whose weights led to it: renamed, `latest` moved back
        policy = self.cfg.divergence
        if roll_back and policy.policy == "rollback" and self.rollbacks < policy.max_rollbacks:
            if self._roll_back(verdict):
                return True
        point = newest_verified(self.ckpt_dir, log=False)
        healthy = ("no checkpoint was written before it" if point is None else
                   f"the newest healthy checkpoint is {point.path}"
                   + (" (latest names it; --resume auto continues from it)"
                      if read_latest(self.ckpt_dir) == point.tag else ""))
        why = ("divergence.policy=stop" if policy.policy == "stop" else
               f"after {self.rollbacks} rollback(s), divergence.max_rollbacks={policy.max_rollbacks}"
               if point is not None else "no checkpoint to roll back to")
        raise TrainingDiverged(f"training diverged at step {verdict.first_step}: {verdict.reasons()} (read at step "
                               f"{verdict.read_step}; {why}); {healthy}; no final model was written and no "
                               "checkpoint of the diverged weights is left to resume from", verdict)

    def _roll_back(self, verdict: Verdict) -> bool:
        """Reload the newest healthy checkpoint (`CheckpointManager.roll_back`: engine and RNGs) and keep the
        training loader where it is: the data since that checkpoint, which led to the divergence, is skipped
        (the loader's exact-resume cursor moves on, never back). Logs one warning and ``train/rollbacks`` with the
        skipped range of rank 0's stream (micro-batches) to the tracker, at the checkpoint's step. False when
        there is no checkpoint to roll back to."""
        rank = self.dist_env.rank
        cursor = stream_batches(self._loader_state if self._loader_state is not None
                                else self.train_loader.state_dict())
        back = self.checkpoints.roll_back(self.engine)
        if back is None:
            return False
        point, state = back
        self.rollbacks += 1
        saved = stream_batches(state.data_states[rank]) if state.world_size == self.dist_env.world_size else None
        if saved is not None and self._skipped_to is not None and self._skipped_to > saved:
            saved = self._skipped_to  # a second rollback to the same checkpoint: an earlier one skipped up to here
        self._skipped_to = cursor
        skipped_from, skipped_to, self.step = state.step + 1, verdict.read_step, state.step
        if self.watchdog is not None:
            self.watchdog.at_step(self.step)
        self._acc.reset()  # the interval held diverged steps
        self._skipped_seen = int(self.engine.skipped_steps)
        self.divergence.reset(self._skipped_seen)
        self.divergence.restore_window(saved_window(state.metrics_states, rank))
        if rank == 0:
            batches = (f"micro-batches {saved + 1}-{cursor} of each rank's stream (rank 0's numbers)"
                       if saved is not None and cursor is not None else "their micro-batches")
            logger.warning("training diverged at step %d: %s; rollback %d of %d (divergence.max_rollbacks): "
                           "reloaded %s, skipping the data of steps %d-%d (%s)", verdict.first_step,
                           verdict.reasons(), self.rollbacks, self.cfg.divergence.max_rollbacks, point.path,
                           skipped_from, skipped_to, batches)
            record = {names.TRAIN_ROLLBACKS: float(self.rollbacks),
                      names.TRAIN_ROLLBACK_FROM_STEP: float(verdict.first_step)}
            if saved is not None and cursor is not None:
                record[names.TRAIN_ROLLBACK_SKIPPED_FIRST] = float(saved + 1)
                record[names.TRAIN_ROLLBACK_SKIPPED_LAST] = float(cursor)
            self.tracker.log_metrics(record, self.step)
        self.goodput.mark("rollback", self.step)  # the steps trained again from here are recomputed (goodput)
        return True

    def _fetch_step(self) -> list[dict[str, torch.Tensor]]:
        """The next step's micro-batches on the device; raises `store.StoreUnavailable` (`next_batch`). The host
        time it waited for them is ``_fetch_s`` (the step's data wait)."""
        self._mark("data")
        started = time.perf_counter()
        batches = [self._to_device(next_batch(self._train_iter)) for _ in range(self.ga_steps)]
        self._fetch_s = time.perf_counter() - started
        self.goodput.add(DATA_WAIT, self._fetch_s)
        return batches

    def _prefetch(self, agree: bool = True) -> float:
        """Fetch the next step's batches into ``_next_batches``, the loader's state before them into
        ``_loader_state`` (what a checkpoint of the current step saves); nonzero when the loader gave up on the
        object store (`STORE_STOP_FLAG`) or found a file of its plan gone (`VANISHED_STOP_FLAG`). ``agree``: every
        rank learns whether any did (a collective, the agreed flag kept in ``_store_flag``; the loop folds it into
        the stop agreement instead)."""
        self._loader_state = self.train_loader.state_dict()
        self._next_batches, self._unavailable = [], None
        try:
            self._next_batches = self._fetch_step()
        except (store.StoreUnavailable, InputVanished) as err:
            self._unavailable = err
        mine = (0.0 if self._unavailable is None else
                VANISHED_STOP_FLAG if isinstance(self._unavailable, InputVanished) else STORE_STOP_FLAG)
        if not agree:
            return mine
        self._store_flag = self._agree_stop(mine)
        return self._store_flag if self._store_flag >= STORE_STOP_FLAG else 0.0

    def _stop_for_store(self, flag: float, saved: bool = True) -> int:
        """After every rank agreed to stop for the object store (and checkpointed the step, ``saved``): one line,
        naming the URL on the rank whose loader gave up; returns `EXIT_PREEMPTED` (a requeue's ``--resume auto``
        continues once the store answers again), or `EXIT_INPUT_VANISHED` when the agreed ``flag`` says a file of
        the plan is gone (restored, ``--resume auto`` continues; nothing requeues it)."""
        if flag >= VANISHED_STOP_FLAG:
            cause = (str(self._unavailable) if isinstance(self._unavailable, InputVanished)
                     else "another rank's data loader found a training file gone")
            logger.error("%s; stopped at step %d %s; exit %d (restore it, then --resume auto continues; or start a "
                         "new run_dir on the corpus as it is now)", cause, self.step,
                         "after a checkpoint" if saved else "(no step since the checkpoint it started from)",
                         EXIT_INPUT_VANISHED)
            return EXIT_INPUT_VANISHED
        cause = (str(self._unavailable) if self._unavailable is not None
                 else "another rank's data loader gave up on the object store")
        logger.warning("%s; stopped at step %d %s; exit %d (--resume auto continues)", cause, self.step,
                       "after a checkpoint" if saved else "(no step since the checkpoint it started from)",
                       EXIT_PREEMPTED)
        return EXIT_PREEMPTED

    def _log_train(self, acc: MetricAccumulator, lr: float, sop_weight: float) -> dict[str, float]:
        stats = acc.reduce()
        if stats["mlm_dropped"]:  # the pipeline caps every row at the model's slots: a bug, not a data problem
            raise RuntimeError(f"{stats['mlm_dropped']:.0f} masked positions of the last {self.cfg.log_interval_steps}"
                               f" steps had no slot in the model's static MLM gather (data.max_predictions_per_seq="
                               f"{self.cfg.data.max_predictions_per_seq}, {self.cfg.data.prediction_slots} slots per "
                               f"row): batches with more masked positions per row than the data pipeline makes")
        world = self.dist_env.world_size
        record = {names.TRAIN + q: stats[q] for q in names.EVAL_QUANTITIES}
        record.update({names.TRAIN_SOP_WEIGHT: float(sop_weight), names.TRAIN_GRAD_NORM: stats["grad_norm"],
                       names.TRAIN_LR: float(lr), names.PERF_TOKENS_PER_S: stats["tokens_per_s"],
                       names.PERF_SAMPLES_PER_S: stats["samples_per_s"],
                       names.PERF_POSITIONS_PER_S: stats["positions_per_s"],
                       names.PERF_DATA_WAIT_S: stats["data_wait_s"],
                       names.PERF_DATA_WAIT_SHARE: stats["data_wait_share"]})
        # DeepSpeed skips a step whose gradients hold inf/NaN (bf16's check_grad_overflow, on by default) and says
        # nothing; our step counter and the data advance all the same. A host int: no sync.
        skipped = int(self.engine.skipped_steps)
        record[names.TRAIN_SKIPPED_STEPS] = float(skipped)
        if skipped > self._skipped_seen and self.dist_env.rank == 0:
            logger.warning("%d optimizer step(s) up to step %d skipped by DeepSpeed (inf/NaN gradients): no weight "
                           "update and no learning-rate step for them; %d skipped in all", skipped - self._skipped_seen,
                           self.step, skipped)
        self._skipped_seen = skipped
        stragglers = getattr(self, "_stragglers", None)  # each rank's own step time and data wait (collective, gloo)
        if stragglers is not None:
            record.update(stragglers.interval(self.step))
        mem = torch.tensor([float(peak_memory_bytes(self.device))], dtype=torch.float64, device=self.device)
        if is_multi_rank():
            gathered = [torch.zeros_like(mem) for _ in range(world)]
            dist.all_gather(gathered, mem)
            per_rank = [g.item() for g in gathered]
        else:
            per_rank = [mem.item()]
        record[names.MEM_PEAK_GIB_MAX] = max(per_rank) / 2**30
        record[names.MEM_PEAK_GIB_MIN] = min(per_rank) / 2**30
        if world <= names.MAX_PER_RANK_SERIES:
            for r, value in enumerate(per_rank):
                record[names.mem_peak_rank(r)] = value / 2**30
        if self.dist_env.rank == 0:
            for name, peak in ((names.PERF_MFU, self.peaks.datasheet),
                               (names.PERF_MFU_MEASURED_PEAK, self.peaks.measured)):
                if peak is not None:
                    record[name] = mfu(self.flops_per_position, stats["positions_per_s"], world, peak)
            self.tracker.log_metrics(record, self.step)
            start, first = self._pace
            eta = console.eta_s(time.perf_counter() - start, self.step - first, self.cfg.max_steps - self.step)
            logger.info(console.train_line(self.step, self.cfg.max_steps, record[names.TRAIN_LOSS],
                                           record[names.TRAIN_MLM_ACCURACY], float(lr),
                                           record[names.PERF_TOKENS_PER_S],
                                           shown_mfu(record, self.device), eta))
        return record

    @torch.no_grad()
    def evaluate(self) -> Optional[dict[str, float]]:
        """Validation on the fixed validation set (collective; albert_dist.engine.evaluation): val/loss,
        val/mlm_loss, val/sop_loss, val/mlm_accuracy, val/sop_accuracy over the whole set whatever the world size,
        and val/mlm_accuracy_over_unigram on rank 0. The first call builds the set and logs its size and unigram
        baseline once. None when data.validation is empty."""
        if not self.cfg.data.validation:
            return None
        started = time.perf_counter()
        self._mark("evaluation")
        if self._evaluator is None:
            self._evaluator = Evaluator(self.cfg.data, self.cfg.engine.train_micro_batch_size_per_gpu,
                                        self.dist_env.rank, self.dist_env.world_size, self.device)
            if self.dist_env.rank == 0:
                self.tracker.log_metrics(self._evaluator.once_metrics(), self.step)
        self.engine.eval()
        try:
            with eager():  # a compiled model would compile the evaluation's shapes anew (engine/compile.py)
                val = self._evaluator.evaluate(self.engine)
        finally:
            self.engine.train()
        self.goodput.add(EVALUATION, time.perf_counter() - started)
        if self.dist_env.rank == 0:
            self.tracker.log_metrics(val, self.step)
            logger.info(console.val_line(self.step, self.cfg.max_steps, val[names.VAL_LOSS],
                                         val[names.VAL_MLM_ACCURACY], val.get(names.VAL_MLM_ACCURACY_OVER_UNIGRAM)))
        return val

    def save(self, last: bool = False, stop: bool = False, stop_cause: Optional[str] = None) -> Optional[str]:
        """Checkpoint the current step when the cadence says so (`every(step, checkpoint.save_interval_steps, last)`;
        `last`: the final step or a stop; `stop`: a stop's, recorded as such with `stop_cause`, "signal" or
        "store") and it is not saved yet
        (`manager.CheckpointManager.maybe_save`) on every rank (collective); returns the tag, or None when nothing
        was saved. Raises `save.CheckpointSaveError` as `maybe_save`."""
        if not every(self.step, self.cfg.checkpoint.save_interval_steps, last):
            return None
        self._check_divergence(True, roll_back=False)  # never a checkpoint of unread steps: TrainingDiverged if flagged
        self._mark("checkpoint_save")
        start = time.perf_counter()
        # the loader's state before the batches fetched ahead for the next step, when there are such (`_prefetch`)
        data_state = (self.train_loader.state_dict if self._loader_state is None
                      else lambda: self._loader_state)
        tag = self.checkpoints.maybe_save(self.engine, self.step, data_state, last=last, stop=stop,
                                          metrics_state=None if self._acc is None else self._interval_state,
                                          stop_cause=stop_cause)
        if tag is not None and self.dist_env.rank == 0:
            self.goodput.add(CHECKPOINT_SAVE, time.perf_counter() - start)
            self.goodput.mark("save", self.step)
            logger.info("checkpoint %s written in %.1f s", self.ckpt_dir / tag, time.perf_counter() - start)
            self.tracker.log_checkpoint(str(self.ckpt_dir / tag), self.step)
        return tag

    def _interval_state(self) -> dict:
        """What a checkpoint saves of this rank's open metric interval, with the divergence loss window."""
        return {**self._acc.local_state(), WINDOW_KEY: self.divergence.window_state()}

    # ----------------------------------------------------------------------------------------------- finish
    def export_trained_model(self) -> Optional[dict]:
        """After the last step, on rank 0: the final checkpoint as the run's final model (consolidated fp32
        and transformers directories, `albert_dist.runs.weights.export_trained_model`), uploaded as the MLflow run's
        `model/` artifacts when tracking and its model upload (`albert_dist.tracking.config`) are on. Returns the written directories
        (None on other ranks, or when the export failed: logged, and tagged in MLflow; the checkpoint stays
        the job's result)."""
        if self.dist_env.rank != 0:
            return None
        return log_trained_model(self.tracker, self.cfg, self.ckpt_dir, tag_for(self.step), self.run_dir)

    def close(self, status: str) -> None:
        """Stop the loader workers, close the tracker with `status` ("FINISHED", "KILLED", "FAILED"), destroy the
        process group, restore the signal handlers (last: a launcher's SIGTERM while the tracker flushes is
        absorbed, not fatal). Idempotent; whoever calls `setup()` must call it."""
        # Explicitly: the workers ignore SIGTERM (see IgnoreStopSignals), so multiprocessing's exit-time
        # terminate() could not stop them if the iterator were left for the interpreter to clean up; and an
        # iterator whose construction raised (a worker failing to load its saved state) is nobody's to shut down.
        if self.watchdog is not None:
            self.watchdog.stop()
        stop_loader_workers(self._loader_iterators())
        self._train_iter = None
        self._end_goodput(status)
        try:
            self.tracker.close(status)
        finally:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            finally:
                if self._own_stop:
                    self._stop.restore()

    def _end_goodput(self, status: str) -> None:
        """Rank 0: the goodput ``end`` event, then the run's goodput so far printed and sent to the tracker
        (``goodput/*``); never raises (it runs on every exit path)."""
        try:
            report = self.goodput.end(self.step, status)
            if report is not None:
                logger.info("%s", report.text())
                self.tracker.log_metrics(report.metrics(), self.step)
        except Exception as err:  # noqa: BLE001 - accounting must not change how a job ends
            logger.warning("goodput: %s: %s", type(err).__name__, err)

    def _loader_iterators(self) -> list:
        loader, it = getattr(self, "train_loader", None), getattr(self, "_train_iter", None)
        if isinstance(loader, ReshardedLoader):
            return loader.iterators()
        return [it] if it is not None else []


__all__ = ["Trainer"]


def _tflops(value: float | None) -> str:
    """A peak for the start-up line: 4 significant digits (a measured matmul is noise past them), or "none"."""
    return "none" if value is None else f"{value:.4g}"
