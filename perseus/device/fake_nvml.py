"""A recording, fault-injecting fake of the ``pynvml`` module: perseus's test double for NVML.

Pass a :class:`FakeNvml` wherever perseus takes ``nvml_module=`` (as httpx ships
``MockTransport`` next to its transports). It answers every NVML function perseus calls, records
each call in ``calls`` as ``(name, args)``, and injects the faults a real GPU shows:

* ``fail(name, code, times)``: the next calls of ``name`` raise ``NVMLError(code)``;
* ``refuse_control=True``: every call that would change a device (``nvmlDeviceSet*``,
  ``nvmlDeviceReset*``, ...) raises ``NO_PERMISSION``, what a container without
  ``CAP_SYS_ADMIN`` sees;
* power caps that override locks: a busy device with a power model (``dynamic_power_w``) runs
  the highest supported clock at or below its request whose power fits the enforced limit, and
  sets the ``sw_power_cap`` event reason;
* thermal events (``thermal_limit_mhz``: clock held there, ``sw_thermal_slowdown`` set);
* counter wrap (``energy_wrap_mj``), energy published only every ``energy_publish_s``;
* slow reads (``latency_s``: a per-function delay, slept on the fake's clock).

Time comes from :mod:`perseus.device.clock` (``clock=``), so tests drive the fake on a
:class:`~perseus.device.clock.VirtualClock`. :func:`h100` replays a real H100 80GB HBM3's
behaviour. ``NVML_ERROR_*`` constants carry nvidia-ml-py's values (a test checks them).

:mod:`perseus.device.shared_fake_nvml` loads this file by path in a watchdog process (which
imports only the installed perseus's clock and NVML modules).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from perseus.device.clock import Clock, RealClock
from perseus.device.nvml_calls import is_control_function

__all__ = ["FakeDevice", "FakeNvml", "NVMLError", "h100"]

_IDLE = 0x1
_SW_POWER_CAP = 0x4
_SW_THERMAL = 0x20


@dataclass
class FakeDevice:
    """One fake GPU (plain data, so a shared fake can keep it in a JSON file).

    Without a power model (``dynamic_power_w == 0``) the SM clock read back is the lock (or
    ``sm_clock_mhz``). With one, a ``busy`` device draws
    ``static_power_w + activity * dynamic_power_w * (f / f_max) ** 3`` and runs the highest
    supported clock at or below its request that fits the enforced power limit.
    """

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    architecture: int = 7  # NVML_DEVICE_ARCH_AMPERE
    memory_clocks: Sequence[int] = (1593,)  # HBM: one memory clock (a GDDR board lists several)
    graphics_clocks: Sequence[int] = tuple(range(1410, 209, -15))
    mig_mode: int = 0
    persistence: int = 1
    energy_mj: int = 1_000_000
    power_mw: int = 83_640  # the draw when idle (or always, without a power model)
    sm_clock_mhz: int = 1410  # the clock requested when unlocked
    locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    #: The memory clock a busy board runs whatever its lock (a GeForce board drops to its P2
    #: state's memory clock under CUDA load); None: the lock, else the highest.
    busy_memory_clock_mhz: int | None = None
    supports_mig_query: bool = True
    #: None: ``energy_mj`` is returned as is (or integrated from power, see
    #: ``energy_from_power``); else the counter as a function of the clock's time (s).
    energy_fn: Callable[[float], int] | None = None
    power_limit_mw: int = 400_000
    default_power_limit_mw: int = 400_000
    min_power_limit_mw: int = 100_000
    max_power_limit_mw: int = 400_000
    instant_power_mw: int | None = 84_000  # None: the field is not supported
    clock_event_reasons: int = _IDLE  # the reasons when nothing holds the clock down
    has_event_reasons_name: bool = True  # False: only the older ...ThrottleReasons works
    app_clocks_restricted: int = 1  # NVML_FEATURE_ENABLED: only root may set them
    # The load and power model ------------------------------------------------------------
    busy: bool = False  # a kernel is running
    activity: float = 1.0
    #: When set, the activity steps through these values every ``activity_period_s``.
    activity_cycle: tuple[float, ...] = ()
    activity_period_s: float = 0.1
    static_power_w: float = 0.0
    dynamic_power_w: float = 0.0  # 0: no power model (the clock is the request)
    thermal_limit_mhz: int | None = None  # a thermal event holds the clock here
    # The energy counter ------------------------------------------------------------------
    energy_from_power: bool = False  # integrate the drawn power over the clock's time
    energy_publish_s: float = 0.0  # 0: every read sees the exact counter
    energy_wrap_mj: int | None = None  # the counter wraps to 0 here
    exact_energy_mj: float = 0.0
    energy_t_s: float | None = None

    # -------------------------------------------------------------------------------------
    def load_activity(self, now_s: float) -> float:
        if not self.activity_cycle:
            return self.activity
        step = math.floor(now_s / self.activity_period_s)
        return self.activity_cycle[step % len(self.activity_cycle)]

    def power_at_w(self, freq_mhz: int, activity: float) -> float:
        """The power drawn busy at ``freq_mhz`` (the model above)."""
        top = max(self.graphics_clocks)
        return self.static_power_w + activity * self.dynamic_power_w * (freq_mhz / top) ** 3

    def requested_clock_mhz(self) -> int:
        return self.locked[1] if self.locked is not None else self.sm_clock_mhz

    def applied(self, now_s: float) -> tuple[int, int]:
        """``(SM clock, clock event reasons)`` at ``now_s``."""
        request = self.requested_clock_mhz()
        reasons = self.clock_event_reasons & ~_IDLE if self.busy else self.clock_event_reasons
        clock = request
        if self.busy and self.dynamic_power_w > 0:
            cap_w = self.power_limit_mw / 1000.0
            activity = self.load_activity(now_s)
            fitting = [
                c
                for c in self.graphics_clocks
                if c <= request and self.power_at_w(c, activity) <= cap_w
            ]
            fit = max(fitting) if fitting else min(self.graphics_clocks)
            if fit < request:
                clock, reasons = fit, reasons | _SW_POWER_CAP
        if self.thermal_limit_mhz is not None and clock > self.thermal_limit_mhz:
            clock, reasons = self.thermal_limit_mhz, reasons | _SW_THERMAL
        return clock, reasons

    def power_now_w(self, now_s: float) -> float:
        if self.busy and self.dynamic_power_w > 0:
            return self.power_at_w(self.applied(now_s)[0], self.load_activity(now_s))
        return self.power_mw / 1000.0

    def advance_energy(self, now_s: float) -> None:
        """Integrate the drawn power up to ``now_s`` (power is constant between calls: every
        state change goes through the fake, which advances first)."""
        if not self.energy_from_power:
            return
        if self.energy_t_s is None:
            self.energy_t_s, self.exact_energy_mj = now_s, float(self.energy_mj)
            return
        if now_s <= self.energy_t_s:
            return
        power_w = self.power_now_w(self.energy_t_s)
        publish = self.energy_publish_s
        if publish > 0:
            tick = math.floor(now_s / publish) * publish
            if tick > self.energy_t_s:
                self.energy_mj = int(
                    self.exact_energy_mj + power_w * (tick - self.energy_t_s) * 1e3
                )
        self.exact_energy_mj += power_w * (now_s - self.energy_t_s) * 1e3
        self.energy_t_s = now_s
        if publish <= 0:
            self.energy_mj = int(self.exact_energy_mj)


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
    """Like ``pynvml.NVMLError``: carries the NVML return code in ``value``, and says what
    pynvml says."""

    def __init__(self, value: int) -> None:
        super().__init__(_MESSAGES.get(value, f"NVML Error with code {value}"))
        self.value = value


def _reads(function: str, attribute: str) -> Callable[[FakeNvml, Any], Any]:
    """The fake's NVML getter ``function``: records the call and returns one device attribute."""

    def get(self: FakeNvml, handle: Any) -> Any:
        self._record(function, handle)
        return getattr(self._dev(handle), attribute)

    get.__name__ = function
    return get


@dataclass
class FakeNvml:
    """Module-like fake of ``pynvml``; pass it as ``nvml_module=``.

    Attributes:
        devices: The GPUs, in NVML (PCI) order.
        calls: Every call so far, ``(name, args)``, refused and failed ones included.
        failures: Per function, the error codes its next calls raise (see :meth:`fail`).
        refuse_control: Every call that would change a device raises ``NO_PERMISSION``.
        latency_s: Per function, how long a call takes (slept on ``clock``).
        clock: Where time comes from (the power model, the energy counter, slow reads).
        gates: Per function, an event each call waits on (up to 5 s) once recorded: a test
            holds a driver call in flight until it sets the event.
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
    NVML_SUCCESS = 0
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
    NVML_DEVICE_ARCH_AMPERE = 7
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_CLOCK_GRAPHICS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS = 0
    NVML_FEATURE_ENABLED = 1

    def control_calls(self) -> list[str]:
        """Calls that change a device (every ``nvmlDeviceSet*``/``Reset*``/``Clear*``), refused
        ones included."""
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

    def _dev(self, handle: Any) -> FakeDevice:
        if not isinstance(handle, FakeDevice):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def _changing(self, handle: Any) -> FakeDevice:
        """The device, its energy integrated up to now (before its state changes)."""
        device = self._dev(handle)
        device.advance_energy(self.clock.now())
        return device

    def set_busy(self, handle: Any, busy: bool = True, activity: float | None = None) -> None:
        """Start or stop a kernel on the device (not an NVML call; not recorded)."""
        device = self._changing(handle)
        device.busy = busy
        if activity is not None:
            device.activity = activity

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

    nvmlDeviceGetUUID = _reads("nvmlDeviceGetUUID", "uuid")
    nvmlDeviceGetName = _reads("nvmlDeviceGetName", "name")

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        self._record("nvmlDeviceGetMigMode", handle)
        d = self._dev(handle)
        if not d.supports_mig_query:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return d.mig_mode, d.mig_mode

    nvmlDeviceGetArchitecture = _reads("nvmlDeviceGetArchitecture", "architecture")
    nvmlDeviceGetPersistenceMode = _reads("nvmlDeviceGetPersistenceMode", "persistence")

    # Clocks ---------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        self._record("nvmlDeviceGetSupportedMemoryClocks", handle)
        return list(self._dev(handle).memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_mhz: int) -> list[int]:
        self._record("nvmlDeviceGetSupportedGraphicsClocks", handle, memory_mhz)
        return list(self._dev(handle).graphics_clocks)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        self._record("nvmlDeviceSetGpuLockedClocks", handle, low_mhz, high_mhz)
        d = self._changing(handle)
        d.locked = (low_mhz, high_mhz)
        d.sm_clock_mhz = high_mhz

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._record("nvmlDeviceResetGpuLockedClocks", handle)
        self._changing(handle).locked = None

    def nvmlDeviceSetMemoryLockedClocks(self, handle: Any, low_mhz: int, high_mhz: int) -> None:
        self._record("nvmlDeviceSetMemoryLockedClocks", handle, low_mhz, high_mhz)
        d = self._changing(handle)
        if len(d.memory_clocks) < 2 or d.architecture < 7:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        d.mem_locked = (low_mhz, high_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        self._record("nvmlDeviceResetMemoryLockedClocks", handle)
        self._changing(handle).mem_locked = None

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        self._record("nvmlDeviceGetClockInfo", handle, clock_type)
        d = self._dev(handle)
        if clock_type == self.NVML_CLOCK_MEM:
            if d.busy and d.busy_memory_clock_mhz is not None:
                return d.busy_memory_clock_mhz
            return d.mem_locked[1] if d.mem_locked is not None else max(d.memory_clocks)
        return d.applied(self.clock.now())[0]

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        self._record("nvmlDeviceGetMaxClockInfo", handle, clock_type)
        d = self._dev(handle)
        return max(d.memory_clocks if clock_type == self.NVML_CLOCK_MEM else d.graphics_clocks)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._record("nvmlDeviceGetCurrentClocksEventReasons", handle)
        d = self._dev(handle)
        if not d.has_event_reasons_name:  # an older driver without the symbol
            raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        return d.applied(self.clock.now())[1]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        self._record("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return self._dev(handle).applied(self.clock.now())[1]

    def nvmlDeviceGetAPIRestriction(self, handle: Any, api: int) -> int:
        self._record("nvmlDeviceGetAPIRestriction", handle, api)
        return self._dev(handle).app_clocks_restricted

    # Sensors --------------------------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._record("nvmlDeviceGetTotalEnergyConsumption", handle)
        d = self._dev(handle)
        now_s = self.clock.now()
        if d.energy_fn is not None:
            value = int(d.energy_fn(now_s))
        else:
            d.advance_energy(now_s)
            value = d.energy_mj
        return value % d.energy_wrap_mj if d.energy_wrap_mj else value

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerUsage", handle)
        d = self._dev(handle)
        return self._drawn_mw(d, d.power_mw)

    def _drawn_mw(self, d: FakeDevice, idle_mw: int) -> int:
        """A power read: the power model's draw now, else ``idle_mw``."""
        return round(d.power_now_w(self.clock.now()) * 1000) if d.dynamic_power_w > 0 else idle_mw

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[Any]:
        self._record("nvmlDeviceGetFieldValues", handle, tuple(field_ids))
        d = self._dev(handle)
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

    # Power limit ----------------------------------------------------------------------------
    nvmlDeviceGetPowerManagementLimit = _reads(
        "nvmlDeviceGetPowerManagementLimit", "power_limit_mw"
    )
    nvmlDeviceGetPowerManagementDefaultLimit = _reads(
        "nvmlDeviceGetPowerManagementDefaultLimit", "default_power_limit_mw"
    )

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        self._record("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        d = self._dev(handle)
        return d.min_power_limit_mw, d.max_power_limit_mw

    nvmlDeviceGetEnforcedPowerLimit = _reads("nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw")

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        self._record("nvmlDeviceSetPowerManagementLimit", handle, limit_mw)
        self._changing(handle).power_limit_mw = limit_mw


#: The H100 80GB HBM3's load as measured: a d_model 4096 layer at the default clock ran at
#: 1485-1740 MHz with the SW power cap set at 700 W. The activities below put the cap-bound
#: clock at 1725, 1635, 1575, 1530 and 1485 MHz in turn (100 ms each).
_H100_ACTIVITY_CYCLE = (0.78, 0.9, 1.0, 1.1, 1.2)


def h100(
    uuid: str = "GPU-00000000-0000-0000-0000-000000000100",
    *,
    refuse_control: bool = False,
    clock: Clock | None = None,
    busy: bool = False,
) -> FakeNvml:
    """One NVIDIA H100 80GB HBM3 replaying the measured behaviour: SM clocks 1980-345 MHz in
    15 MHz steps, one HBM3 memory clock (2619 MHz, not lockable), a 700 W cap (200-700 W) that
    holds a heavy kernel at 1485-1740 MHz with ``sw_power_cap`` set whatever the lock asks,
    an energy counter published every 100 ms and read in ~3 ms, 70 W idle.

    Args:
        uuid: The GPU's UUID.
        refuse_control: Every set/reset call raises ``NO_PERMISSION`` (observe-only, as the
            GPU was measured).
        clock: The fake's clock (a :class:`~perseus.device.clock.VirtualClock` in tests).
        busy: Start with the heavy kernel running.
    """
    from perseus.device.presets import get_preset  # not at import: the watchdog loads this

    preset = get_preset("h100")  # the name, clock list, idle power and cap
    assert preset.power_cap_w is not None  # the h100 preset's 700 W
    idle_mw, cap_mw = round(preset.power.idle_w * 1000), round(preset.power_cap_w * 1000)
    device = FakeDevice(
        uuid,
        name=preset.name,
        architecture=FakeNvml.NVML_DEVICE_ARCH_HOPPER,
        memory_clocks=(2619,),
        graphics_clocks=preset.clocks_mhz,
        sm_clock_mhz=preset.clocks_mhz[0],
        power_mw=idle_mw,
        instant_power_mw=idle_mw,
        power_limit_mw=cap_mw,
        default_power_limit_mw=cap_mw,
        min_power_limit_mw=200_000,
        max_power_limit_mw=cap_mw,
        busy=busy,
        activity_cycle=_H100_ACTIVITY_CYCLE,
        static_power_w=100.0,
        dynamic_power_w=1160.0,
        energy_from_power=True,
        energy_publish_s=0.1,
    )
    return FakeNvml(
        devices=[device],
        refuse_control=refuse_control,
        latency_s={"nvmlDeviceGetTotalEnergyConsumption": 0.003},
        clock=clock if clock is not None else RealClock(),
    )
