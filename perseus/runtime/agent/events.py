"""Device events for the agent: the simulated device's own, or ``torch.cuda.Event`` on a GPU.

:func:`event_source_for` picks the source for a GPU object: a device that records events itself
(the simulator) is its own source; an NVML GPU uses CUDA events on the current stream of the
current CUDA device when torch with CUDA is importable; otherwise there is no device timeline
and the agent falls back to host timing. Every CUDA call is behind that check, so CPU-only
machines never touch CUDA.

A CUDA event's time comes from ``elapsed_time`` against a reference event recorded (and
synchronised once) when the source is created, mapped onto :func:`time.perf_counter`; reading
an event's time needs the event to have completed, never a device-wide synchronise.
"""

from __future__ import annotations

import time
from typing import Any

from perseus.device.base import DeviceEvent, EventSource

__all__ = ["CudaEvent", "CudaEventSource", "event_source_for"]


class CudaEvent:
    """A ``torch.cuda.Event`` (timing enabled) as a :class:`~perseus.device.base.DeviceEvent`."""

    __slots__ = ("_event", "_source", "energy_mj")

    def __init__(self, event: Any, source: CudaEventSource) -> None:
        self._event = event
        self._source = source
        self.energy_mj: int | None = None

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def device_time_s(self) -> float:
        self._event.synchronize()  # returns at once when already complete
        elapsed_ms = float(self._source.ref.elapsed_time(self._event))
        return self._source.ref_host_s + elapsed_ms / 1000.0


class CudaEventSource:
    """Records :class:`CudaEvent` on the current stream of CUDA device ``device_index``."""

    def __init__(self, device_index: int | None = None) -> None:
        import torch

        self._torch = torch
        index = torch.cuda.current_device() if device_index is None else device_index
        self.device = torch.device("cuda", index)
        self.ref = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.ref.record(torch.cuda.current_stream(self.device))
        self.ref.synchronize()  # once, at start: the anchor of the device timeline
        self.ref_host_s = time.perf_counter()

    def record_event(self) -> DeviceEvent:
        torch: Any = self._torch
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return CudaEvent(event, self)

    def timeline_now_s(self) -> float:
        return time.perf_counter()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def event_source_for(gpu: Any) -> EventSource | None:
    """The event source for ``gpu`` (None: no device timeline, time on the host)."""
    if gpu is None:
        return None
    if isinstance(gpu, EventSource):
        return gpu
    if type(gpu).__name__ == "NvmlGPU" and _cuda_available():
        return CudaEventSource()
    return None
