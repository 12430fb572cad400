"""The NVML backend (nvidia-ml-py, import name ``pynvml``), following docs/hardware.md#nvml.

``pynvml`` is imported lazily and can be injected (``nvml_module=``, e.g. a ``FakeNvml``);
every call goes through :func:`~perseus.device.nvml_calls.call_nvml`. An observe-only GPU
(``control=False`` or ``PERSEUS_NO_CLOCK_CHANGES=1``) talks to a view of ``pynvml`` that
refuses every function changing the device before it reaches the driver.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from perseus.device.base import nearest_clock_mhz
from perseus.device.nvml_calls import (
    NO_CLOCK_CHANGES_ENV,
    NvmlConstants,
    NvmlUnavailableError,
    ObserveOnlyNvml,
    call_nvml,
    import_nvml,
    no_clock_changes_requested,
    nvml_init,
    nvml_shutdown,
    probe_privilege,
)
from perseus.device.ownership import default_lock_dir, owner_lock_path
from perseus.errors import DeviceError, DeviceNotSupportedError, DevicePermissionError
from perseus.identity import GpuIdentity, architecture_name

__all__ = [
    "NO_CLOCK_CHANGES_ENV",
    "NvmlGPU",
    "NvmlUnavailableError",
    "call_nvml",
    "import_nvml",
    "list_nvml_gpus",
    "no_clock_changes_requested",
    "probe_privilege",
]

_C = NvmlConstants
# HBM boards, whose memory clock cannot be locked at run time even when several are listed.
_HBM_NAME = re.compile(r"HBM|\b(?:[VPA]100|A800|A30|H100|H800|H200|H20|GH200|B100|G?B[23]00)\b")
# nvmlValueType_t -> the union member of c_nvmlValue_t holding it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGPU:
    """One physical NVIDIA GPU through NVML, identified by UUID.

    The constructor does no I/O; :meth:`open` (or the first method call, or ``with``) runs the
    start-up checklist.

    Args:
        uuid: The GPU's UUID (``GPU-…``).
        index: NVML index (PCI order), used only when ``uuid`` is None.
        nvml_module: ``pynvml`` or a fake; imported lazily when None.
        allow_mig: Accept a GPU in MIG mode (clock locks then affect every instance).
        privileged: Skip the privilege probe and assume this answer (tests).
        lock_dir: Where the ownership lock files live (default ``$PERSEUS_LOCK_DIR``, else
            ``/run/perseus/locks`` as root or a per-user directory: docs/safety.md).
        control: False opens the GPU observe-only: no NVML function that changes the device
            is ever called. None (default) reads ``$PERSEUS_NO_CLOCK_CHANGES``.
    """

    def __init__(
        self,
        uuid: str | None = None,
        *,
        index: int | None = None,
        nvml_module: Any = None,
        allow_mig: bool = False,
        privileged: bool | None = None,
        lock_dir: str | Path | None = None,
        control: bool | None = None,
    ) -> None:
        if uuid is None and index is None:
            raise ValueError("give the GPU's uuid (preferred) or its NVML index")
        self._uuid = uuid
        self._index = index
        self._nvml = nvml_module
        self._allow_mig = allow_mig
        self._privileged_override = privileged
        self._lock_dir = Path(lock_dir) if lock_dir is not None else None
        self.control = (not no_clock_changes_requested()) if control is None else control
        self._api: Any = None
        self._handle: Any = None
        self._instant_power = True
        self._name = ""
        self._clocks: tuple[int, ...] = ()
        self._locked: int | None = None
        self._mem_clocks: tuple[int, ...] = ()
        self._mem_locked: int | None = None
        self._arch = 0
        self.observe_only_reason: str | None = None
        self.persistence_mode: bool | None = None

    @classmethod
    def for_cuda_device(cls, cuda_index: int, **kwargs: Any) -> NvmlGPU:
        """The GPU CUDA calls ``cuda_index``, honouring ``CUDA_VISIBLE_DEVICES`` (integer
        entries match NVML indices only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if cuda_index >= len(entries):
                raise DeviceError(
                    f"CUDA device {cuda_index} is not visible (CUDA_VISIBLE_DEVICES={visible})"
                )
            entry = entries[cuda_index]
            if entry.startswith(("GPU-", "MIG-")):
                return cls(entry, **kwargs)
            return cls(index=int(entry), **kwargs)
        return cls(index=cuda_index, **kwargs)

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def open(self) -> NvmlGPU:
        """Run the start-up checklist (idempotent): handle, MIG, architecture, privilege,
        clock lists, persistence mode.

        Raises:
            NvmlUnavailableError: no library/driver.
            DeviceNotSupportedError: MIG mode without ``allow_mig``.
            DeviceError: the UUID/index does not exist, or another NVML failure.
        """
        if self._handle is not None:
            return self
        if self._nvml is None:
            self._nvml = import_nvml()
        nvml = self._nvml
        self._api = nvml if self.control else ObserveOnlyNvml(nvml)
        nvml_init(nvml)
        try:
            self._open_device(self._api)
        except BaseException:
            nvml_shutdown(nvml)
            raise
        return self

    def _open_device(self, nvml: Any) -> None:
        if self._uuid is not None:
            handle = call_nvml(nvml, "nvmlDeviceGetHandleByUUID", self._uuid, what=self._uuid)
        else:
            handle = call_nvml(nvml, "nvmlDeviceGetHandleByIndex", self._index)
            self._uuid = _text(call_nvml(nvml, "nvmlDeviceGetUUID", handle))
        self._name = _text(call_nvml(nvml, "nvmlDeviceGetName", handle, what=self._uuid or ""))
        what = self._what()
        try:
            current_mig, _pending = call_nvml(nvml, "nvmlDeviceGetMigMode", handle, what=what)
        except DeviceNotSupportedError:
            current_mig = 0
        if current_mig == _C.NVML_DEVICE_MIG_ENABLE and not self._allow_mig:
            raise DeviceNotSupportedError(
                f"{what} is in MIG mode; a clock lock would change every MIG instance. Pass "
                "allow_mig=True if this job owns the whole GPU"
            )
        self._arch = int(call_nvml(nvml, "nvmlDeviceGetArchitecture", handle, what=what))
        self._read_clocks(nvml, handle, what)
        if not self._clocks:
            raise DeviceNotSupportedError(f"{what}: NVML reports no supported SM clocks")
        reason: str | None
        if not self.control:  # the caller's word comes before any other reason
            reason = f"clock changes disabled (control=False or {NO_CLOCK_CHANGES_ENV}=1)"
        elif self._arch < _C.NVML_DEVICE_ARCH_VOLTA:
            reason = f"architecture {self._arch} is older than Volta"
        elif self._privileged_override is None:
            ok, why = probe_privilege()
            reason = None if ok else why
        else:
            reason = None if self._privileged_override else "marked unprivileged by the caller"
        self.observe_only_reason = reason
        try:
            self.persistence_mode = bool(
                call_nvml(nvml, "nvmlDeviceGetPersistenceMode", handle, what=what)
            )
        except DeviceNotSupportedError:
            self.persistence_mode = None
        self._handle = handle

    def close(self) -> None:
        """Reset the clock locks and power limit this object set, then release NVML
        (idempotent)."""
        if self._handle is None:
            return
        try:
            try:
                if self._locked is not None or self._mem_locked is not None:
                    self.reset_locked_clock()
            finally:  # a failed clock reset still leaves no limit behind
                if self._power_limit_set is not None:  # a recurring job's limit
                    self.reset_power_limit()
        finally:
            self._handle = None
            nvml_shutdown(self._nvml)

    def __enter__(self) -> NvmlGPU:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _h(self) -> Any:
        if self._handle is None:
            self.open()
        return self._handle

    def _what(self) -> str:
        return f"{self._name} ({self._uuid})"

    @property
    def uuid(self) -> str:
        if self._uuid is None:
            self.open()
        assert self._uuid is not None  # set by open()
        return self._uuid

    @property
    def name(self) -> str:
        self._h()
        return self._name

    def supported_clocks_mhz(self) -> tuple[int, ...]:
        self._h()
        return self._clocks

    def identity(self) -> GpuIdentity:
        """Which GPU this is, as profiles and plans record it."""
        self._h()
        return GpuIdentity(
            name=self._name,
            architecture=architecture_name(self._arch),
            clocks_mhz=self._clocks,
            default_power_limit_w=self.query_w("nvmlDeviceGetPowerManagementDefaultLimit") or None,
        )

    def snap_clock_mhz(self, freq_mhz: int) -> int:
        """The supported clock nearest ``freq_mhz`` (ties go to the higher clock)."""
        return nearest_clock_mhz(tuple(reversed(self.supported_clocks_mhz())), freq_mhz)

    def _require_control(self, action: str) -> None:
        self._h()  # open first: opening decides observe_only_reason
        if self.observe_only_reason is not None:
            raise DevicePermissionError(
                f"{self._what()}: cannot {action}: {self.observe_only_reason}"
            )

    def set_locked_clock(self, freq_mhz: int) -> int:
        """Lock the SM clock (min = max = the snapped clock); on INVALID_ARGUMENT or
        FREQ_NOT_SUPPORTED, re-read the clock list, re-snap and retry once."""
        handle = self._h()
        self._require_control("lock clocks")
        snapped = self.snap_clock_mhz(freq_mhz)
        try:
            self.query("nvmlDeviceSetGpuLockedClocks", snapped, snapped)
        except DeviceError as e:
            if getattr(e.__cause__, "value", None) not in (
                _C.NVML_ERROR_INVALID_ARGUMENT,
                _C.NVML_ERROR_FREQ_NOT_SUPPORTED,
            ):
                raise
            self._read_clocks(self._api, handle)
            retry = self.snap_clock_mhz(freq_mhz)
            try:
                self.query("nvmlDeviceSetGpuLockedClocks", retry, retry)
            except DeviceError as again:
                raise DeviceError(
                    f"{self._what()}: the driver refused {freq_mhz} MHz (snapped to {snapped}, "
                    f"then {retry} MHz); giving up on this clock"
                ) from again
            snapped = retry
        self._locked = snapped
        return snapped

    def _read_clocks(self, nvml: Any, handle: Any, what: str = "") -> None:
        """Read the memory clocks, then the SM clocks at the highest memory clock."""
        mem_clocks = call_nvml(nvml, "nvmlDeviceGetSupportedMemoryClocks", handle, what=what)
        self._mem_clocks = tuple(sorted({int(c) for c in mem_clocks}, reverse=True))
        mem = self._mem_clocks[0]
        clocks = call_nvml(nvml, "nvmlDeviceGetSupportedGraphicsClocks", handle, mem, what=what)
        self._clocks = tuple(sorted({int(c) for c in clocks}, reverse=True))

    def reset_locked_clock(self) -> None:
        """Reset the SM clock lock and, when this object locked it, the memory clock lock."""
        self._require_control("reset clocks")
        try:
            self.query("nvmlDeviceResetGpuLockedClocks")
            self._locked = None
        finally:
            if self._mem_locked is not None:
                self.reset_memory_locked_clock()

    def supported_memory_clocks_mhz(self) -> tuple[int, ...]:
        """The memory clocks NVML reports, highest first; one entry on HBM boards."""
        self._h()
        return self._mem_clocks

    def memory_clock_control(self) -> str | None:
        """Why the memory clock cannot be locked here (observe-only, older than Ampere, one
        memory clock, HBM), or None when it can."""
        self._h()
        if self.observe_only_reason is not None:
            return self.observe_only_reason
        if self._arch < _C.NVML_DEVICE_ARCH_AMPERE:
            return f"architecture {self._arch} is older than Ampere (memory locks need Ampere+)"
        if len(self._mem_clocks) < 2:
            return f"one memory clock only ({', '.join(map(str, self._mem_clocks))} MHz: HBM)"
        if _HBM_NAME.search(self._name):
            return f"{self._name} has HBM, whose memory clock cannot be locked at run time"
        return None

    def set_memory_locked_clock(self, mem_freq_mhz: int) -> int:
        """Lock the memory clock (min = max = the nearest supported memory clock).

        Raises:
            DevicePermissionError: observe-only or unprivileged.
            DeviceNotSupportedError: the GPU cannot lock its memory clock.
        """
        self._require_control("lock memory clocks")
        why = self.memory_clock_control()
        if why is not None:
            raise DeviceNotSupportedError(f"{self._what()}: cannot lock memory clocks: {why}")
        snapped = nearest_clock_mhz(tuple(reversed(self._mem_clocks)), mem_freq_mhz)
        self.query("nvmlDeviceSetMemoryLockedClocks", snapped, snapped)
        self._mem_locked = snapped
        return snapped

    def reset_memory_locked_clock(self) -> None:
        """Reset the memory clock lock."""
        self._require_control("reset memory clocks")
        self.query("nvmlDeviceResetMemoryLockedClocks")
        self._mem_locked = None

    def locked_memory_clock_mhz(self) -> int | None:
        """The memory lock this process set."""
        return self._mem_locked

    def locked_clock_mhz(self) -> int | None:
        """The lock this process set (NVML cannot read back another process's lock)."""
        return self._locked

    def current_clock_mhz(self) -> int:
        return int(self.query("nvmlDeviceGetClockInfo", _C.NVML_CLOCK_SM))

    def current_memory_clock_mhz(self) -> int:
        return int(self.query("nvmlDeviceGetClockInfo", _C.NVML_CLOCK_MEM))

    def energy_mj(self) -> int:
        return int(self.query("nvmlDeviceGetTotalEnergyConsumption"))

    def power_w(self) -> float:
        """Instant power (``NVML_FI_DEV_POWER_INSTANT``, GPU then module scope), else
        ``nvmlDeviceGetPowerUsage`` (a 1 s average on H100)."""
        handle = self._h()
        if self._instant_power:
            for scope in (_C.NVML_POWER_SCOPE_GPU, _C.NVML_POWER_SCOPE_MODULE):
                milliwatts = self._field_value(handle, _C.NVML_FI_DEV_POWER_INSTANT, scope)
                if milliwatts is not None and milliwatts > 0:
                    return milliwatts / 1000.0
            self._instant_power = False  # not on this GPU/driver: stop asking
        return float(self.query("nvmlDeviceGetPowerUsage")) / 1000.0

    def _field_value(self, handle: Any, field_id: int, scope: int) -> float | None:
        try:
            value = call_nvml(
                self._api, "nvmlDeviceGetFieldValues", handle, [(field_id, scope)], retries=0
            )[0]
            if int(getattr(value, "nvmlReturn", 0)) != 0:
                return None
            member = _VALUE_MEMBERS.get(int(getattr(value, "valueType", 1)), "uiVal")
            return float(getattr(value.value, member))
        except (DeviceError, AttributeError, IndexError, TypeError, ValueError):
            return None

    def query(self, function: str, *args: Any) -> Any:
        """``nvml.<function>(handle, *args)`` on this GPU, errors mapped by :func:`call_nvml`
        (an observe-only GPU refuses any function that would change the device)."""
        handle = self._h()
        return call_nvml(self._api, function, handle, *args, what=self._what())

    def query_w(self, function: str) -> float | None:
        """A power figure NVML gives in milliwatts, in watts; None when NVML does not say."""
        with contextlib.suppress(DeviceError, AttributeError):
            return int(self.query(function)) / 1000.0
        return None

    def clock_event_reasons(self) -> int:
        """Why the clocks are below their maximum now: a bit mask of NVML's clock event
        reasons (or the older ``...ThrottleReasons`` name).

        Raises:
            DeviceNotSupportedError: the GPU reports neither.
        """
        handle = self._h()
        for function in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if not hasattr(self._api, function):
                continue
            try:
                return int(call_nvml(self._api, function, handle, what=self._what()))
            except NvmlUnavailableError:
                continue  # FUNCTION_NOT_FOUND in an older driver: try the older name
        raise DeviceNotSupportedError(f"{self._what()}: no clock event reasons in this NVML")

    #: The power limit this object set (None: untouched), reset by :meth:`close`.
    _power_limit_set: float | None = None

    def power_limit_range_w(self) -> tuple[float, float]:
        low_mw, high_mw = self.query("nvmlDeviceGetPowerManagementLimitConstraints")
        return float(low_mw) / 1000.0, float(high_mw) / 1000.0

    def power_limit_w(self) -> float:
        return float(self.query("nvmlDeviceGetEnforcedPowerLimit")) / 1000.0

    def set_power_limit_w(self, power_limit_w: float) -> float:
        """Set the board power limit; returns the value applied (rounded to 1 mW).

        Raises:
            DevicePermissionError: observe-only or NO_PERMISSION.
            DeviceError: outside :meth:`power_limit_range_w`.
        """
        self._require_control("set the power limit")
        low, high = self.power_limit_range_w()
        if not low <= power_limit_w <= high:
            raise DeviceError(
                f"{self._what()}: power limit {power_limit_w} W is outside {low:g}-{high:g} W"
            )
        milliwatts = round(power_limit_w * 1000.0)
        self.query("nvmlDeviceSetPowerManagementLimit", milliwatts)
        self._power_limit_set = milliwatts / 1000.0
        return self._power_limit_set

    def reset_power_limit(self) -> None:
        """Restore NVML's default power limit."""
        self._require_control("reset the power limit")
        default_mw = self.query("nvmlDeviceGetPowerManagementDefaultLimit")
        self.query("nvmlDeviceSetPowerManagementLimit", default_mw)
        self._power_limit_set = None

    def owner_lock_path(self) -> Path:
        """Ownership lock file keyed by UUID in the verified lock directory.

        Raises:
            ConfigError: the directory is a link, another user's, or writable by others.
        """
        lock_dir = self._lock_dir if self._lock_dir is not None else default_lock_dir()
        return owner_lock_path(lock_dir, self.uuid)

    def watchdog_spec(self) -> dict[str, Any]:
        """What the watchdog needs to reset this GPU."""
        spec: dict[str, Any] = {"backend": "nvml", "uuid": self.uuid}
        if self.is_open and self.memory_clock_control() is None:
            spec["memory_clocks"] = True
        return spec

    def __repr__(self) -> str:
        return f"NvmlGPU(uuid={self._uuid!r}, index={self._index!r})"


def list_nvml_gpus(nvml_module: Any = None) -> list[NvmlGPU]:
    """Every GPU NVML sees, opened (close them when done).

    Raises:
        NvmlUnavailableError: when there is no library or driver.
    """
    nvml = nvml_module if nvml_module is not None else import_nvml()
    nvml_init(nvml)
    try:
        count = call_nvml(nvml, "nvmlDeviceGetCount")
        with contextlib.ExitStack() as opened:  # one failing: close those opened before it
            gpus = [opened.enter_context(NvmlGPU(index=i, nvml_module=nvml)) for i in range(count)]
            opened.pop_all()
        return gpus
    finally:
        nvml_shutdown(nvml)
