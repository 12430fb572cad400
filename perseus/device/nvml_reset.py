"""The NVML backend's reset, runnable from any process: clocks, memory clocks and power limit.

What :func:`reset_device` restores is everything perseus may change on an NVIDIA GPU: the
locked SM clocks, the locked memory clocks (a GDDR board whose spec says so) and the power
limit, set to NVML's *default* limit (never the limit found at open: a rank may have lowered it
before perseus opened the GPU). The spec is the ``watchdog_spec()`` of a GPU its owner opened.

Standard library only (``pynvml`` imported when called), so the watchdog loads this file by
path through :mod:`perseus.device.ownership` without paying for ``import perseus``.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

__all__ = ["load_nvml", "reset_device"]


def load_nvml(module_path: str | None) -> Any:
    """``pynvml``; or the NVML module file an owner was given instead (a test's fake shared
    across processes, named by the owner in the spec it hands its own watchdog)."""
    if not module_path:
        import pynvml

        return pynvml
    spec = importlib.util.spec_from_file_location("_perseus_nvml_module", module_path)
    if spec is None or spec.loader is None:
        raise ImportError(module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reset_device(spec: dict[str, Any]) -> dict[str, Any]:
    """Reset the GPU ``spec["uuid"]`` (``nvmlDeviceResetGpuLockedClocks``,
    ``nvmlDeviceResetMemoryLockedClocks`` when ``spec["memory_clocks"]``, and the power limit
    to ``nvmlDeviceGetPowerManagementDefaultLimit`` when it differs).

    Returns:
        What was restored: ``{"power_limit_w": (before, after)}`` when the limit changed.

    Raises:
        Exception: whatever NVML raised (callers log it).
    """
    nvml = load_nvml(spec.get("nvml_module_path"))
    restored: dict[str, Any] = {}
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(spec["uuid"])
        nvml.nvmlDeviceResetGpuLockedClocks(handle)
        if spec.get("memory_clocks"):  # a GDDR board whose memory clock may be locked
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlDeviceResetMemoryLockedClocks(handle)
        default_mw = int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
        current_mw = int(nvml.nvmlDeviceGetPowerManagementLimit(handle))
        if current_mw != default_mw:
            nvml.nvmlDeviceSetPowerManagementLimit(handle, default_mw)
            restored["power_limit_w"] = (current_mw / 1000.0, default_mw / 1000.0)
    finally:
        nvml.nvmlShutdown()
    return restored
