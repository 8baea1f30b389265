"""Checkpoints through the DeepSpeed engine, with the training state DeepSpeed does not know about.

`CheckpointManager` is the one place that decides about checkpoints: it plans a resume (fetching an MLflow
run's checkpoint first when asked), checks the config against the checkpoint's, supplies the DeepSpeed-config
overrides a resume needs, loads the engine, the data loaders and (last) the RNGs, saves on the loop's cadence
and applies retention. The module-level functions are its parts, usable on their own (bench, tests, tools).

Layout of `<checkpoint dir>` (default `<run_dir>/checkpoints`)::

    step_<N>/                 one DeepSpeed checkpoint (engine.save_checkpoint(tag="step_<N>")), + albert_dist.json
    step_<N>_universal/       the same converted by DeepSpeed's ds_to_universal, made when resuming elsewhere
    latest                    the tag of the newest *verified* checkpoint (DeepSpeed's format: the tag, no newline)

`albert_dist.json` (`META_FILE`) = {"format", "step", "world_size", "zero_stage", "config_hash", "config" (the
resolved TrainConfig: the model and data-shape snapshot the drift check compares), "files": {relative path:
bytes} of every other file of the tag directory}. A checkpoint *verifies* when its metadata reads and every
listed file exists with the listed size (`verify`): this catches what real clusters leave behind, a save cut
short by a dead node, a truncated copy, a deleted step. No content checksum: reading a checkpoint back costs
far more than the 5 % of the save time such a check may take (measured in docs/checkpoints.md).

Save protocol (`save_checkpoint`, collective: every rank writes its own ZeRO partition): (1) every rank's
data-loader and RNG states are gathered into the `TrainState`; (2) rank 0 removes a stale directory of the same
tag and its universal copy (an earlier attempt's, now stale); (3) `engine.save_checkpoint(..., save_latest=False)`
with DeepSpeed's writer wrapped so an `OSError` (or the `RuntimeError` torch's zip writer raises on a full
disk) is recorded instead of leaving the other ranks in DeepSpeed's barrier; (4) barrier; (5) the ranks agree
on the first error; (6) rank 0 lists the files, writes `albert_dist.json`, verifies it and only then moves
`latest` atomically (temporary file, fsync, `os.replace`); (7) on any error the partial directory is removed,
`latest` still names the previous checkpoint, and every rank raises the same `CheckpointSaveError` (one line:
the path and the errno, "disk full" for ENOSPC); (8) rank 0 applies retention (`prune`); (9) barrier.
DeepSpeed's own `latest` (written from rank 0 without waiting for the others) is not used.

Resume (`plan_resume`, no process group needed): "auto" takes the newest `step_<N>` directory that verifies,
logging each newer one it skips and why (whatever `latest` says: a `latest` naming a missing step falls back
the same way). Retention (`prune`) never deletes the newest verified checkpoint, nor the one the job resumed
from until a newer verified one exists; unverified directories are removed.

Resume on another number of ranks (the saved world size differs): rank 0 converts the checkpoint with
DeepSpeed's universal-checkpoint tool (`deepspeed.checkpoint.ds_to_universal`), and the engine is built with
`checkpoint.load_universal=true` (`CheckpointManager.deepspeed_overrides`), which re-partitions parameters
and optimiser moments for the new world size. The converter needs the module to carry a
`universal_checkpoint_info` attribute when the engine is built (`UNIVERSAL_CHECKPOINT_INFO`). The data streams
continue by the rule of `albert_dist.engine.reshard`; dropout RNGs are re-seeded from (seed, rank, step),
since the old ranks' RNG streams cannot be split or merged.

Learning rate after a resume: the schedule is a function of the step and the *current* config, so after
loading, every parameter group's lr is set to `base_lr * lr_factor(step, warmup_steps, max_steps)` of the
current config (`_realign_lr`). With an unchanged config this is exactly the value the interrupted run would
have used; with a larger `max_steps` the resumed run follows the longer schedule from the checkpoint's step
on (DeepSpeed alone would run the first resumed step at the old schedule's last lr, e.g. 0.0).
"""
from __future__ import annotations

import errno as errno_mod
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from albert_dist.engine.checkpoint_dir import LATEST, fsync_dir, read_latest, step_of, tag_for, write_latest
from albert_dist.engine.checkpoint_dir import list_files as _list_files
# `_barrier` under this name: tests/distributed/ckpt_worker.py patches it to kill a rank inside a save
from albert_dist.engine.distributed import all_gather_object, barrier as _barrier, global_rank, world_size

logger = logging.getLogger(__name__)

META_FILE = "albert_dist.json"
CLIENT_KEY = "albert_dist"
#: Version of `META_FILE`; 2 adds "files" and "config".
META_FORMAT = 2

#: Value of the `universal_checkpoint_info` module attribute: no tensor-parallel or pipeline slicing, so
#: DeepSpeed's converter merges each parameter from its ZeRO fragments only.
UNIVERSAL_CHECKPOINT_INFO = {"universal_checkpoint_version": 0.2}

#: Free bytes under which a failed write is taken for a full disk (torch's zip writer raises a RuntimeError
#: without an errno, e.g. "unexpected pos 576 vs 534", when the file system fills up).
_FULL_DISK_BYTES = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used or written; the message names the checkpoint directory."""


class CheckpointSaveError(CheckpointError):
    """A save failed on some rank; the same error is raised on every rank. `path` and `errno` (None when
    unknown) name the first failing write; the partial checkpoint was removed and `latest` was kept."""

    def __init__(self, message: str, path: str = "", errno: Optional[int] = None):
        super().__init__(message)
        self.path = path
        self.errno = errno


class ConfigDriftError(ValueError):
    """The config differs from a checkpoint's in a field that cannot change on resume (a model field)."""


def every(step: int, n: int, last: bool = False) -> bool:
    """The loop's one cadence rule: periodic work (log, eval, save) runs at step `step` when `last` (the final
    step, or a stop) or when `n` > 0 divides `step`. `n` = 0 means only at the last step."""
    return last or (n > 0 and step % n == 0)


# ------------------------------------------------------------------------------------------ train state
@dataclass
class TrainState:
    """What a checkpoint holds besides DeepSpeed's engine state, in `client_state["albert_dist"]`.

    `data_states[r]` / `rng_states[r]` are rank r's loader `state_dict()` and `rng_state()` at the save.
    """

    step: int = 0
    """Optimiser steps done."""
    config_hash: str = ""
    """`albert_dist.config.config_hash` of the config that wrote it."""
    config: dict = field(default_factory=dict)
    """The resolved TrainConfig as plain dicts (its `model` and `data` sections are the drift check's snapshot)."""
    world_size: int = 1
    """Number of ranks that wrote it."""
    zero_stage: int = 0
    """ZeRO stage it was written with."""
    data_states: list = field(default_factory=list)
    """Per rank: the training loader's state_dict()."""
    rng_states: list = field(default_factory=list)
    """Per rank: `rng_state()`."""

    @property
    def model_config(self) -> dict:
        """The model section of the snapshot ({} for checkpoints written before snapshots existed)."""
        return dict(self.config.get("model", {}))

    def state_dict(self) -> dict[str, Any]:
        """Plain dict for DeepSpeed's client_state (keys as the fields)."""
        return {"step": self.step, "config_hash": self.config_hash, "config": self.config,
                "world_size": self.world_size, "zero_stage": self.zero_stage,
                "data_states": self.data_states, "rng_states": self.rng_states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` (a missing "config" reads as {})."""
        self.step = int(state["step"])
        self.config_hash = str(state["config_hash"])
        self.config = dict(state.get("config") or {})
        self.world_size = int(state["world_size"])
        self.zero_stage = int(state["zero_stage"])
        self.data_states = list(state["data_states"])
        self.rng_states = list(state["rng_states"])


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python `random`, numpy, torch CPU and (if present) the current CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_for(seed: int, rank: int, step: int) -> int:
    """Seed of a rank's dropout RNG when it cannot be restored from a checkpoint (fresh start or new rank)."""
    return (seed * 1_000_003 + rank * 7919 + step) % (2**63)


def seed_all(seed: int) -> None:
    """Seed python `random`, numpy and torch (CPU and every CUDA device) with `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------- collectives
# ------------------------------------------------------------------------------------- verification
def list_files(tag_dir: str | Path) -> dict[str, int]:
    """Relative path ("/"-separated) -> size in bytes of every regular file below `tag_dir`, except META_FILE."""
    return _list_files(tag_dir, exclude=(META_FILE,))


def read_meta(tag_dir: str | Path) -> dict[str, Any]:
    """The parsed `<tag_dir>/albert_dist.json`; raises `CheckpointError` naming the file when it cannot."""
    path = Path(tag_dir) / META_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {tag_dir}: no {META_FILE} (its save did not complete)")
    try:
        meta = json.loads(path.read_text())
        for key in ("step", "world_size", "zero_stage", "config_hash"):
            meta[key]  # noqa: B018 - presence check
        return meta
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {tag_dir}: cannot read {path}: {type(err).__name__}: {err}") from err


def verify(tag_dir: str | Path) -> Optional[str]:
    """Why the checkpoint `tag_dir` cannot be trusted, or None when it verifies (metadata readable, every
    listed file present with its listed size). Checkpoints of format 1 (no file list) verify on their
    metadata alone."""
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        return "directory missing"
    try:
        meta = read_meta(tag_dir)
    except CheckpointError as err:
        return str(err).split(": ", 1)[1]
    files = meta.get("files")
    if files is None:
        return None
    if not files:
        return f"{META_FILE} lists no files"
    for rel, size in files.items():
        path = tag_dir / rel
        try:
            actual = path.stat().st_size
        except OSError:
            return f"{rel} is missing ({META_FILE} lists {size} bytes)"
        if actual != size:
            return f"{rel} has {actual} bytes, {META_FILE} lists {size} (truncated or rewritten)"
    return None


# ------------------------------------------------------------------------------------------ planning
@dataclass(frozen=True)
class ResumePoint:
    """A verified checkpoint to resume from, as read from its `albert_dist.json` (no process group needed)."""

    ckpt_dir: str
    """Directory holding the tag directory (what engine.load_checkpoint takes as load_dir)."""
    tag: str
    """Tag directory name, "step_<N>"."""
    step: int
    """Optimiser steps done when it was saved."""
    world_size: int
    """Number of ranks that wrote it."""
    zero_stage: int
    """ZeRO stage it was written with."""
    config: dict = field(default_factory=dict, compare=False, hash=False)
    """The resolved config it was written with ({} for format-1 checkpoints)."""

    @property
    def path(self) -> Path:
        """The tag directory."""
        return Path(self.ckpt_dir) / self.tag

    def needs_universal(self, world_size: int) -> bool:
        """True when loading on `world_size` ranks needs DeepSpeed's universal checkpoint (re-partitioning)."""
        return self.world_size != world_size and self.zero_stage > 0


def _point(base: Path, tag: str) -> ResumePoint:
    meta = read_meta(base / tag)
    return ResumePoint(str(base), tag, int(meta["step"]), int(meta["world_size"]), int(meta["zero_stage"]),
                       dict(meta.get("config") or {}))


def _step_dirs(ckpt_dir: Path) -> list[tuple[int, str]]:
    """(step, tag) of every step_<N> directory, newest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(step_of(p.name), p.name) for p in ckpt_dir.iterdir() if p.is_dir()]
    return sorted(((s, t) for s, t in found if s is not None), reverse=True)


def newest_verified(ckpt_dir: str | Path, log: bool = True) -> Optional[ResumePoint]:
    """The newest `step_<N>` of `ckpt_dir` that verifies, or None when there is no step directory at all.

    With `log`, every newer directory skipped is logged as a warning with its reason, and so is a `latest`
    that names another tag. Raises `CheckpointError` when step directories exist but none verifies (listing
    each with its reason: starting over from step 0 would silently throw the run away).
    """
    ckpt_dir = Path(ckpt_dir)
    latest = read_latest(ckpt_dir)
    skipped = []
    for _, tag in _step_dirs(ckpt_dir):
        reason = verify(ckpt_dir / tag)
        if reason is None:
            if log and latest is not None and latest != tag:
                logger.warning("%s names %s, %s; resuming from %s, the newest checkpoint that verifies",
                               ckpt_dir / LATEST, latest,
                               "which does not exist" if not (ckpt_dir / latest).is_dir() else
                               "which is not the newest verified checkpoint", ckpt_dir / tag)
            return _point(ckpt_dir, tag)
        skipped.append(f"{tag}: {reason}")
        if log:
            logger.warning("skipping checkpoint %s: %s", ckpt_dir / tag, reason)
    if skipped:
        raise CheckpointError(f"no checkpoint in {ckpt_dir} verifies ({'; '.join(skipped)})")
    if latest is not None and log:
        logger.warning("%s names %s, which does not exist, and there is no other checkpoint", ckpt_dir / LATEST,
                       latest)
    return None


def plan_resume(resume: Optional[str], ckpt_dir: str | Path, log: bool = True) -> Optional[ResumePoint]:
    """Where to resume from: None (fresh start) or a verified `ResumePoint`.

    `resume` None -> None; "auto" -> `newest_verified(ckpt_dir)` (None when there is no checkpoint);
    otherwise a path to a tag directory (`.../step_<N>`), which must verify, or to a checkpoint directory,
    which is searched as "auto" does. Needs no process group; every rank reads the same files, so all agree.

    Raises:
        FileNotFoundError: an explicit path that is neither a checkpoint nor a checkpoint directory.
        CheckpointError: the named checkpoint (or every checkpoint of the directory) does not verify; the
            message names it and says why.
    """
    if resume is None:
        return None
    if resume == "auto":
        return newest_verified(ckpt_dir, log)
    path = Path(resume)
    if (path / META_FILE).is_file() or step_of(path.name) is not None and path.is_dir():
        reason = verify(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint.resume={resume!r}: checkpoint {path} does not verify: {reason}")
        return _point(path.parent, path.name)
    if path.is_dir() and ((path / LATEST).is_file() or _step_dirs(path)):
        point = newest_verified(path, log)
        if point is not None:
            return point
    raise FileNotFoundError(f"checkpoint.resume={resume!r}: neither a checkpoint directory with a "
                            f"'{LATEST}' file nor a complete checkpoint ({META_FILE} missing)")


# ------------------------------------------------------------------------------------------ config drift
#: The config fields a resume may change, and what the resumed run then does (warned once when they differ).
#: Any other difference outside `model` is warned as not being a continuation; a `model` field is refused.
RESUMABLE_FIELDS: dict[str, str] = {
    "max_steps": "trains on to the new max_steps; the learning rate follows the new max_steps' schedule from "
                 "the checkpoint's step on (lr_factor(step, warmup_steps, max_steps) of the current config)",
    "eval_interval_steps": "evaluates at the new interval",
    "log_interval_steps": "logs at the new interval",
    "progress_bar": "shows or hides the progress bar",
    "run_dir": "writes its outputs to the new run directory",
    "data.train": "reads the new training sources from their beginning (the saved stream positions belong "
                  "to the old ones)",
    "data.validation": "validates on the new sources",
    "data.eval_examples": "validates on the new fixed validation set",
    "data.eval_seed": "validates on the new fixed validation set",
    "data.eval_masked_lm_prob": "validates on the new fixed validation set",
    "data.num_workers": "loads with the new number of workers (the saved stream positions are dropped)",
    "engine.gradient_accumulation_steps": "accumulates the new number of micro-steps; the global batch must "
                                          "stay the same (checked), so the trajectory continues",
    "checkpoint": "checkpoints with the new settings",
    "tracking": "tracks with the new settings",
}
#: Data fields that change what an example looks like (stored with each checkpoint; changing one is warned).
DATA_SHAPE_FIELDS = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "short_seq_prob", "max_ngram",
                     "random_token_prob", "tokenizer_path")
#: What the loaders' saved positions depend on: when any differs, the data streams start afresh.
_STREAM_FIELDS = ("data.train", "data.num_workers", "data.seed", "data.shuffle", "data.shuffle_documents",
                  "data.shard_piece_bytes",
                  "data.max_document_bytes", "engine.train_micro_batch_size_per_gpu",
                  *(f"data.{k}" for k in DATA_SHAPE_FIELDS))


def _location_free(config: dict) -> dict:
    """`config` with local file paths cut to their names: the same corpus and tokenizer in another checkout or
    mount are no change (the rule of the loaders' own fingerprint, `albert_dist.data.loader`)."""
    out = json.loads(json.dumps(config))
    data = out.get("data", {})
    for split in ("train", "validation"):
        for src in data.get(split) or []:
            if src.get("format") != "hub":
                src["paths"] = [os.path.basename(p) for p in src.get("paths", [])]
            src["hub_data_files"] = [os.path.basename(p) for p in src.get("hub_data_files", [])]
    if data.get("tokenizer_path"):
        data["tokenizer_path"] = os.path.basename(data["tokenizer_path"])
    return out


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _rule_for(key: str) -> Optional[str]:
    for name in (key, key.split(".")[0]):
        if name in RESUMABLE_FIELDS:
            return name
    parts = key.split(".")
    for i in range(len(parts), 0, -1):  # data.train[0].paths is flattened as data.train (a list)
        if ".".join(parts[:i]) in RESUMABLE_FIELDS:
            return ".".join(parts[:i])
    return None


@dataclass(frozen=True)
class Drift:
    """The differences between a checkpoint's config and the current one (dotted key -> (saved, current))."""

    changes: dict
    """Dotted key -> (value in the checkpoint, value now)."""
    global_batch: Optional[tuple] = None
    """(sequences per step in the checkpoint, now, ranks then, ranks now) when only the number of ranks changed
    it (allowed, warned by `log_drift`); None when it is unchanged."""

    @property
    def streams_restart(self) -> bool:
        """True when the saved data-stream positions cannot be continued with the current config."""
        return any(k == f or k.startswith(f + ".") for k in self.changes for f in _STREAM_FIELDS)


def check_drift(point: ResumePoint, current: dict, world_size: int) -> Drift:
    """Compare `point`'s config snapshot with `current` (the resolved config as plain dicts).

    Raises `ConfigDriftError` (exit 2, before any process group) when a `model` field differs, naming every
    such field with both values, or when `engine.gradient_accumulation_steps` changed and the global batch
    (micro x accumulation x world size) changed with it. Other differences are returned; `log_drift` warns.
    Local file paths are compared by file name (a moved checkout is no change). A format-1 checkpoint has no
    snapshot: nothing is compared.
    """
    if not point.config:
        return Drift({})
    old, new = _flatten(_location_free(point.config)), _flatten(_location_free(current))
    changes = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    model = [f"{k}={a!r}, the config has {k}={b!r}" for k, (a, b) in changes.items() if k.startswith("model.")]
    if model:
        raise ConfigDriftError(f"checkpoint {point.path} has {'; '.join(model)} (the model cannot change on resume: "
                               f"start a new run, or resume with the checkpoint's model config)")
    micro = lambda c: c["engine"]["train_micro_batch_size_per_gpu"] * c["engine"]["gradient_accumulation_steps"]
    before, after = micro(point.config) * point.world_size, micro(current) * world_size
    if "engine.gradient_accumulation_steps" in changes or "engine.train_micro_batch_size_per_gpu" in changes:
        if before != after:
            raise ConfigDriftError(f"checkpoint {point.path} was trained with a global batch of {before} sequences "
                                   f"({point.world_size} ranks), the config gives {after} on {world_size} ranks; "
                                   f"choose engine.gradient_accumulation_steps to keep {before}")
    # Only the number of ranks changed the global batch: allowed (elastic), warned by log_drift.
    return Drift(changes, (before, after, point.world_size, world_size) if before != after else None)


def log_drift(point: ResumePoint, drift: Drift) -> None:
    """One warning per changed field: what the resumed run does (`RESUMABLE_FIELDS`), or that it is not a
    continuation of the checkpoint's run (any other field); and a global batch changed by the number of ranks."""
    if drift.global_batch is not None:
        before, after, ranks_before, ranks_now = drift.global_batch
        logger.warning("checkpoint %s was trained with a global batch of %d sequences (%d ranks); on %d ranks it "
                       "continues with %d (the learning rate is not rescaled); to keep %d set "
                       "engine.gradient_accumulation_steps", point.path, before, ranks_before, ranks_now, after,
                       before)
    for key, (old, new) in drift.changes.items():
        rule = _rule_for(key)
        if rule is not None:
            logger.warning("resuming %s with %s changed (%r -> %r): the run %s", point.path, key, old, new,
                           RESUMABLE_FIELDS[rule])
        else:
            logger.warning("resuming %s with %s changed (%r -> %r): not a resumable field; the run uses the new "
                           "value and is no longer the continuation of the checkpoint's", point.path, key, old, new)


# ---------------------------------------------------------------------------------------------- saving
def _describe_os_error(err: BaseException, path: str) -> tuple[str, Optional[int]]:
    """One line for a failed write of `path` and its errno (ENOSPC inferred for torch's errno-less errors on a
    full file system)."""
    code = getattr(err, "errno", None)
    if code is None:
        try:
            st = os.statvfs(os.path.dirname(path) or ".")
            if st.f_bavail * st.f_frsize < _FULL_DISK_BYTES:
                code = errno_mod.ENOSPC
        except OSError:
            pass
    if code == errno_mod.ENOSPC:
        return f"disk full writing {path} (errno {code} ENOSPC: {type(err).__name__}: {err})", code
    if code is not None:
        name = errno_mod.errorcode.get(code, "?")
        return f"cannot write {path}: {os.strerror(code)} (errno {code} {name})", code
    return f"cannot write {path}: {type(err).__name__}: {err}", None


class _CapturingWriter:
    """Wraps DeepSpeed's checkpoint engine so a failed write is recorded, not raised inside DeepSpeed's
    collective save (a rank raising there leaves the others in DeepSpeed's closing barrier forever)."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.error: Optional[tuple[str, str, Optional[int]]] = None  # (message, path, errno)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _record(self, err: BaseException, path: str) -> None:
        if self.error is None:
            message, code = _describe_os_error(err, str(path))
            self.error = (message, str(path), code)

    def save(self, state_dict: Any, path: str) -> Any:
        if self.error is not None:
            return None  # the checkpoint is lost already: do not fill the disk further
        try:
            return self._inner.save(state_dict, path)
        except (OSError, RuntimeError) as err:  # torch's zip writer raises RuntimeError on a full disk
            self._record(err, path)
            return None

    def makedirs(self, path: str, exist_ok: bool = False) -> Any:
        try:
            return self._inner.makedirs(path, exist_ok=exist_ok)
        except OSError as err:
            self._record(err, path)
            return None


def save_checkpoint(engine, ckpt_dir: str | Path, step: int, data_state: Any, config_hash: str,
                    keep_last: int, *, config: Optional[dict] = None, protect: Optional[str] = None) -> str:
    """Save step `step` on every rank (collective; see the module docstring for the protocol); returns the tag.

    `data_state` is this rank's `loader.state_dict()`; `config` the resolved config snapshot stored with it;
    `protect` a tag retention keeps until a newer verified checkpoint exists (the one the job resumed from).

    Raises:
        CheckpointSaveError: on every rank, when any rank's write failed or the checkpoint does not verify
            (the partial directory is removed, `latest` still names the previous checkpoint).
    """
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for(step)
    tag_dir = ckpt_dir / tag
    rank = global_rank()
    per_rank = all_gather_object({"data": data_state, "rng": rng_state()})
    state = TrainState(step=step, config_hash=config_hash, config=dict(config or {}), world_size=world_size(),
                       zero_stage=int(engine.zero_optimization_stage()),
                       data_states=[s["data"] for s in per_rank], rng_states=[s["rng"] for s in per_rank])
    if rank == 0:  # an earlier attempt's save of this step (and its universal copy, which would be stale)
        for stale in (tag_dir, ckpt_dir / f"{tag}_universal"):
            if stale.exists():
                logger.warning("removing %s left by an earlier attempt before saving %s again", stale, tag)
                shutil.rmtree(stale, ignore_errors=True)
    writer = _CapturingWriter(engine.checkpoint_engine)
    engine.checkpoint_engine = writer
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={CLIENT_KEY: state.state_dict()},
                               save_latest=False)
    finally:
        engine.checkpoint_engine = writer._inner
    _barrier()  # every rank's files are on disk
    failure = next((e for e in all_gather_object(writer.error) if e is not None), None)
    if failure is None and rank == 0:
        meta_path = tag_dir / META_FILE
        try:
            meta = {"format": META_FORMAT, "step": step, "world_size": state.world_size,
                    "zero_stage": state.zero_stage, "config_hash": config_hash, "config": state.config,
                    "files": list_files(tag_dir)}
            with open(meta_path, "w") as fh:
                json.dump(meta, fh)
                fh.flush()
                os.fsync(fh.fileno())
            reason = verify(tag_dir)
            if reason is not None:
                failure = (f"checkpoint {tag_dir} does not verify after saving: {reason}", str(tag_dir), None)
            else:
                write_latest(ckpt_dir, tag)
        except OSError as err:
            message, code = _describe_os_error(err, str(err.filename or meta_path))
            failure = (message, str(err.filename or meta_path), code)
    failure = all_gather_object(failure)[0]  # rank 0's verdict (a write error is known to every rank alike)
    if failure is not None:
        if rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)
        _barrier()
        message, path, code = failure
        raise CheckpointSaveError(f"checkpoint {tag_dir} not saved: {message}; {ckpt_dir / LATEST} still names "
                                  f"{read_latest(ckpt_dir)}", path, code)
    if rank == 0:
        prune(ckpt_dir, keep_last, protect=protect)
    _barrier()
    return tag


def prune(ckpt_dir: str | Path, keep_last: int, protect: Optional[str] = None) -> list[str]:
    """Retention (rank 0): keep the newest `keep_last` verified checkpoints, and `protect` (the checkpoint the
    job resumed from) while no newer verified one exists; delete every other step directory, verified or not,
    with its universal copy. Deletes nothing when no checkpoint verifies. Returns the removed names."""
    ckpt_dir = Path(ckpt_dir)
    steps = _step_dirs(ckpt_dir)
    good = [s for s, tag in steps if verify(ckpt_dir / tag) is None]  # newest first
    if not good:
        return []
    keep = set(good[:keep_last])
    protect_step = step_of(protect) if protect else None
    if protect_step is not None and protect_step in good and not any(s > protect_step for s in good):
        keep.add(protect_step)
    removed = []
    for entry in sorted(ckpt_dir.iterdir()):
        name = entry.name
        base = name[: -len("_universal")] if name.endswith("_universal") else name
        step = step_of(base)
        if step is None or not entry.is_dir() or step in keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(name)
    if removed:
        logger.info("retention (keep_last=%d): removed %s", keep_last, ", ".join(removed))
    return removed


# --------------------------------------------------------------------------------------------- loading
def to_universal(point: ResumePoint) -> str:
    """Convert `point` with DeepSpeed's ds_to_universal (rank 0; others wait at the barrier); returns the new tag.

    The conversion runs once: an existing `<tag>_universal` with its own `albert_dist.json` is reused. It is
    written to a temporary directory and renamed, so a crash mid-conversion leaves nothing half-made. Raises
    `CheckpointError` with the converter's output when it fails (e.g. a checkpoint of a module without
    `universal_checkpoint_info`).
    """
    tag = f"{point.tag}_universal"
    out = Path(point.ckpt_dir) / tag
    if global_rank() == 0 and not (out / META_FILE).is_file():
        tmp = Path(point.ckpt_dir) / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
               "--input_folder", str(point.path), "--output_folder", str(tmp),
               "--num_extract_workers", "1", "--num_merge_workers", "1"]
        logger.info("converting %s to a universal checkpoint: %s", point.tag, " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckpointError(f"checkpoint {point.path}: ds_to_universal failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        shutil.copy2(point.path / META_FILE, tmp / META_FILE)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        # The converter points `latest_universal` at its output folder, i.e. at the temporary name.
        write_latest(point.ckpt_dir, tag, name="latest_universal")
    _barrier()
    return tag


def load_checkpoint(engine, point: ResumePoint) -> dict[str, Any]:
    """Load `point` into `engine` on every rank (collective); returns the saved `client_state["albert_dist"]`.

    When the world size differs (`point.needs_universal`), the engine must have been built with
    `checkpoint.load_universal=true` in its DeepSpeed config (`CheckpointManager.deepspeed_overrides`). RNG
    states are not restored here: the caller does it last. Every load ends with
    `albert_dist.engine.optim.repair_optimizer_after_load` (param-group hyper-parameters from the config, Adam
    step counters unshared), which repairs DeepSpeed's ZeRO-3 universal load. Raises `CheckpointError` naming
    the checkpoint when DeepSpeed loads nothing or fails.
    """
    from albert_dist.engine.optim import group_hyperparameters, repair_optimizer_after_load

    tag = to_universal(point) if point.needs_universal(world_size()) else point.tag
    hyperparameters = group_hyperparameters(engine.optimizer)  # the config's, before DeepSpeed overwrites them
    try:
        load_path, client_state = engine.load_checkpoint(point.ckpt_dir, tag=tag)
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"checkpoint {Path(point.ckpt_dir) / tag}: DeepSpeed cannot load it: "
                              f"{type(err).__name__}: {err}") from err
    if load_path is None or not client_state or CLIENT_KEY not in client_state:
        raise CheckpointError(f"DeepSpeed loaded no checkpoint from {point.ckpt_dir}/{tag}")
    # DeepSpeed 0.19.8's ZeRO-3 universal load gives every param group group 0's hyper-parameters and one shared
    # Adam step counter (runtime/zero/stage3.py::load_hp_checkpoint_state_from_checkpoint_dir_stage3).
    repair_optimizer_after_load(engine, hyperparameters)
    state = client_state[CLIENT_KEY]
    logger.info("resumed from %s/%s at step %d (saved by %d ranks, loaded on %d)", point.ckpt_dir, tag,
                state["step"], state["world_size"], world_size())
    return state


def _realign_lr(engine) -> None:
    """Set every parameter group's lr from the current schedule at the loaded step (the module's LR rule)."""
    sched = getattr(engine, "lr_scheduler", None)
    if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
        return
    lrs = [base * fn(sched.last_epoch) for base, fn in zip(sched.base_lrs, sched.lr_lambdas)]
    for group, lr in zip(sched.optimizer.param_groups, lrs):
        group["lr"] = lr
    sched._last_lr = lrs  # what get_last_lr() reports, as LambdaLR.step() would set it


class CheckpointManager:
    """Plans, loads, saves and prunes the checkpoints of one job (see the module docstring).

    Args:
        cfg: the `CheckpointConfig` (interval, keep_last, resume, on_save_error).
        ckpt_dir: where this job saves (and "auto" looks).
        rank, world_size: this process in the job.
        config: the resolved TrainConfig as plain dicts (`albert_dist.config.to_container`), stored with every
            checkpoint and compared with the checkpoint's on resume.
        config_hash: `albert_dist.config.config_hash` of it.
        seed: `TrainConfig.seed` (dropout seeds when RNG states cannot be restored).

    Use: `plan()` (before the engine: no collectives unless `fetch` is given) -> `deepspeed_overrides()` into the
    DeepSpeed config -> `load(engine, make_loader)` -> ... -> `restore_rng()` last -> `maybe_save(...)` every step.
    """

    def __init__(self, cfg: Any, ckpt_dir: str | Path, *, rank: int, world_size: int, config: dict,
                 config_hash: str, seed: int):
        self.cfg = cfg
        self.ckpt_dir = Path(ckpt_dir)
        self.rank, self.world_size = rank, world_size
        self.config, self.config_hash, self.seed = config, config_hash, seed
        self.point: Optional[ResumePoint] = None
        self.state: Optional[TrainState] = None
        self.drift = Drift({})
        self.last_saved: Optional[int] = None
        self._planned = False

    def plan(self, fetch: Optional[Callable[[Path], Any]] = None, *, planned: bool = False,
             point: Optional[ResumePoint] = None) -> Optional[ResumePoint]:
        """Decide where to resume from (None: fresh start) and check the config against it.

        `fetch(ckpt_dir)` (collective, e.g. downloading an MLflow run's newest complete checkpoint into
        `ckpt_dir`) runs first and turns the resume into "auto". With `planned`, `point` is a plan already made
        (by the app, before the process group) and is taken as is. Raises `ConfigDriftError`, `CheckpointError`,
        `FileNotFoundError` as `plan_resume` and `check_drift`.
        """
        resume = self.cfg.resume
        if fetch is not None:
            fetch(self.ckpt_dir)
            resume, planned = "auto", False
        if not planned:
            point = plan_resume(resume, self.ckpt_dir, log=self.rank == 0)
            if resume == "auto" and point is None and self.rank == 0:  # a mistyped run_dir would restart silently
                logger.warning("--resume auto: no checkpoint in %s; starting from step 0", self.ckpt_dir)
        if point is not None:
            self.drift = check_drift(point, self.config, self.world_size)
            if self.rank == 0:
                log_drift(point, self.drift)
        self.point, self._planned = point, True
        return point

    def deepspeed_overrides(self) -> dict[str, Any]:
        """Entries to merge into the DeepSpeed config: `checkpoint.load_universal` when resuming elsewhere."""
        if self.point is not None and self.point.needs_universal(self.world_size):
            return {"checkpoint": {"load_universal": True}}
        return {}

    def load(self, engine, make_loader: Callable[[int, int], Any]):
        """Load the planned checkpoint into `engine` (collective) and return this rank's training loader,
        continuing the saved data streams (`albert_dist.engine.reshard`), or fresh ones when there is nothing
        to resume or the data config changed. Returns (step, loader). RNGs: call `restore_rng()` last."""
        from albert_dist.engine.reshard import build_resumed_loader

        if self.point is None:
            self.last_saved = None
            return 0, make_loader(self.rank, self.world_size)
        state = TrainState()
        state.load_state_dict(load_checkpoint(engine, self.point))
        self.state = state
        if state.config_hash != self.config_hash and not self.drift.changes and self.rank == 0:
            logger.warning("config differs from the checkpoint's (hash %s -> %s); continuing with the new one",
                           state.config_hash, self.config_hash)
        _realign_lr(engine)
        self.last_saved = state.step
        saved = None if self.drift.streams_restart else state.data_states
        return state.step, build_resumed_loader(make_loader, saved, self.world_size, self.rank)

    def restore_rng(self) -> None:
        """Restore this rank's saved RNG states (same world size), else seed from (seed, rank, step). Call it
        after everything that draws from the global RNGs while setting up."""
        state = self.state
        if state is None:
            seed_all(seed_for(self.seed, self.rank, 0))
        elif state.world_size == self.world_size:
            set_rng_state(state.rng_states[self.rank])
        else:  # an old rank's RNG stream cannot be split or merged
            seed_all(seed_for(self.seed, self.rank, state.step))

    def maybe_save(self, engine, step: int, data_state: Callable[[], Any], last: bool = False) -> Optional[str]:
        """Save step `step` when the cadence says so (`every(step, save_interval_steps, last)`) and it is not
        saved yet (collective); returns the tag or None.

        `data_state` is called only when saving (a loader's state_dict is not free). A failed save raises
        `CheckpointSaveError`, unless `checkpoint.on_save_error` is "continue" and this is an interval save: then
        it is logged (one line) and the next interval tries again. A `last` save (the final step, a stop) always
        raises: there is no next interval, and a stop must not exit as if a checkpoint had been written.
        """
        if self.last_saved == step or not every(step, self.cfg.save_interval_steps, last):
            return None
        try:
            tag = save_checkpoint(engine, self.ckpt_dir, step, data_state(), self.config_hash, self.cfg.keep_last,
                                  config=self.config, protect=self.point.tag if self.point else None)
        except CheckpointSaveError as err:
            if last or self.cfg.on_save_error != "continue":
                raise
            if self.rank == 0:
                logger.error("%s; training continues (checkpoint.on_save_error=continue)", err)
            return None
        self.last_saved = step
        return tag
