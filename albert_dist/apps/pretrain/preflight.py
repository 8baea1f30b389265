"""Every check a job makes before its process group starts, in one place and once (`preflight`).

In order, each a `ValueError` (or `FileNotFoundError`, `CheckpointError`, `ConfigDriftError`) that the app
(`albert_dist.apps.pretrain.main.main`) turns into exit code 2 with one line, nothing started:

1. the input files (`check_inputs`: every local data source planned, `albert_dist.data.sources.pieces.pieces_of`:
   found, its text field present, not only empty or damaged files; on rank 0 every training slot's share
   probed for a usable record and every hub source resolved (`albert_dist.data.sources.hub`); the tokenizer a
   sentencepiece model with ALBERT's ids that fits `model.vocab_size`; `data.max_seq_length` within the position
   table; `check_data_settings`: the Chinese segmenter importable, a segmenter without whole-word masking
   warned) and the output directories (`check_output_dirs`: the run directory and the checkpoint directory can be
   created and written, e.g. not on a read-only file system);
2. `--resume-from` (`check_resume_from`: an MLflow run reference, tracking on) and `model.init_from`
   (`albert_dist.apps.pretrain.init_from.check`: the source read, the job's shapes and sharing fit it);
3. the job's plan (`plan_job`: the batch arithmetic for the world size, the DeepSpeed config, and which
   checkpoint to resume from and how to load it, `albert_dist.engine.checkpoint.resume.plan_load`);
4. the memory fit (`check_memory`: the estimate of `albert_dist.engine.memory` logged, and refused on a GPU it
   exceeds, with the smallest change that fits as dotted overrides, tried through config.py's override path);
5. last, so that a job refused otherwise leaves nothing behind: rank 0 locks the run directory and a separate
   checkpoint directory (`lock_run_dirs`, `albert_dist.job.lock`); without a fixed `run_dir` it names
   the run's directory here, the first free `runs/<recipe>-<UTC time>[-<k>]` (`JobPlan.run_dir`).

Every rank runs 1-4 on the same files and config and so reaches the same verdict; the app has the ranks agree
on it over the rendezvous store (`albert_dist.distributed.rendezvous`) before any of them starts the process group.
Each rank's training-source plan for the job's slots travels to its loader in the `JobPlan`
(`JobPlan.train_pieces`): planning is metadata alone (file sizes, parquet footers), which every rank's loader
would otherwise redo after the process group; only rank 0 reads records to probe the slots. So do the config as
the job's world size makes it (`JobPlan.cfg`: ``engine.gradient_accumulation_steps: auto`` resolved here, once,
`albert_dist.config.for_world_size`) and the rank's place (`JobPlan.env`, the app's one discovery): the Trainer and
the DeepSpeed config builder take them as they are.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from albert_dist.config import TrainConfig, apply_overrides, check_derived, for_world_size, resume_rules, to_container
from albert_dist.data.sources import cache, store
from albert_dist.data.sources.hub import check_hub_source
from albert_dist.data.sources.pieces import check_slots_readable, pieces_of
from albert_dist.sizes import fmt_bytes
from albert_dist.data.text import load_chinese_segmenter
from albert_dist.data.tokenizer import load_tokenizer
from albert_dist.engine import memory
from albert_dist.engine.checkpoint.resume import LoadPlan, plan_load
from albert_dist.engine.deepspeed_config import build_deepspeed_config
from albert_dist.distributed.env import DistEnv
from albert_dist.job.lock import RunDirBusy, RunDirLock, auto_run_dir
from albert_dist.apps.pretrain.init_from import check as check_init_from
from albert_dist.runs import Source
from albert_dist.tracking.tracker import parse_run_ref

logger = logging.getLogger(__name__)

#: Environment variable that turns the memory refusal into a warning ("warn"): the estimate is DeepSpeed 0.19's
#: layout; another DeepSpeed version, or a kernel that saves more, can make it wrong either way.
CHECK_ENV = "ALBERT_DIST_MEMORY_CHECK"
#: Bucket size (elements) the advice proposes when DeepSpeed's 5e8 default would not fit.
SMALL_BUCKET = 50_000_000
#: Micro-batch (sequences) below which halving it costs more than checkpointing: a GPU's matmuls shrink.
MIN_EFFICIENT_MICRO_BATCH = 8


@dataclass(frozen=True)
class JobPlan:
    """What the preflight worked out for a job, which `Trainer` builds it from (no process group needed)."""

    cfg: TrainConfig
    """The job's config as its world size makes it (`albert_dist.config.for_world_size`: a number for
    ``engine.gradient_accumulation_steps: auto``), resolved once, in the preflight."""
    env: DistEnv
    """This rank's place in the job (`albert_dist.distributed.env.discover`, the app's one call)."""
    global_batch: int
    """Sequences per optimizer step (micro-batch x accumulation x world size, checked)."""
    ds_config: dict
    """The DeepSpeed config (`albert_dist.engine.deepspeed_config.build_deepspeed_config`)."""
    load_plan: LoadPlan = field(default_factory=LoadPlan)
    """Which checkpoint to resume from and how to load it; a fresh start for `--resume-from` (its checkpoint is
    downloaded after the process group starts, and planned then)."""
    train_pieces: Optional[list[Optional[list[dict]]]] = None
    """Per `data.train` source, its pieces for this job's world_size x max(1, num_workers) slots
    (`albert_dist.data.sources.pieces.pieces_of`; None for a hub source), which the loader then reads instead of
    planning again; None when they were not planned (`plan_job` alone: the loader plans them)."""
    init_source: Optional[Source] = None
    """`model.init_from`'s source, checked (`albert_dist.apps.pretrain.init_from.check`); None without one."""
    run_dir: Optional[str] = None
    """Rank 0 without a fixed `run_dir`: the directory it named and locked (`lock_run_dirs`); the other ranks
    receive it from rank 0 once the process group is up (`Trainer.setup`: the ranks' clocks differ)."""


def preflight(cfg: TrainConfig, env: DistEnv, resume_from: Optional[str] = None,
              recipe_name: str = "run") -> tuple[JobPlan, list[RunDirLock]]:
    """Checks 1-5 of the module docstring for this rank of the job `env` describes; returns the job's plan (on
    rank 0 with the auto-named run directory, `recipe_name` its prefix, when `run_dir` is unset) and rank 0's
    run-directory locks (the caller releases them when the job ends; [] on other ranks).

    Raises:
        ValueError, FileNotFoundError, CheckpointError, ConfigDriftError: a job that must not start, the
            message naming the field, file or flag and the value (exit code 2).
    """
    cfg = for_world_size(cfg, env.world_size)  # the one resolution of the job's world-size view (JobPlan.cfg)
    train_pieces = check_inputs(cfg, env.world_size, probe=env.rank == 0)
    check_data_settings(cfg, log=env.rank == 0)
    check_output_dirs(cfg)
    if resume_from is not None:
        check_resume_from(resume_from, cfg)
    source = check_init_from(cfg, resume_from, say=env.rank == 0)
    plan = replace(plan_job(cfg, env, resume_from), train_pieces=train_pieces,
                   init_source=source)
    check_memory(cfg, env.world_size, memory.device_memory(env.local_rank), log=env.rank == 0)
    if env.rank != 0:
        return plan, []
    locks = lock_run_dirs(cfg, recipe_name)
    warn_unused_rows(cfg)
    return (plan if cfg.run_dir is not None else replace(plan, run_dir=str(locks[0].run_dir))), locks


def check_inputs(cfg: TrainConfig, world_size: int = 0,
                 probe: bool = True) -> Optional[list[Optional[list[dict]]]]:
    """Check the files a job reads before any process group starts, so a typo is exit code 2 with one line.

    Plans every local data source (`albert_dist.data.sources.pieces.pieces_of`: paths exist, globs match, formats
    known, jsonl/parquet records hold `text_field`, not only empty or damaged files), checks the
    tokenizer (exists, ALBERT's special ids, at most `model.vocab_size` pieces: a larger vocabulary would
    index past the embedding table; fewer: `warn_unused_rows`, once the job passed every check) and
    `data.max_seq_length <= model.max_position_embeddings` (same reason).
    Sources may be object-store URLs (`albert_dist.data.sources.store`). With ``world_size`` (0: a one-slot plan, as
    the validation set's), the training sources are planned for the job's world_size x max(1,
    data.num_workers) slots and, with ``probe`` (rank 0), every slot's share is probed for one usable record
    (`albert_dist.data.sources.pieces.check_slots_readable`). With ``probe``, each hub source (train and validation) is
    resolved without reading data (`albert_dist.data.sources.hub.check_hub_source`: the dataset, its configuration and
    split; offline, the local HF cache), so a misspelt name or a node without network is one line, not a
    traceback after start-up. An object store is read under ``data.store_retry_s``.

    Returns the training sources' pieces for the job's slots (`JobPlan.train_pieces`: None for a hub source),
    or None without ``world_size``.

    Raises:
        ValueError: naming the field and value (data.train[i].paths, data.tokenizer_path, model.vocab_size,
            data.max_seq_length; a hub source's key, dataset and cause).
    """
    train_pieces: list[Optional[list[dict]]] = []
    retry = store.RetryPolicy(budget_s=cfg.data.store_retry_s)
    for split in ("train", "validation"):
        for i, src in enumerate(getattr(cfg.data, split)):
            where = f"data.{split}[{i}]"
            if src.format == "hub":
                if probe:  # one rank asks the hub (the ranks agree on the verdict); the stream resolves it again
                    check_hub_source(src, where)
                train_pieces += [None] if split == "train" else []
                continue
            slots = world_size * max(1, cfg.data.num_workers) if split == "train" and world_size else 1
            planned = pieces_of(src, where, cfg.data.shard_piece_bytes, slots, retry=retry)
            if split == "train":
                train_pieces.append(planned)
                if world_size and probe:
                    check_slots_readable(src, where, planned, slots, cfg.data.max_document_bytes, retry)
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
    return train_pieces if world_size else None


def warn_unused_rows(cfg: TrainConfig) -> None:
    """Warn (once: rank 0, after every check passed) when ``data.tokenizer_path`` has fewer pieces than
    ``model.vocab_size``: the rows past the pieces are never reached by a token id. Harmless, and accepted by
    finetune and export (docs/data-tokenizer.md); a tokenizer with more pieces is refused in `check_inputs`."""
    pieces = load_tokenizer(cfg.data.tokenizer_path).get_piece_size()
    if pieces < cfg.model.vocab_size:
        logger.warning("model.vocab_size (%d) is larger than the %d pieces of data.tokenizer_path %r: %d embedding "
                       "rows no token id reaches (never trained as inputs; the tied output softmax only learns to keep "
                       "them unlikely); finetune and export accept the run",
                       cfg.model.vocab_size, pieces, cfg.data.tokenizer_path, cfg.model.vocab_size - pieces)


def check_data_settings(cfg: TrainConfig, log: bool = True) -> None:
    """What the loader workers will need of ``data``, checked here where it is one line: the Chinese segmenter
    ``data.chinese_word_segmentation`` names can be imported (`albert_dist.data.text.load_chinese_segmenter`;
    otherwise every worker dies of an ImportError after the process group and the MLflow run started). With
    `log`, a segmenter that does nothing for masking (``data.whole_word_masking=false``: every piece is a unit)
    is warned.

    Raises:
        ValueError: naming data.chinese_word_segmentation, the import error and the two ways out.
    """
    seg = cfg.data.chinese_word_segmentation
    if seg == "none":
        return
    try:
        load_chinese_segmenter(seg)
    except ImportError as exc:
        raise ValueError(f"data.chinese_word_segmentation={seg}: the segmenter cannot be imported (rjieba, or "
                         f"jieba: {exc}): install it or set data.chinese_word_segmentation=none") from None
    if log and not cfg.data.whole_word_masking:
        logger.warning("data.chinese_word_segmentation=%s does not change the masking with "
                       "data.whole_word_masking=false (every piece is a unit of its own) and costs the segmenter's "
                       "time: set data.whole_word_masking=true for whole-word masking, or "
                       "data.chinese_word_segmentation=none", seg)


def output_dirs(cfg: TrainConfig) -> list[tuple[str, Path]]:
    """(field, directory) of what a job writes: `run_dir` (unset: the `runs/` directory the run's is named in,
    under the working directory, `Trainer.setup`), `checkpoint.dir` when set, and `data.cache_dir` when an
    object-store validation source will be cached there (`albert_dist.data.validation`)."""
    dirs = [("run_dir", Path(cfg.run_dir) if cfg.run_dir is not None else Path("runs").absolute())]
    if cfg.checkpoint.dir is not None:
        dirs.append(("checkpoint.dir", Path(cfg.checkpoint.dir)))
    if cfg.data.cache_max_bytes and any(store.is_url(p) for s in cfg.data.validation if s.format != "hub"
                                        for p in s.paths):
        dirs.append(("data.cache_dir", Path(cfg.data.cache_dir or cache.default_dir()).expanduser()))
    return dirs


def check_output_dirs(cfg: TrainConfig) -> None:
    """Every directory of `output_dirs` exists and is writable, or can be created: its nearest existing
    ancestor is a directory this process may write into (`os.access`, which also reports a read-only file
    system, EROFS, to root). Writes nothing.

    Raises:
        ValueError: naming the field, the directory and why (a read-only file system, no permission, a file
            in the way), so a job that could never save is refused before it starts (exit code 2).
    """
    for field_name, directory in output_dirs(cfg):
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ValueError(f"{field_name}={str(directory)!r}: {str(existing)!r} is not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            why = "a read-only file system" if _read_only_fs(existing) else "no write permission"
            what = "" if existing == directory else f" (its parent {str(existing)!r})"
            raise ValueError(f"{field_name}={str(directory)!r}: cannot write there{what}: {why}")


def _read_only_fs(path: Path) -> bool:
    """The file system holding `path` is mounted read-only (statvfs's ST_RDONLY flag)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


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


def plan_job(cfg: TrainConfig, env: DistEnv, resume_from: Optional[str] = None) -> JobPlan:
    """The plan of the job `env` is a rank of, for `cfg` as `for_world_size` resolved it for ``env.world_size``
    (a config without ``auto`` is its own): the batch arithmetic (`check_derived`), the DeepSpeed config
    (precision and accelerator checks) and, unless `resume_from` (an MLflow run, planned after its download), the
    load plan of `checkpoint.resume` (`load_plan_for`; rank 0 logs what it finds).

    Raises:
        ValueError: ``auto`` left in the config, a batch triple that does not multiply out, a precision the
            accelerator lacks, `--resume auto` without a fixed directory; FileNotFoundError, CheckpointError,
            ConfigDriftError: as `plan_load`.
    """
    world_size = env.world_size
    global_batch = check_derived(cfg, world_size)
    ds_config = build_deepspeed_config(cfg.engine, world_size, model=cfg.model)
    if resume_from is not None:
        return JobPlan(cfg, env, global_batch, ds_config)
    return JobPlan(cfg, env, global_batch, ds_config,
                   load_plan_for(cfg, cfg.checkpoint.resume, cfg.checkpoint.directory(cfg.run_dir), world_size,
                                 log=env.rank == 0))


def load_plan_for(cfg: TrainConfig, resume: Optional[str], ckpt_dir: Optional[str | Path], world_size: int,
                  log: bool = True) -> LoadPlan:
    """`albert_dist.engine.checkpoint.resume.plan_load` for this job: its config, world size and the config's
    resume rules (`albert_dist.config.resume_rules`). Raises as `plan_load`."""
    return plan_load(resume, ckpt_dir, to_container(cfg), world_size, resume_rules(), log=log)


def lock_run_dirs(cfg: TrainConfig, recipe_name: str = "run") -> list[RunDirLock]:
    """Rank 0's locks for the job (`albert_dist.job.lock`): the run directory's first (without a fixed
    `run_dir`, the one `lock_auto_run_dir` names), and the checkpoint directory's when `checkpoint.dir` puts it
    elsewhere.

    Raises:
        RunDirBusy: another job holds one of them (a ValueError: exit code 2, naming the directory and holder).
        ValueError: a directory or its lock file cannot be created (`check_output_dirs` passed, but the file
            system still refused, e.g. a directory where nothing can be made), naming the directory.
    """
    locks: list[RunDirLock] = []
    try:
        dirs = [Path(cfg.run_dir)] if cfg.run_dir is not None else []
        if cfg.run_dir is None:
            locks.append(lock_auto_run_dir(recipe_name))
        run_dir = dirs[0] if dirs else locks[0].run_dir
        if cfg.checkpoint.dir is not None:
            ckpt_dir = Path(cfg.checkpoint.dir)
            if run_dir.resolve() not in (ckpt_dir.resolve(), *ckpt_dir.resolve().parents):
                dirs.append(ckpt_dir)
        for d in dirs:
            try:
                locks.append(RunDirLock(d).acquire())
            except OSError as err:
                raise ValueError(f"cannot lock the run directory {str(d)!r}: {err.strerror or err}") from None
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def lock_auto_run_dir(recipe_name: str, runs: Path = Path("runs")) -> RunDirLock:
    """The lock of a new run directory named and created by `albert_dist.job.lock.auto_run_dir` (the
    first free `runs/<recipe_name>-<UTC time>[-<k>]`).

    Raises:
        ValueError: no free name after 99 tries, or a directory or its lock file cannot be created.
    """
    run_dir = auto_run_dir(recipe_name, runs)
    try:
        return RunDirLock(run_dir).acquire()
    except OSError as err:  # RunDirBusy (a ValueError) passes: a directory made a moment ago has no other holder
        raise ValueError(f"cannot lock the run directory {str(run_dir)!r}: {err.strerror or err}") from None


# ------------------------------------------------------------------------------------------------ memory fit
def check_memory(cfg: TrainConfig, world_size: int, device: Optional[tuple[str, int]],
                 log: bool = True) -> memory.MemoryEstimate:
    """The memory check: log the memory line (when `log`), and on a GPU whose usable memory
    (`memory.USABLE_FRACTION` of `device`'s bytes) the estimate exceeds, refuse with the smallest change that
    fits.

    `device`: (name, total bytes) of the accelerator (`memory.device_memory`), None on CPU (only the line). With
    $ALBERT_DIST_MEMORY_CHECK=warn the refusal is logged as a warning instead.

    Raises:
        ValueError: the estimate exceeds the device (exit code 2 before any process group), naming the device,
            both byte counts and the smallest change (`smallest_fitting_change`) as dotted overrides.
    """
    est = _estimate(cfg, world_size)
    line = memory.describe(est, cfg.model, cfg.data, cfg.engine, world_size)
    usable = memory.USABLE_FRACTION * device[1] if device is not None else float("inf")
    if est.total_bytes <= usable:
        if log:
            logger.info(line)
        return est
    name, total = device
    found = smallest_fitting_change(cfg, world_size, usable)
    advice = (f"the smallest change that fits: {' '.join(found[0])} (estimate {fmt_bytes(found[1].total_bytes)})"
              if found else "no change this check knows fits: use more ranks (ZeRO-3 partitions the model states) "
                            "or a device with more memory")
    message = (f"{line}; this exceeds {memory.USABLE_FRACTION:.0%} of the {fmt_bytes(total)} of "
               f"{name}: {advice}. ({CHECK_ENV}=warn starts anyway; docs/scale-memory.md has the measured figures)")
    if os.environ.get(CHECK_ENV, "").lower() == "warn":
        if log:
            logger.warning(message)
        return est
    raise ValueError(message)


def _estimate(cfg: TrainConfig, world_size: int) -> memory.MemoryEstimate:
    return memory.estimate(cfg.model, cfg.data, cfg.engine, world_size)


def candidate_changes(cfg: TrainConfig) -> list[list[str]]:
    """Single changes that lower the per-device memory, cheapest (in throughput) first, as dotted overrides.

    A smaller gradient bucket (free); ZeRO-1 -> 2 (free); half the micro-batch with twice the accumulation
    (same global batch) down to `MIN_EFFICIENT_MICRO_BATCH`; ZeRO-3 (one all-gather of the parameters per
    step, small for shared ALBERT blocks, bench/zero.py); activation checkpointing (about 1/3 more compute);
    smaller micro-batches still; ZeRO-Offload of the optimizer, then of the parameters (host memory and PCIe
    traffic every step).
    """
    e = cfg.engine
    out: list[list[str]] = []
    if memory.zero_option(e, "reduce_bucket_size", cfg.model) > SMALL_BUCKET and e.zero_stage >= 1:
        out.append([f"engine.zero_optimization.reduce_bucket_size={SMALL_BUCKET}"])
    if e.zero_stage < 2:
        out.append(["engine.zero_stage=2"])
    halvings: list[list[str]] = []
    micro, ga = e.train_micro_batch_size_per_gpu, e.gradient_accumulation_steps
    while micro % 2 == 0:
        micro, ga = micro // 2, ga * 2
        halvings.append([f"engine.train_micro_batch_size_per_gpu={micro}", f"engine.gradient_accumulation_steps={ga}"])
    cheap = [h for h in halvings if int(h[0].split("=")[1]) >= MIN_EFFICIENT_MICRO_BATCH]
    out += cheap
    if e.zero_stage < 3:
        out.append(["engine.zero_stage=3"])
    if not cfg.model.gradient_checkpointing:
        out.append(["model.gradient_checkpointing=true"])
    out += halvings[len(cheap):]
    if e.offload_optimizer.device == "none":
        out.append(([] if e.zero_stage >= 1 else ["engine.zero_stage=1"]) + ["engine.offload_optimizer.device=cpu"])
    if e.offload_param.device == "none":
        out.append(["engine.zero_stage=3", "engine.offload_param.device=cpu"])
    return out


def smallest_fitting_change(cfg: TrainConfig, world_size: int,
                            usable_bytes: float) -> Optional[tuple[list[str], memory.MemoryEstimate]]:
    """The first of `candidate_changes` whose estimate fits in `usable_bytes`; else the shortest run of them
    applied together (in that order) that fits; None when even all of them together do not fit. Each change
    is applied with `albert_dist.config.apply_overrides` (validated as a command line's would be)."""
    candidates = candidate_changes(cfg)
    for change in candidates:
        est = _estimate(apply_overrides(cfg, change), world_size)
        if est.total_bytes <= usable_bytes:
            return change, est
    applied: list[list[str]] = []
    for change in candidates:
        # a later change of the same key (micro-batch halvings, stages) replaces the earlier one
        keys = {c.split("=")[0] for c in change}
        applied = [a for a in applied if not keys & {c.split("=")[0] for c in a}] + [change]
        est = _estimate(apply_overrides(cfg, [c for a in applied for c in a]), world_size)
        if est.total_bytes <= usable_bytes:
            # drop what is not needed, the costliest first
            for change_ in reversed(list(applied)):
                rest = [a for a in applied if a is not change_]
                trial = _estimate(apply_overrides(cfg, [c for a in rest for c in a]), world_size)
                if trial.total_bytes <= usable_bytes:
                    applied, est = rest, trial
            return [c for a in applied for c in a], est
    return None
