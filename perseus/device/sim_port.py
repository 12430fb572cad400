"""What a simulated GPU's stream sees of its device: :class:`StreamDevice`, and nothing more."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.device.clock import Clock
from perseus.device.sim_costs import SimNoise
from perseus.device.sim_state import State
from perseus.schedule.actions import Kind

if TYPE_CHECKING:
    from perseus.device.simulated import SimulatedGPU

__all__ = ["StreamDevice"]


@dataclass(frozen=True, slots=True)
class StreamDevice:
    """What a :class:`SimStream` needs from its device, and nothing more.

    :meth:`of` builds it from a :class:`~perseus.device.simulated.SimulatedGPU` (whose private
    state stays private; the members are bound once: the stream prices an op on every commit);
    a test can build one from a dozen values.

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

    @classmethod
    def of(cls, gpu: SimulatedGPU, clock: Clock) -> StreamDevice:
        """The view of ``gpu`` its stream uses."""
        return cls(
            gpu.index,
            gpu.noise,
            clock,
            gpu.supported_clocks_mhz()[0],
            gpu.true_blocking_power_w,
            gpu.publish_interval_s,
            gpu.counter_gain,
            gpu.power_cap_w,
            gpu._op_at,
            gpu._state,
            gpu._cap_w,
            gpu._update,
        )
