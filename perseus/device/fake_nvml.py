"""A recording, fault-injecting fake of the ``pynvml`` module: perseus's test double for NVML.

Pass a :class:`FakeNvml` as ``nvml_module=``. It records every call and injects what real GPUs
show: failures, refused control calls, power caps overriding locks (the simulator's power
model), thermal limits, counter wrap and publish period, slow reads, on a given clock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from perseus.device.clock import Clock, RealClock
from perseus.device.nvml_calls import CLOCK_EVENT_BITS, NvmlConstants, is_control_function
from perseus.device.power_model import PowerModel, capped_clock_mhz
from perseus.device.presets import get_preset
from perseus.device.sim_shared import SimSharedState
from perseus.device.sim_state import State, advance, publish_tick, published_mj

__all__ = ["FakeDevice", "FakeNvml", "NVMLError", "h100"]

_IDLE = CLOCK_EVENT_BITS["gpu_idle"]
_SW_POWER_CAP = CLOCK_EVENT_BITS["sw_power_cap"]
_SW_THERMAL = CLOCK_EVENT_BITS["sw_thermal_slowdown"]
_A100 = get_preset("a100")  # what a device answers by default (its name, clocks and cap)


@dataclass
class FakeDevice:
    """One fake GPU: without a power model it runs its lock and draws ``power_mw``; with one,
    a ``busy`` device runs the highest clock at or below its lock that fits the power limit."""

    uuid: str
    name: str = _A100.name
    architecture: int = NvmlConstants.NVML_DEVICE_ARCH_AMPERE
    memory_clocks: Sequence[int] = (1593,)  # HBM: one memory clock (a GDDR board lists several)
    graphics_clocks: Sequence[int] = _A100.clocks_mhz
    mig_mode: int = 0
    persistence: int = 1
    energy_mj: int = 1_000_000  # the counter (published, before any wrap)
    power_mw: int = 83_640  # the draw when idle (or always, without a power model)
    sm_clock_mhz: int = 1410  # the clock requested when unlocked
    locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    #: The memory clock a busy board runs whatever its lock (a GeForce board under CUDA load).
    busy_memory_clock_mhz: int | None = None
    supports_mig_query: bool = True
    #: The counter as a function of the clock's time (None: ``energy_mj``).
    energy_fn: Callable[[float], int] | None = None
    power_limit_mw: int = 400_000
    default_power_limit_mw: int = 400_000
    min_power_limit_mw: int = 100_000
    max_power_limit_mw: int = 400_000
    instant_power_mw: int | None = 84_000  # None: the field is not supported
    clock_event_reasons: int = _IDLE  # the reasons when nothing holds the clock down
    has_event_reasons_name: bool = True  # False: only the older ...ThrottleReasons works
    app_clocks_restricted: int = 1  # enabled: only root may set application clocks
    busy: bool = False  # a kernel is running
    activity: float = 1.0
    #: Activities stepped through every ``activity_period_s`` (empty: ``activity``).
    activity_cycle: tuple[float, ...] = ()
    activity_period_s: float = 0.1
    power: PowerModel | None = None  # a preset's; None: no power model (the clock is the request)
    thermal_limit_mhz: int | None = None  # a thermal event holds the clock here
    energy_from_power: bool = False  # integrate the drawn power over the clock's time
    energy_publish_s: float = 0.0  # 0: every read sees the exact counter
    energy_wrap_mj: int | None = None  # the counter wraps to 0 here
    #: The simulator's energy integral (:mod:`.sim_state`) once integrating.
    integral: State | None = field(default=None, repr=False)

    @classmethod
    def from_preset(cls, uuid: str, key: str, **fields: Any) -> FakeDevice:
        """A device that behaves as the simulated GPU of preset ``key`` (its clocks, power
        model and limits; energy integrated and published every 100 ms); ``fields`` override."""
        preset = get_preset(key)
        idle_mw = round(preset.power.idle_w * 1000)
        cap_mw = round(preset.power_cap_w * 1000) if preset.power_cap_w else cls.power_limit_mw
        values: dict[str, Any] = {
            "name": preset.name,
            "architecture": getattr(
                NvmlConstants, f"NVML_DEVICE_ARCH_{preset.architecture.upper()}"
            ),
            "graphics_clocks": preset.clocks_mhz,
            "sm_clock_mhz": preset.clocks_mhz[0],
            "power_mw": idle_mw,
            "instant_power_mw": idle_mw,
            "power_limit_mw": cap_mw,
            "default_power_limit_mw": cap_mw,
            "min_power_limit_mw": round(cap_mw * SimSharedState.power_limit_min_share),
            "max_power_limit_mw": cap_mw,
            "power": preset.power,
            "activity": preset.activity,
            "energy_from_power": True,
            "energy_publish_s": 0.1,
        }
        if preset.memory is not None:
            values["memory_clocks"] = preset.memory.clocks_mhz
        return cls(uuid, **{**values, **fields})

    def load_activity(self, now_s: float) -> float:
        if not self.activity_cycle:
            return self.activity
        step = math.floor(now_s / self.activity_period_s)
        return self.activity_cycle[step % len(self.activity_cycle)]

    def applied(self, now_s: float) -> tuple[int, int]:
        """``(SM clock, clock event reasons)`` at ``now_s``."""
        request = self.locked[1] if self.locked is not None else self.sm_clock_mhz
        reasons = self.clock_event_reasons & ~_IDLE if self.busy else self.clock_event_reasons
        clock = request
        if self.busy and self.power is not None:
            activity, clocks = self.load_activity(now_s), sorted(self.graphics_clocks, reverse=True)
            power_of = {c: self.power.compute_power_w(c, activity) for c in clocks}
            fit = capped_clock_mhz(clocks, request, power_of, self.power_limit_mw / 1000.0)
            if fit < request:
                clock, reasons = fit, reasons | _SW_POWER_CAP
        if self.thermal_limit_mhz is not None and clock > self.thermal_limit_mhz:
            clock, reasons = self.thermal_limit_mhz, reasons | _SW_THERMAL
        return clock, reasons

    def power_now_w(self, now_s: float) -> float:
        if self.busy and self.power is not None:
            return self.power.compute_power_w(self.applied(now_s)[0], self.load_activity(now_s))
        return self.power_mw / 1000.0

    def advance_energy(self, now_s: float) -> None:
        """Integrate the drawn power up to ``now_s`` and publish the counter."""
        if not self.energy_from_power:
            return
        if self.integral is None:
            publish = self.energy_publish_s
            self.integral = {
                "energy_j": self.energy_mj / 1000.0,
                "t_last": now_s,
                "publish_interval_s": publish,
                "pub_tick": publish_tick(now_s, publish),
                "pub_mj": self.energy_mj,
            }
        state = self.integral
        state["idle_power_w"] = self.power_now_w(float(state["t_last"]))
        advance(state, now_s)
        self.energy_mj = published_mj(state, now_s)


# pynvml's messages (``nvmlErrorString``) for the codes the fake raises.
_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: the NVML return code in ``value``, pynvml's message."""

    def __init__(self, value: int) -> None:
        super().__init__(_MESSAGES.get(value, f"NVML Error with code {value}"))
        self.value = value


def _reads(function: str, attribute: str) -> Callable[[FakeNvml, Any], Any]:
    """The fake's NVML getter ``function``: records the call, returns a device attribute."""

    def get(self: FakeNvml, handle: Any) -> Any:
        return getattr(self._on(function, handle), attribute)

    get.__name__ = function
    return get


def _answers(function: str, value: Any) -> Callable[[FakeNvml], Any]:
    """The fake's system getter ``function``: records the call and returns ``value``."""

    def get(self: FakeNvml) -> Any:
        self._record(function)
        return value

    get.__name__ = function
    return get


@dataclass
class FakeNvml(NvmlConstants):
    """Module-like fake of ``pynvml``; pass it as ``nvml_module=``.

    Attributes:
        devices: The GPUs, in NVML (PCI) order.
        calls: Every call so far, ``(name, args)``, refused and failed ones included.
        failures: Per function, the error codes its next calls raise (see :meth:`fail`).
        refuse_control: Every call that would change a device raises ``NO_PERMISSION``.
        latency_s: Per function, how long a call takes (slept on ``clock``).
        clock: Where time comes from.
        gates: Per function, an event each call waits on (up to 5 s) once recorded.
    """

    devices: list[FakeDevice] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)
    refuse_control: bool = False
    latency_s: dict[str, float] = field(default_factory=dict)
    clock: Clock = field(default_factory=RealClock)
    initialized: int = 0
    gates: dict[str, threading.Event] = field(default_factory=dict)

    NVMLError = NVMLError

    def control_calls(self) -> list[str]:
        """Calls that change a device, refused ones included."""
        return [name for name in self.names() if is_control_function(name)]

    def fail(self, name: str, code: int, times: int = 1) -> None:
        """Make the next ``times`` calls of ``name`` raise ``NVMLError(code)``."""
        self.failures.setdefault(name, []).extend([code] * times)

    def names(self) -> list[str]:
        """The names of the calls so far, in order."""
        return [name for name, _ in self.calls]

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        gate = self.gates.get(name)
        if gate is not None:
            gate.wait(5.0)
        delay_s = self.latency_s.get(name, 0.0)
        if delay_s > 0:
            self.clock.sleep(delay_s)
        queue = self.failures.get(name)
        if queue:
            raise NVMLError(queue.pop(0))
        if self.refuse_control and is_control_function(name):
            raise NVMLError(self.NVML_ERROR_NO_PERMISSION)

    def _on(self, name: str, handle: Any, *args: Any) -> FakeDevice:
        """Record a call of ``name`` on the device ``handle``; the device."""
        self._record(name, handle, *args)
        return self._dev(handle)

    def _dev(self, handle: Any) -> FakeDevice:
        if not isinstance(handle, FakeDevice):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def _setting(self, name: str, handle: Any, *args: Any) -> FakeDevice:
        """:meth:`_on` for a call that changes the device, its energy integrated first."""
        device = self._on(name, handle, *args)
        device.advance_energy(self.clock.now())
        return device

    def set_busy(self, handle: Any, busy: bool = True) -> None:
        """Start or stop a kernel on the device (not an NVML call; not recorded)."""
        device = self._dev(handle)
        device.advance_energy(self.clock.now())
        device.busy = busy

    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")
        self.initialized -= 1

    nvmlSystemGetDriverVersion = _answers("nvmlSystemGetDriverVersion", "550.54.15")
    nvmlSystemGetNVMLVersion = _answers("nvmlSystemGetNVMLVersion", "12.550.54.15")
    nvmlSystemGetCudaDriverVersion_v2 = _answers("nvmlSystemGetCudaDriverVersion_v2", 12040)

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

    nvmlDeviceGetUUID = _reads("nvmlDeviceGetUUID", "uuid")
    nvmlDeviceGetName = _reads("nvmlDeviceGetName", "name")

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        d = self._on("nvmlDeviceGetMigMode", handle)
        if not d.supports_mig_query:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return d.mig_mode, d.mig_mode

    nvmlDeviceGetArchitecture = _reads("nvmlDeviceGetArchitecture", "architecture")
    nvmlDeviceGetPersistenceMode = _reads("nvmlDeviceGetPersistenceMode", "persistence")

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return list(self._on("nvmlDeviceGetSupportedMemoryClocks", handle).memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_mhz: int) -> list[int]:
        d = self._on("nvmlDeviceGetSupportedGraphicsClocks", handle, memory_mhz)
        return list(d.graphics_clocks)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        d = self._setting("nvmlDeviceSetGpuLockedClocks", handle, low_mhz, high_mhz)
        d.locked, d.sm_clock_mhz = (low_mhz, high_mhz), high_mhz

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._setting("nvmlDeviceResetGpuLockedClocks", handle).locked = None

    def nvmlDeviceSetMemoryLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        d = self._setting("nvmlDeviceSetMemoryLockedClocks", handle, low_mhz, high_mhz)
        if len(d.memory_clocks) < 2 or d.architecture < self.NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        d.mem_locked = (low_mhz, high_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        self._setting("nvmlDeviceResetMemoryLockedClocks", handle).mem_locked = None

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        d = self._on("nvmlDeviceGetClockInfo", handle, clock_type)
        if clock_type == self.NVML_CLOCK_MEM:
            if d.busy and d.busy_memory_clock_mhz is not None:
                return d.busy_memory_clock_mhz
            return d.mem_locked[1] if d.mem_locked is not None else max(d.memory_clocks)
        return d.applied(self.clock.now())[0]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        d = self._on("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if not d.has_event_reasons_name:  # an older driver without the symbol
            raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        return d.applied(self.clock.now())[1]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        d = self._on("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return d.applied(self.clock.now())[1]

    def nvmlDeviceGetAPIRestriction(self, handle: Any, api: int) -> int:
        return self._on("nvmlDeviceGetAPIRestriction", handle, api).app_clocks_restricted

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        d = self._on("nvmlDeviceGetTotalEnergyConsumption", handle)
        now_s = self.clock.now()
        if d.energy_fn is not None:
            value = int(d.energy_fn(now_s))
        else:
            d.advance_energy(now_s)
            value = d.energy_mj
        return value % d.energy_wrap_mj if d.energy_wrap_mj else value

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        d = self._on("nvmlDeviceGetPowerUsage", handle)
        return self._drawn_mw(d, d.power_mw)

    def _drawn_mw(self, d: FakeDevice, idle_mw: int) -> int:
        """A power read: the power model's draw now, else ``idle_mw``."""
        return round(d.power_now_w(self.clock.now()) * 1000) if d.power is not None else idle_mw

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[Any]:
        d = self._on("nvmlDeviceGetFieldValues", handle, tuple(field_ids))
        out = []
        for entry in field_ids:
            fid = entry[0] if isinstance(entry, tuple) else entry
            ok = fid == self.NVML_FI_DEV_POWER_INSTANT and d.instant_power_mw is not None
            milliwatts = self._drawn_mw(d, d.instant_power_mw or 0)
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=0 if ok else self.NVML_ERROR_NOT_SUPPORTED,
                    valueType=1,
                    value=SimpleNamespace(uiVal=milliwatts if ok else 0),
                )
            )
        return out

    nvmlDeviceGetPowerManagementLimit = _reads(
        "nvmlDeviceGetPowerManagementLimit", "power_limit_mw"
    )
    nvmlDeviceGetPowerManagementDefaultLimit = _reads(
        "nvmlDeviceGetPowerManagementDefaultLimit", "default_power_limit_mw"
    )

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        d = self._on("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return d.min_power_limit_mw, d.max_power_limit_mw

    nvmlDeviceGetEnforcedPowerLimit = _reads("nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw")

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        d = self._setting("nvmlDeviceSetPowerManagementLimit", handle, limit_mw)
        d.power_limit_mw = limit_mw


#: Activities that put the ``h100`` preset's cap-bound clock at 1725 ... 1485 MHz in turn, as
#: a d_model 4096 layer ran on a real H100 under its 700 W cap.
_H100_ACTIVITY_CYCLE = (0.75, 0.865, 0.96, 1.04, 1.13)


def h100(
    uuid: str = "GPU-00000000-0000-0000-0000-000000000100",
    *,
    refuse_control: bool = False,
    clock: Clock | None = None,
    busy: bool = False,
) -> FakeNvml:
    """One NVIDIA H100 80GB HBM3 replaying its measured behaviour: one HBM3 memory clock, a
    700 W cap holding a heavy kernel at 1485-1725 MHz (a real one: 1485-1740) with
    ``sw_power_cap`` set, a counter published every 100 ms and read in ~3 ms.

    Args:
        refuse_control: Every set/reset call raises ``NO_PERMISSION``.
        busy: Start with the heavy kernel running.
    """
    device = FakeDevice.from_preset(
        uuid,
        "h100",
        memory_clocks=(2619,),
        min_power_limit_mw=200_000,
        busy=busy,
        activity_cycle=_H100_ACTIVITY_CYCLE,
    )
    return FakeNvml(
        devices=[device],
        refuse_control=refuse_control,
        latency_s={"nvmlDeviceGetTotalEnergyConsumption": 0.003},
        clock=clock if clock is not None else RealClock(),
    )
