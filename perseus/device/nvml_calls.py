"""The NVML calls every backend piece shares: the process-wide ``nvmlInit`` count, the
privilege probe, clock event reasons, the observe-only view of ``pynvml``, and
:func:`call_nvml`, the one place where ``NVMLError`` codes become perseus errors
(docs/hardware.md#nvml).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from typing import Any

from perseus.device.clock import clock_of, retry
from perseus.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotSupportedError,
    DevicePermissionError,
)

__all__ = [
    "CLOCK_EVENT_BITS",
    "CLOCK_EVENT_REASONS",
    "LIMITING_REASONS",
    "NO_CLOCK_CHANGES_ENV",
    "NvmlConstants",
    "NvmlUnavailableError",
    "ObserveOnlyNvml",
    "call_nvml",
    "clock_event_names",
    "import_nvml",
    "is_control_function",
    "no_clock_changes_requested",
    "nvml_init",
    "nvml_shutdown",
    "probe_privilege",
]


class NvmlConstants:
    """The ``pynvml`` constants perseus uses, with nvidia-ml-py's values (checked by a test),
    for the backend and the fake NVML."""

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
    NVML_DEVICE_ARCH_AMPERE = 7  # nvmlDeviceSetMemoryLockedClocks: Ampere and newer
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_POWER_SCOPE_GPU = 0
    NVML_POWER_SCOPE_MODULE = 1


_C = NvmlConstants
_CAP_SYS_ADMIN = 21
_TRANSIENT = frozenset({_C.NVML_ERROR_TIMEOUT})
_TRANSIENT_RETRIES = 2
_BACKOFF_S = (0.01, 0.05)

#: Environment variable that makes every :class:`NvmlGPU` observe-only (``control=False``).
NO_CLOCK_CHANGES_ENV = "PERSEUS_NO_CLOCK_CHANGES"

#: NVML clock event (throttle) reason bits and their names.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
#: The bit of each clock event reason, by name.
CLOCK_EVENT_BITS = {name: bit for bit, name in CLOCK_EVENT_REASONS}
#: Reasons that pull a clock below the requested lock (power or thermal limits).
LIMITING_REASONS = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)
# Prefixes of NVML functions that change device state; observe-only GPUs never call them.
_CONTROL_PREFIXES = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear", "nvmlDeviceModify")


class NvmlUnavailableError(DeviceError):
    """No usable NVML: nvidia-ml-py missing, or no NVIDIA driver/library on this machine."""


_LOST = (DeviceLostError, "; the GPU stopped answering")
_NO_DRIVER = (NvmlUnavailableError, "; no usable NVIDIA driver")
#: The perseus error (and hint) of each NVML error code; any other code is a DeviceError.
_ERRORS: dict[int, tuple[type[DeviceError], str]] = {
    _C.NVML_ERROR_NO_PERMISSION: (
        DevicePermissionError,
        "; changing clocks needs root or CAP_SYS_ADMIN",
    ),
    _C.NVML_ERROR_NOT_SUPPORTED: (DeviceNotSupportedError, ""),
    _C.NVML_ERROR_GPU_IS_LOST: _LOST,
    _C.NVML_ERROR_UNKNOWN: _LOST,
    _C.NVML_ERROR_LIBRARY_NOT_FOUND: _NO_DRIVER,
    _C.NVML_ERROR_DRIVER_NOT_LOADED: _NO_DRIVER,
    _C.NVML_ERROR_FUNCTION_NOT_FOUND: _NO_DRIVER,
}


def import_nvml() -> Any:
    """``pynvml`` (from nvidia-ml-py), or :class:`NvmlUnavailableError` with the install hint."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        hint = "nvidia-ml-py is not installed; pip install 'perseus-energy[nvml]'"
        raise NvmlUnavailableError(hint) from e


def call_nvml(
    nvml: Any, function: str, *args: Any, what: str = "", retries: int = _TRANSIENT_RETRIES
) -> Any:
    """Call ``nvml.<function>(*args)``, mapping ``NVMLError`` to the perseus error tree
    (``what``, e.g. the GPU's name, prefixes the message).

    A ``TIMEOUT`` is retried ``retries`` times (10 ms, then 50 ms back-off, slept on the
    library's clock: a fake's, else real time), then raised as :class:`DeviceError`.
    """
    tries = 0

    def once() -> Any:
        nonlocal tries
        tries += 1
        return getattr(nvml, function)(*args)

    def transient(e: Exception) -> bool:
        return isinstance(e, nvml.NVMLError) and getattr(e, "value", None) in _TRANSIENT

    waits_s = [_BACKOFF_S[min(i, len(_BACKOFF_S) - 1)] for i in range(retries)]
    try:
        return retry(once, transient=transient, backoff_s=waits_s, clock=clock_of(nvml))
    except nvml.NVMLError as e:
        code: Any = getattr(e, "value", None)
        error, hint = _ERRORS.get(code, (DeviceError, ""))
        where = f"{what}: " if what else ""
        after = f" (after {tries} tries)" if tries > 1 else ""
        raise error(f"{where}{function} failed: {e} (NVML error {code}){after}{hint}") from e


def probe_privilege(status_path: str = "/proc/self/status") -> tuple[bool, str]:
    """Can this process lock clocks? ``(ok, why)``: root, or CAP_SYS_ADMIN in CapEff."""
    if os.geteuid() == 0:
        return True, "running as root"
    with contextlib.suppress(OSError, ValueError), open(status_path, encoding="ascii") as f:
        for line in f:
            if line.startswith("CapEff:"):
                if int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1:
                    return True, "CAP_SYS_ADMIN"
                break
    hint = (
        " (a zeusd socket is set, but perseus does not use zeusd)"
        if os.environ.get("ZEUSD_SOCK_PATH")
        else ""
    )
    return False, f"not root and no CAP_SYS_ADMIN{hint}"


def clock_event_names(mask: int) -> tuple[str, ...]:
    """The names of the clock event (throttle) reason bits set in ``mask``."""
    return tuple(name for bit, name in CLOCK_EVENT_REASONS if mask & bit)


def is_control_function(function: str) -> bool:
    """Whether NVML ``function`` changes device state (clocks, power limit, modes...)."""
    return function.startswith(_CONTROL_PREFIXES)


def no_clock_changes_requested() -> bool:
    """Whether ``$PERSEUS_NO_CLOCK_CHANGES`` asks for observe-only GPUs (``1``, ``true``,
    ``yes`` or ``on``, in any case)."""
    return os.environ.get(NO_CLOCK_CHANGES_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class ObserveOnlyNvml:
    """``pynvml`` without the functions that change a device: they raise before any call
    (what an observe-only NvmlGPU talks to)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def __getattr__(self, name: str) -> Any:
        if is_control_function(name):
            raise DevicePermissionError(
                f"{name} refused: this GPU was opened observe-only (`control`=False, or "
                f"{NO_CLOCK_CHANGES_ENV}=1 in the environment)"
            )
        return getattr(self._nvml, name)


# nvmlInit/nvmlShutdown are process-wide; count users per module object.
_sessions: dict[int, int] = {}
_sessions_lock = threading.Lock()


def nvml_init(nvml: Any) -> None:
    with _sessions_lock:
        if _sessions.get(id(nvml), 0) == 0:
            call_nvml(nvml, "nvmlInit")
        _sessions[id(nvml)] = _sessions.get(id(nvml), 0) + 1


def nvml_shutdown(nvml: Any) -> None:
    with _sessions_lock:
        left = _sessions.get(id(nvml), 0) - 1
        if left > 0:
            _sessions[id(nvml)] = left
            return
        _sessions.pop(id(nvml), None)
    call_nvml(nvml, "nvmlShutdown")
