"""Device events for the agent: the simulated device's own, or ``torch.cuda.Event`` on a GPU.

A CUDA event's time is ``elapsed_time`` against a reference event recorded (and synchronised
once) when the source is created, mapped onto the real clock
(:data:`~perseus.device.clock.REAL_CLOCK`). CUDA events are pooled
(:meth:`CudaEventSource.recycle`) and the current stream is looked up again only when the raw
stream changed, so an op launched on another stream is timed on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perseus.device.base import GPU, DeviceEvent, EventSource
from perseus.device.clock import REAL_CLOCK
from perseus.device.nvml import NvmlGPU

__all__ = ["CudaEvent", "CudaEventSource", "event_source_for"]


@dataclass(slots=True, eq=False)
class CudaEvent:
    """A ``torch.cuda.Event`` (timing enabled) as a :class:`~perseus.device.base.DeviceEvent`."""

    _event: Any
    _source: CudaEventSource
    _time_s: float | None = None
    energy_mj: int | None = None

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def device_time_s(self) -> float:
        """Read once (by the worker), then kept: no CUDA call on the training thread."""
        time_s = self._time_s
        if time_s is None:
            self._event.synchronize()  # returns at once when already complete
            elapsed_ms = float(self._source.ref.elapsed_time(self._event))
            time_s = self._time_s = self._source.ref_host_s + elapsed_ms / 1000.0
        return time_s


class CudaEventSource:
    """Records :class:`CudaEvent` on the current stream of CUDA device ``device_index``."""

    def __init__(self, device_index: int | None = None) -> None:
        import torch

        index = torch.cuda.current_device() if device_index is None else device_index
        self.device = torch.device("cuda", index)
        self._index = index  # current_stream(int) skips parsing a device (~10 us a record)
        self._current_stream: Any = torch.cuda.current_stream
        self._raw_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream_key: int | None = None
        self._stream: Any = None
        self._event_type: Any = torch.cuda.Event
        # The C method itself where the event type is torch's (its wrapper adds nothing here).
        base = getattr(torch._C, "_CudaEventBase", None)
        direct = isinstance(base, type) and issubclass(self._event_type, base)
        self._record: Any = base.record if direct else self._event_type.record  # type: ignore[union-attr]
        self.ref = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.ref.record(torch.cuda.current_stream(self.device))
        self.ref.synchronize()  # once, at start: the anchor of the device timeline
        self.ref_host_s = REAL_CLOCK.now()
        self._free: list[CudaEvent] = []  # events nobody reads any more
        self._recorded: list[CudaEvent] = []  # recorded in this iteration
        self._retiring: list[CudaEvent] = []  # recorded in the previous one

    def record_event(self) -> DeviceEvent:
        free = self._free
        if free:  # a pooled event, its wrapper with it
            event = free.pop()
            event._time_s = event.energy_mj = None
        else:
            event = CudaEvent(self._event_type(enable_timing=True), self)
        raw = self._raw_stream
        if raw is None:
            self._record(event._event, self._current_stream(self._index))
        else:
            key = raw(self._index)
            if key != self._stream_key:
                self._stream, self._stream_key = self._current_stream(self._index), key
            self._record(event._event, self._stream)
        self._recorded.append(event)
        return event

    def recycle(self) -> None:
        """An iteration ended: the events recorded in the one before it are free again (one
        iteration of grace: the last op's end is read when the next iteration ends)."""
        self._free.extend(self._retiring)
        self._retiring, self._recorded = self._recorded, []

    def timeline_now_s(self) -> float:
        return REAL_CLOCK.now()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def event_source_for(gpu: GPU) -> EventSource | None:
    """The event source for ``gpu`` (None: no device timeline, time on the host)."""
    if isinstance(gpu, EventSource):
        return gpu
    if isinstance(gpu, NvmlGPU) and _cuda_available():
        return CudaEventSource()
    return None
