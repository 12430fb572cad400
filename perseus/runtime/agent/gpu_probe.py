"""What the rank agent reads from and says about its GPU as it starts, and how it leaves the
GPU's clocks as it stops (:func:`reset_clocks`)."""

from __future__ import annotations

import logging
import warnings

from perseus.device.base import GPU, MemoryClockGPU, ObserveOnlyWarning
from perseus.errors import DeviceError, DevicePermissionError
from perseus.runtime.agent.controller import FrequencyController

__all__ = [
    "lockable_memory_clocks",
    "reset_clocks",
    "warn_no_memory_clocks",
    "warn_observe_only",
]

_log = logging.getLogger(__name__)


def lockable_memory_clocks(gpu: GPU) -> tuple[int, ...]:
    """The memory clocks ``gpu`` can lock, ascending (empty: none, or not lockable)."""
    if isinstance(gpu, MemoryClockGPU) and gpu.memory_clock_control() is None:
        return tuple(sorted(gpu.supported_memory_clocks_mhz()))
    return ()


def warn_observe_only(gpu: GPU, reason: str) -> None:
    """Clocks cannot be set here: say so once, as the agent starts."""
    warnings.warn(
        f"perseus: cannot lock clocks on {gpu.name}; observe-only mode (time and energy are "
        f"still measured): {reason}",
        ObserveOnlyWarning,
        stacklevel=4,
    )


def warn_no_memory_clocks(rank: int, gpu: GPU | None) -> None:
    """The plan sets memory clocks this GPU cannot lock: log it (once per agent)."""
    why = "it has no memory clock control"
    if isinstance(gpu, MemoryClockGPU):
        why = gpu.memory_clock_control() or why
    _log.warning(
        "rank %d: the plan sets memory clocks but %s cannot lock them (%s); running its SM "
        "clocks at the default memory clock, so its predicted figures will not hold",
        rank,
        gpu.name if gpu is not None else "no GPU",
        why,
    )


def reset_clocks(gpu: GPU, ctl: FrequencyController | None) -> DeviceError | None:
    """Reset the GPU's clocks once a set call in flight returned (up to 2 s: see
    :class:`~perseus.runtime.agent.clock_setter.DeviceLock`); the error, if the reset failed
    for a reason other than missing privilege (observe-only: nothing was locked by us)."""
    lock = ctl.device_lock if ctl is not None else None
    acquired = lock.acquire_for_reset() if lock is not None else False
    try:
        gpu.reset_locked_clock()
    except DevicePermissionError:
        pass
    except DeviceError as e:
        return e
    finally:
        if acquired and lock is not None:
            lock.release()
    return None
