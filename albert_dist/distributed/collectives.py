"""Collectives of small Python objects and host tensors over the process group, each a no-op on one rank."""
from __future__ import annotations

from typing import Any, Optional


def is_multi_rank() -> bool:
    """True when a torch.distributed process group is up with more than one rank, i.e. when a collective is
    needed (a single process, or one before init / after destroy, reduces nothing)."""
    import torch.distributed as tdist

    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def global_rank() -> int:
    """This process's rank in the process group; 0 without one."""
    import torch.distributed as tdist

    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def world_size() -> int:
    """Ranks in the process group; 1 without one."""
    import torch.distributed as tdist

    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` from rank `src` on every rank (``broadcast_object_list``; collective); `obj` itself on one rank."""
    if not is_multi_rank():
        return obj
    import torch.distributed as tdist

    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (``all_gather_object``; collective); ``[obj]`` on one rank."""
    if not is_multi_rank():
        return [obj]
    import torch.distributed as tdist

    out: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def host_group(timeout_s: Optional[float] = None) -> Any:
    """The process group for collectives of small host (CPU) tensors, such as the stop flag each step: None (the
    default group) when that is gloo already (CPU jobs), else a gloo group of every rank, made here.

    Why: the same collective through NCCL needs the tensor on the device, and reading its result back drains the
    device's queue every time. Collective when it makes a group (`torch.distributed.new_group`): every rank calls
    it at the same point, after the process group is up. `timeout_s`: the made group's collective timeout
    (None: torch's default for gloo, 30 min).
    """
    if not is_multi_rank():
        return None
    import torch.distributed as tdist

    if tdist.get_backend() == "gloo":
        return None
    from datetime import timedelta

    return tdist.new_group(backend="gloo", timeout=None if timeout_s is None else timedelta(seconds=timeout_s))


def barrier() -> None:
    """Wait for every rank (collective); nothing to wait for on one rank."""
    if is_multi_rank():
        import torch.distributed as tdist

        tdist.barrier()
