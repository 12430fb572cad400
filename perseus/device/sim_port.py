"""What a simulated GPU's stream sees of its device: the :class:`StreamDevice` protocol, and
:class:`StreamPort`, the :class:`~perseus.device.simulated.SimulatedGPU`'s side of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from perseus.device.clock import Clock
from perseus.device.sim_costs import SimNoise
from perseus.device.sim_state import State
from perseus.schedule.actions import Kind

if TYPE_CHECKING:
    from perseus.device.simulated import SimulatedGPU

__all__ = ["StreamDevice", "StreamPort"]


class StreamDevice(Protocol):
    """What a :class:`SimStream` needs from its device, and nothing more.

    :class:`~perseus.device.simulated.SimulatedGPU` provides it through a small port object
    (its private state stays private); a test can provide it with a dozen lines.

    Attributes:
        index: The device index (seeds its noise).
        noise: Per-op noise, or None.
        clock: The device's timeline and how to wait on it.
        top_clock_mhz: The highest clock (an unlocked device runs at it).
        idle_power_w: The true power while no op runs.
        publish_interval_s: The energy counter's publish period (0: exact).
        counter_gain: The share of the true energy the counter reports.
        power_cap_w: The board's own power cap (None: none).
        price: ``(stage_index, kind, lock_mhz, cap_w) -> (clock_mhz, time_s, energy_j)`` of
            an op run wholly at a lock under a cap (before noise and slowdown).
        read_state: The shared state now.
        cap_w: The cap a state enforces (a set power limit, never above the board's).
        update_state: Apply a change to the shared state, advanced to ``at_s``.
    """

    index: int
    noise: SimNoise | None
    clock: Clock
    top_clock_mhz: int
    idle_power_w: float
    publish_interval_s: float
    counter_gain: float
    power_cap_w: float | None
    price: Callable[[int, Kind, int, float | None], tuple[int, float, float]]
    read_state: Callable[[], State]
    cap_w: Callable[[State], float | None]
    update_state: Callable[[Callable[[State], None], float | None], State]


class StreamPort:
    """The :class:`StreamDevice` view of a :class:`~perseus.device.simulated.SimulatedGPU`:
    the only members of the device its stream may use (bound once: the stream prices an op
    on every commit)."""

    __slots__ = (
        "cap_w",
        "clock",
        "counter_gain",
        "idle_power_w",
        "index",
        "noise",
        "power_cap_w",
        "price",
        "publish_interval_s",
        "read_state",
        "top_clock_mhz",
        "update_state",
    )

    def __init__(self, gpu: SimulatedGPU, clock: Clock) -> None:
        self.index = gpu.index
        self.noise = gpu.noise
        self.clock = clock
        self.top_clock_mhz = gpu.supported_clocks_mhz()[0]
        self.idle_power_w = gpu.true_blocking_power_w
        self.publish_interval_s = gpu.publish_interval_s
        self.counter_gain = gpu.counter_gain
        self.power_cap_w = gpu.power_cap_w
        self.price: Callable[[int, Kind, int, float | None], tuple[int, float, float]] = gpu._op_at
        self.read_state: Callable[[], State] = gpu._state
        self.cap_w: Callable[[State], float | None] = gpu._cap_w
        self.update_state: Callable[[Callable[[State], None], float | None], State] = gpu._update
