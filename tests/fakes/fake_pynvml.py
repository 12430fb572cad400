"""A recording fake of the ``pynvml`` module: the functions perseus's NVML backend calls.

Every call is appended to ``calls`` as ``(name, args)``. ``fail(name, code, times)`` makes the
next calls of ``name`` raise ``NVMLError(code)``; ``NVML_ERROR_*`` constants carry the real
values from nvidia-ml-py (a test checks them against the installed package).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeDevice", "FakeNvml"]


@dataclass
class FakeDevice:
    """One fake GPU."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    architecture: int = 7  # NVML_DEVICE_ARCH_AMPERE
    memory_clocks: Sequence[int] = (1593,)  # HBM: one memory clock (a GDDR board lists several)
    graphics_clocks: Sequence[int] = tuple(range(1410, 209, -15))
    mig_mode: int = 0
    persistence: int = 1
    energy_mj: int = 1_000_000
    power_mw: int = 83_640
    sm_clock_mhz: int = 1410
    locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    supports_mig_query: bool = True
    #: None: ``energy_mj`` is returned as is; else the counter as a function of time (s).
    energy_fn: Callable[[float], int] | None = None
    power_limit_mw: int = 400_000
    default_power_limit_mw: int = 400_000
    min_power_limit_mw: int = 100_000
    max_power_limit_mw: int = 400_000
    instant_power_mw: int | None = 84_000  # None: the field is not supported
    clock_event_reasons: int = 0x1  # gpu_idle
    has_event_reasons_name: bool = True  # False: only the older ...ThrottleReasons works
    app_clocks_restricted: int = 1  # NVML_FEATURE_ENABLED: only root may set them


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
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS = 0
    NVML_FEATURE_ENABLED = 1

    def control_calls(self) -> list[str]:
        """Calls that change a device (every ``nvmlDeviceSet*``/``Reset*``/``Clear*``)."""
        prefixes = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear", "nvmlDeviceModify")
        return [name for name in self.names() if name.startswith(prefixes)]

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

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._record("nvmlSystemGetNVMLVersion")
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._record("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

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

    def nvmlDeviceSetMemoryLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        self._record("nvmlDeviceSetMemoryLockedClocks", handle, low_mhz, high_mhz)
        d = self._dev(handle)
        if len(d.memory_clocks) < 2 or d.architecture < 7:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        d.mem_locked = (low_mhz, high_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        self._record("nvmlDeviceResetMemoryLockedClocks", handle)
        self._dev(handle).mem_locked = None

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        self._record("nvmlDeviceGetClockInfo", handle, clock_type)
        return self._dev(handle).sm_clock_mhz

    # Sensors --------------------------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._record("nvmlDeviceGetTotalEnergyConsumption", handle)
        d = self._dev(handle)
        return d.energy_mj if d.energy_fn is None else d.energy_fn(time.monotonic())

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[Any]:
        self._record("nvmlDeviceGetFieldValues", handle, tuple(field_ids))
        d = self._dev(handle)
        out = []
        for entry in field_ids:
            fid = entry[0] if isinstance(entry, tuple) else entry
            ok = fid == self.NVML_FI_DEV_POWER_INSTANT and d.instant_power_mw is not None
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=0 if ok else self.NVML_ERROR_NOT_SUPPORTED,
                    valueType=1,
                    value=SimpleNamespace(uiVal=d.instant_power_mw if ok else 0),
                )
            )
        return out

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerManagementLimit", handle)
        return self._dev(handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return self._dev(handle).default_power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        self._record("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        d = self._dev(handle)
        return d.min_power_limit_mw, d.max_power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._record("nvmlDeviceGetEnforcedPowerLimit", handle)
        return self._dev(handle).power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        self._record("nvmlDeviceSetPowerManagementLimit", handle, limit_mw)
        self._dev(handle).power_limit_mw = limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._record("nvmlDeviceGetCurrentClocksEventReasons", handle)
        d = self._dev(handle)
        if not d.has_event_reasons_name:  # an older driver without the symbol
            raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        return d.clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        self._record("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return self._dev(handle).clock_event_reasons

    def nvmlDeviceGetAPIRestriction(self, handle: Any, api: int) -> int:
        self._record("nvmlDeviceGetAPIRestriction", handle, api)
        return self._dev(handle).app_clocks_restricted

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        self._record("nvmlDeviceGetMaxClockInfo", handle, clock_type)
        return max(self._dev(handle).graphics_clocks)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerUsage", handle)
        return self._dev(handle).power_mw
