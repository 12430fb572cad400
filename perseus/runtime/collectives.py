"""Collectives on any process-group backend: NCCL-only groups refuse CPU tensors and gloo
refuses CUDA ones, so the tensor device follows the group's backend. torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "all_gather_objects",
    "all_reduce_max",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "collective_device",
    "global_rank",
    "group_rank",
    "group_size",
    "is_distributed",
    "uses_nccl",
]


def is_distributed() -> bool:
    """Whether torch.distributed is available and a default process group exists."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def global_rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    return group_rank()


def group_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the default group's by default; 0 when not
    distributed)."""
    if not is_distributed():
        return 0
    import torch.distributed as dist

    return int(dist.get_rank(group))


def uses_nccl(group: Any = None) -> bool:
    """Whether ``group`` only takes CUDA tensors (NCCL with no gloo for CPU tensors)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    return "nccl" in backend and "gloo" not in backend


def collective_device(group: Any = None) -> Any:
    """The device a tensor must live on for a collective over ``group``: the current CUDA
    device for an NCCL-only group, else the CPU."""
    import torch

    if uses_nccl(group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_max(values: Sequence[float], group: Any = None) -> tuple[float, ...]:
    """Element-wise MAX of ``values`` over ``group`` (the values themselves when not
    distributed): one float64 all-reduce."""
    return _all_reduce(values, "MAX", group)


def _all_reduce(values: Sequence[float], op: str, group: Any) -> tuple[float, ...]:
    if not is_distributed() or not values:
        return tuple(float(v) for v in values)
    import torch
    import torch.distributed as dist

    buf = torch.tensor([float(v) for v in values], dtype=torch.float64)
    buf = _to_device(buf, collective_device(group))
    dist.all_reduce(buf, op=getattr(dist.ReduceOp, op), group=group)
    return tuple(float(v) for v in buf.cpu().tolist())


def _to_device(tensor: Any, device: Any) -> Any:
    # One seam so tests can check which device a collective's buffer was put on without CUDA.
    return tensor if tensor.device == device else tensor.to(device)


def broadcast_object(obj: Any, src_group_rank: int = 0, group: Any = None) -> Any:
    """``obj`` from the group's rank ``src_group_rank``, on every rank of ``group``."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    src = dist.get_global_rank(group, src_group_rank) if group is not None else src_group_rank
    payload = [obj]
    dist.broadcast_object_list(payload, src=src, group=group, device=collective_device(group))
    return payload[0]


def group_size(group: Any = None) -> int:
    """How many processes ``group`` holds (the world's by default; 1 when not distributed)."""
    if not is_distributed():
        return 1
    import torch.distributed as dist

    return int(dist.get_world_size(group))


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in group-rank order ([obj] when not distributed)."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * group_size(group)
    # all_gather_object picks its device from the backend itself (current CUDA device for NCCL).
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def barrier(group: Any = None) -> None:
    """A barrier over ``group`` (no-op when not distributed)."""
    if not is_distributed():
        return
    import torch.distributed as dist

    if uses_nccl(group):
        import torch

        dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier(group=group)


def all_reduce_sum(values: Sequence[float], group: Any = None) -> tuple[float, ...]:
    """Element-wise SUM of ``values`` over ``group`` (see :func:`all_reduce_max`)."""
    return _all_reduce(values, "SUM", group)
