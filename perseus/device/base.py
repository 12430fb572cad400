"""The GPU interface every backend implements (NVML, simulated) and the agent relies on.

Clock values are SM clocks in MHz. Optional capabilities are ``runtime_checkable`` protocols:
test them with ``isinstance``, never ``hasattr``. Device events mark points on a GPU's compute
stream (a ``torch.cuda.Event``, or the simulated device's own), so the agent times ops and
schedules clock changes by one code path for both.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "GPU",
    "AppliedClockGPU",
    "ClockReadbackGPU",
    "CounterPeriodGPU",
    "DeviceEvent",
    "EventSource",
    "ManagedGPU",
    "MemoryClockGPU",
    "ObserveOnlyGPU",
    "ObserveOnlyWarning",
    "PowerLimitGPU",
    "nearest_clock_mhz",
]


@runtime_checkable
class GPU(Protocol):
    """One physical GPU, identified by UUID."""

    @property
    def uuid(self) -> str: ...

    @property
    def name(self) -> str: ...

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        """Supported SM clocks, highest first."""

    def set_locked_clock(self, freq_mhz: int) -> int:
        """Lock the SM clock to the supported clock nearest ``freq_mhz``; return that clock."""

    def reset_locked_clock(self) -> None:
        """Remove the lock (the driver's default DVFS resumes)."""

    def locked_clock_mhz(self) -> int | None:
        """The current lock, or None when unlocked."""

    def current_clock_mhz(self) -> int:
        """The SM clock the GPU runs at now."""

    def energy_mj(self) -> int:
        """Cumulative energy counter in millijoules (monotone)."""

    def power_w(self) -> float:
        """Current power draw in watts."""


@runtime_checkable
class ManagedGPU(GPU, Protocol):
    """A GPU the safety machinery can protect: the file whose exclusive lock makes a process
    its owner, and a JSON-able spec that lets the watchdog reset it after its owner died."""

    def owner_lock_path(self) -> Path: ...

    def watchdog_spec(self) -> dict[str, str]: ...


@runtime_checkable
class PowerLimitGPU(GPU, Protocol):
    """A GPU whose board power limit (watts) can be read and set; like a clock lock it
    outlives the process that set it, so whoever sets it must reset it."""

    def power_limit_range_w(self) -> tuple[float, float]:
        """``(min, max)`` power limit the driver accepts."""

    def power_limit_w(self) -> float:
        """The enforced power limit now."""

    def set_power_limit_w(self, power_limit_w: float) -> float:
        """Set the power limit; returns the value applied (out of range raises DeviceError)."""

    def reset_power_limit(self) -> None:
        """Restore the driver's default power limit."""


@runtime_checkable
class DeviceEvent(Protocol):
    """A point recorded on a device's compute stream; ``energy_mj`` is the energy counter as
    of the event's device time when the device can tell (the simulator), else None."""

    energy_mj: int | None

    def query(self) -> bool:
        """True once the device has passed this point (never blocks)."""

    def synchronize(self) -> None:
        """Block until the device has passed this point."""

    def device_time_s(self) -> float:
        """When the device passed this point, on :meth:`EventSource.timeline_now_s`'s clock."""


@runtime_checkable
class EventSource(Protocol):
    """Something that records events on the stream the training work runs on."""

    def record_event(self) -> DeviceEvent:
        """Record an event at the current end of the compute stream; returns at once."""

    def timeline_now_s(self) -> float:
        """Now, on the clock that :meth:`DeviceEvent.device_time_s` uses."""


@runtime_checkable
class AppliedClockGPU(Protocol):
    """A device that knows when the last clock set or reset took effect (the simulator)."""

    def clock_applied_s(self) -> float | None:
        """When the last change took effect, on the event timeline (None: none yet)."""


@runtime_checkable
class ClockReadbackGPU(Protocol):
    """A device that reads back the clocks it runs now and why: a lock is a request, the
    read-back says what the GPU delivered."""

    def current_clock_mhz(self) -> int: ...

    def clock_event_reasons(self) -> int:
        """NVML's bit mask of clock event reasons (0x4: the SW power cap)."""

    def current_memory_clock_mhz(self) -> int:
        """The memory clock the GPU runs at now."""


@runtime_checkable
class MemoryClockGPU(Protocol):
    """A device whose memory clock may be lockable (``docs/memory-clocks.md``); its
    ``reset_locked_clock`` also resets a memory lock it set."""

    def supported_memory_clocks_mhz(self) -> tuple[int, ...]:
        """Memory clocks, highest (the default) first; one (or none) on HBM boards."""

    def memory_clock_control(self) -> str | None:
        """Why the memory clock cannot be locked, or None when it can."""

    def set_memory_locked_clock(self, mem_freq_mhz: int) -> int:
        """Lock the memory clock (snapped); returns the clock locked."""

    def reset_memory_locked_clock(self) -> None:
        """Back to the default memory clock."""


@runtime_checkable
class CounterPeriodGPU(Protocol):
    """A device that says how often its energy counter is published (0: exact)."""

    publish_interval_s: float


@runtime_checkable
class ObserveOnlyGPU(Protocol):
    """A device that knows before any set call whether clocks can be changed (None: they can)."""

    observe_only_reason: str | None


class ObserveOnlyWarning(RuntimeWarning):
    """Clocks cannot be changed (no privilege, or unsupported); perseus only measures."""


def nearest_clock_mhz(ascending_mhz: Sequence[int], freq_mhz: int) -> int:
    """The clock in ``ascending_mhz`` nearest ``freq_mhz``, clamped to the ends; ties go to
    the higher clock, so snapping never slows an op below what a plan asked for."""
    i = bisect.bisect_left(ascending_mhz, freq_mhz)
    if i == 0:
        return ascending_mhz[0]
    if i == len(ascending_mhz):
        return ascending_mhz[-1]
    lo, hi = ascending_mhz[i - 1], ascending_mhz[i]
    return lo if freq_mhz - lo < hi - freq_mhz else hi
