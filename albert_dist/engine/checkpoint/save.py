"""The collective save protocol (see the package docstring): every rank writes its ZeRO partition, rank 0
verifies and only then moves `latest`; a failed write on any rank is the same `CheckpointSaveError` on all.
"""
from __future__ import annotations

import errno as errno_mod
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from albert_dist.engine.checkpoint.layout import (LATEST, META_FILE, META_FORMAT, CheckpointError, payload_files,
                                                 read_latest, tag_for, verify, write_latest)
from albert_dist.engine.checkpoint.retention import free_bytes, last_checkpoint_bytes, make_room, prune
from albert_dist.engine.checkpoint.state import CLIENT_KEY, TrainState, rng_state
# `_barrier` under this name: tests/distributed/ckpt_worker.py patches it to kill a rank inside a save
from albert_dist.distributed.collectives import all_gather_object, barrier as _barrier, global_rank, world_size

logger = logging.getLogger(__name__)

_MIB = 2**20

#: Free bytes under which a failed write is taken for a full disk (torch's zip writer raises a RuntimeError
#: without an errno, e.g. "unexpected pos 576 vs 534", when the file system fills up).
_FULL_DISK_BYTES = 1 << 20



class CheckpointSaveError(CheckpointError):
    """A save failed on some rank; the same error is raised on every rank. `path` and `errno` (None when
    unknown) name the first failing write; the partial checkpoint was removed and `latest` was kept."""

    def __init__(self, message: str, path: str = "", errno: Optional[int] = None):
        super().__init__(message)
        self.path = path
        self.errno = errno


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


def _state_bytes(obj: Any, seen: Optional[set] = None) -> int:
    """Bytes of the tensor storages in a (nested) state dict, each storage once: what `torch.save` writes,
    less the pickled structure around them (small: names, shapes, the data-loader and RNG states)."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_state_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v, seen) for v in obj)
    return 0


class _CapturingWriter:
    """Wraps DeepSpeed's checkpoint engine so a failed write is recorded, not raised inside DeepSpeed's
    collective save (a rank raising there leaves the others in DeepSpeed's closing barrier forever). Counts the
    bytes of every state handed to it, written or not (`state_bytes`), so a full disk can say what a
    checkpoint needs."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.error: Optional[tuple[str, str, Optional[int]]] = None  # (message, path, errno)
        self.state_bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _record(self, err: BaseException, path: str) -> None:
        if self.error is None:
            message, code = _describe_os_error(err, str(path))
            self.error = (message, str(path), code)

    def save(self, state_dict: Any, path: str) -> Any:
        self.state_bytes += _state_bytes(state_dict)
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


def _space_needed(reports: list[dict], ckpt_dir: Path) -> str:
    """What a full disk's message adds: the bytes a checkpoint of this job needs (the last one's size, else the
    tensor bytes all ranks handed to the writer) and the bytes that were free when the save started."""
    counted = sum(r["bytes"] for r in reports)
    first = reports[0]
    need = f"a checkpoint of this job needs about {counted / _MIB:.1f} MiB (the tensors every rank saves)"
    if first.get("last_bytes"):
        need = (f"a checkpoint of this job needs about {max(counted, first['last_bytes']) / _MIB:.1f} MiB "
                f"({first['last_tag']} took {first['last_bytes'] / _MIB:.1f} MiB)")
    return f"{need}, {first.get('free', 0) / _MIB:.1f} MiB were free in {ckpt_dir} when the save started"


def save_checkpoint(engine, ckpt_dir: str | Path, step: int, data_state: Any, config_hash: str,
                    keep_last: int, *, config: Optional[dict] = None, protect: Optional[str] = None,
                    reason: str = "interval", metrics_state: Any = None, stop_cause: Optional[str] = None,
                    healthy: Optional[str] = None) -> str:
    """Save step `step` on every rank (collective; see the module docstring for the protocol); returns the tag.

    `data_state` is this rank's `loader.state_dict()`; `config` the resolved config snapshot stored with it;
    `protect` a tag retention keeps until a newer verified checkpoint exists (the one the job resumed from);
    `reason` why it is written ("interval", "final", "stop"), recorded in `albert_dist.json`; `metrics_state`
    this rank's open metric interval (`MetricAccumulator.local_state()`, None: not saved); `stop_cause` what stopped
    a "stop" checkpoint's job ("signal", "store": an object store that stayed unavailable, "input": a file gone),
    recorded as ``stop_cause`` when given (launch/pretrain_local.sh names it); `healthy` a tag retention always keeps
    (the newest checkpoint known healthy, `retention.prune`).
    Before writing, rank 0 makes room (`retention.make_room`) when the free space is below the size of the last
    verified checkpoint.

    Raises:
        CheckpointSaveError: on every rank, when any rank's write failed or the checkpoint does not verify
            (the partial directory is removed, `latest` still names the previous checkpoint). On a full disk
            (ENOSPC) the message adds the bytes a checkpoint needs and the bytes free when the save started.
    """
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for(step)
    tag_dir = ckpt_dir / tag
    rank = global_rank()
    per_rank = all_gather_object({"data": data_state, "rng": rng_state(), "metrics": metrics_state})
    state = TrainState(step=step, config_hash=config_hash, config=dict(config or {}), world_size=world_size(),
                       zero_stage=int(engine.zero_optimization_stage()),
                       data_states=[s["data"] for s in per_rank], rng_states=[s["rng"] for s in per_rank],
                       metrics_states=[s["metrics"] for s in per_rank if s["metrics"] is not None])
    room: dict[str, Any] = {}  # rank 0: the space this save starts with (for a full disk's message)
    if rank == 0:  # an earlier attempt's save of this step (and its universal copy, which would be stale)
        for stale in (tag_dir, ckpt_dir / f"{tag}_universal"):
            if stale.exists():
                logger.warning("removing %s left by an earlier attempt before saving %s again", stale, tag)
                shutil.rmtree(stale, ignore_errors=True)
        # Headroom: with less free space than the last checkpoint took, retention runs before the save.
        last_tag, last_bytes = last_checkpoint_bytes(ckpt_dir)
        make_room(ckpt_dir, last_bytes, keep_last, protect=protect, healthy=healthy)
        room = {"free": free_bytes(ckpt_dir), "last_tag": last_tag, "last_bytes": last_bytes}
    writer = _CapturingWriter(engine.checkpoint_engine)
    engine.checkpoint_engine = writer
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={CLIENT_KEY: state.state_dict()},
                               save_latest=False)
    finally:
        engine.checkpoint_engine = writer._inner
    _barrier()  # every rank's files are on disk
    reports = all_gather_object({"error": writer.error, "bytes": writer.state_bytes, **room})
    failure = next((r["error"] for r in reports if r["error"] is not None), None)
    if failure is None and rank == 0:
        meta_path = tag_dir / META_FILE
        try:
            meta = {"format": META_FORMAT, "step": step, "world_size": state.world_size,
                    "zero_stage": state.zero_stage, "config_hash": config_hash, "reason": reason,
                    **({"stop_cause": stop_cause} if stop_cause else {}),
                    "config": state.config, "files": payload_files(tag_dir)}
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
        if code == errno_mod.ENOSPC:
            message += "; " + _space_needed(reports, ckpt_dir)
        previous = read_latest(ckpt_dir)
        kept = f"{ckpt_dir / LATEST} still names {previous}" if previous else "there is no complete checkpoint yet"
        raise CheckpointSaveError(f"checkpoint {tag_dir} not saved: {message}; {kept}", path, code)
    if rank == 0:
        prune(ckpt_dir, keep_last, protect=protect, healthy=healthy)
    _barrier()
    return tag
