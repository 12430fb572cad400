"""What the rank agent learns from its GPU as it starts (:func:`probe_gpu`), and how it
leaves the GPU's clocks as it stops (:func:`reset_clocks`)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from perseus.device.base import GPU, EventSource, MemoryClockGPU, ObserveOnlyGPU, ObserveOnlyWarning
from perseus.errors import DeviceError, DevicePermissionError
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.events import CudaEventSource, event_source_for

__all__ = [
    "GpuProbe",
    "probe_gpu",
    "reset_clocks",
    "warn_no_memory_clocks",
    "warn_observe_only",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """A GPU as the agent found it at start."""

    clocks_mhz: tuple[int, ...]  # supported SM clocks, ascending
    mem_clocks_mhz: tuple[int, ...]  # lockable memory clocks, ascending (empty: none)
    observe_only_reason: str | None  # known before any set call (privilege, pre-Volta)
    events: EventSource | None  # where device events come from (None: host timing)
    stamp_ops: bool  # whether the worker reads the counter at every op boundary


def probe_gpu(gpu: GPU, *, device_timing: bool, events: EventSource | None) -> GpuProbe:
    """Read what ``gpu`` offers (opens an NVML device); ``events``: those asked for (None:
    the GPU's own, or CUDA events, when ``device_timing``)."""
    if device_timing and events is None:
        events = event_source_for(gpu)
    mem: tuple[int, ...] = ()
    if isinstance(gpu, MemoryClockGPU) and gpu.memory_clock_control() is None:
        mem = tuple(sorted(gpu.supported_memory_clocks_mhz()))
    return GpuProbe(
        clocks_mhz=tuple(sorted(gpu.supported_clocks_mhz())),
        mem_clocks_mhz=mem,
        observe_only_reason=gpu.observe_only_reason if isinstance(gpu, ObserveOnlyGPU) else None,
        events=events if device_timing else None,
        # CUDA events carry no counter reading and NVML's counter is too coarse and too slow
        # to read per op (see FrequencyController's stamp_ops): iteration ends only.
        stamp_ops=not isinstance(events, CudaEventSource),
    )


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
    """Reset the GPU's clocks once a set call in flight returned (waits up to 2 s for the
    controller's device lock); the error, if the reset failed for a reason other than
    missing privilege (observe-only: nothing was locked by us)."""
    lock = ctl.device_lock if ctl is not None else None
    acquired = lock.acquire(timeout=2.0) if lock is not None else False
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
