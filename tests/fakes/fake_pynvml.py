"""A recording fake of the ``pynvml`` module: the functions perseus's NVML backend calls.

Every call is appended to ``calls`` as ``(name, args)``. ``fail(name, code, times)`` makes the
next calls of ``name`` raise ``NVMLError(code)``; ``NVML_ERROR_*`` constants carry the real
values from nvidia-ml-py (a test checks them against the installed package).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeDevice", "FakeNvml"]


@dataclass
class FakeDevice:
    """One fake GPU."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    architecture: int = 7  # NVML_DEVICE_ARCH_AMPERE
    memory_clocks: Sequence[int] = (1593, 1215)
    graphics_clocks: Sequence[int] = tuple(range(1410, 209, -15))
    mig_mode: int = 0
    persistence: int = 1
    energy_mj: int = 1_000_000
    power_mw: int = 83_640
    sm_clock_mhz: int = 1410
    locked: tuple[int, int] | None = None
    supports_mig_query: bool = True


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: carries the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeNvml:
    """Module-like fake; pass it as ``nvml_module=``."""

    devices: list[FakeDevice] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)
    initialized: int = 0

    NVMLError = NVMLError
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24
    NVML_ERROR_UNKNOWN = 999
    NVML_DEVICE_ARCH_VOLTA = 5
    NVML_CLOCK_SM = 1
    NVML_DEVICE_MIG_ENABLE = 1

    def fail(self, name: str, code: int, times: int = 1) -> None:
        """Make the next ``times`` calls of ``name`` raise ``NVMLError(code)``."""
        self.failures.setdefault(name, []).extend([code] * times)

    def names(self) -> list[str]:
        """The names of the calls so far, in order."""
        return [name for name, _ in self.calls]

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        queue = self.failures.get(name)
        if queue:
            raise NVMLError(queue.pop(0))

    def _dev(self, handle: Any) -> FakeDevice:
        if not isinstance(handle, FakeDevice):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    # Initialization -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._record("nvmlSystemGetDriverVersion")
        return "550.54.15"

    # Device discovery -----------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._record("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._record("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.devices):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        self._record("nvmlDeviceGetHandleByUUID", uuid)
        for d in self.devices:
            if d.uuid == uuid:
                return d
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._record("nvmlDeviceGetUUID", handle)
        return self._dev(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._record("nvmlDeviceGetName", handle)
        return self._dev(handle).name

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        self._record("nvmlDeviceGetMigMode", handle)
        d = self._dev(handle)
        if not d.supports_mig_query:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return d.mig_mode, d.mig_mode

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        self._record("nvmlDeviceGetArchitecture", handle)
        return self._dev(handle).architecture

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPersistenceMode", handle)
        return self._dev(handle).persistence

    # Clocks ---------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        self._record("nvmlDeviceGetSupportedMemoryClocks", handle)
        return list(self._dev(handle).memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_mhz: int) -> list[int]:
        self._record("nvmlDeviceGetSupportedGraphicsClocks", handle, memory_mhz)
        return list(self._dev(handle).graphics_clocks)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        self._record("nvmlDeviceSetGpuLockedClocks", handle, low_mhz, high_mhz)
        d = self._dev(handle)
        d.locked = (low_mhz, high_mhz)
        d.sm_clock_mhz = high_mhz

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._record("nvmlDeviceResetGpuLockedClocks", handle)
        self._dev(handle).locked = None

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        self._record("nvmlDeviceGetClockInfo", handle, clock_type)
        return self._dev(handle).sm_clock_mhz

    # Sensors --------------------------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._record("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._dev(handle).energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerUsage", handle)
        return self._dev(handle).power_mw
