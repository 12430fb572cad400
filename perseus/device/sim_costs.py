"""How a simulated GPU prices an op: cost functions from a measured profile or a fitted preset.

A cost function maps ``(stage_index, kind, freq_mhz)`` to the op's uncapped ``(time_s,
energy_j)``; a memory cost function adds a locked memory clock.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from perseus.device.power_model import capped_clock_mhz, memory_clock_option
from perseus.device.presets import GPUPreset
from perseus.errors import ConfigError, ProfileError
from perseus.profile.model import OpOption, Profile
from perseus.schedule.actions import Kind

__all__ = [
    "MemCostFn",
    "OpCostFn",
    "OpPricer",
    "SimNoise",
    "preset_costs",
    "profile_costs",
    "split_backward",
]

#: ``(time_s, energy_j)`` of an op at an SM clock (uncapped, before slowdown).
OpCostFn = Callable[[int, Kind, int], tuple[float, float]]
#: ``(time_s, energy_j)`` of an op at an SM clock and a (locked, non-default) memory clock.
MemCostFn = Callable[[int, Kind, int, int], tuple[float, float]]


def profile_costs(
    profile: Profile,
) -> tuple[list[int], OpCostFn, tuple[int, ...], MemCostFn | None]:
    """The costs of :meth:`.SimulatedGPU.from_profile`, read off ``profile``.

    Returns:
        The SM clocks, the cost function, the memory clocks (highest first) and the memory
        cost function (None unless there are several memory clocks).
    """
    clocks = sorted({o.freq_mhz for op in profile.ops.values() for o in op.options})
    # An SM clock alone means the default (highest) memory clock: OpProfile.at, i.e. the
    # first option at that clock in the options' order (a later one, reversed, gives way).
    tables = {
        key: {o.freq_mhz: (o.time_s, o.energy_j) for o in reversed(op.options)}
        for key, op in profile.ops.items()
    }
    pairs = {
        key: {o.clocks: (o.time_s, o.energy_j) for o in op.options}
        for key, op in profile.ops.items()
    }
    mem_clocks = sorted(
        {o.mem_freq_mhz for op in profile.ops.values() for o in op.options if o.mem_freq_mhz},
        reverse=True,
    )

    def mem_cost(stage_index: int, kind: Kind, freq_mhz: int, mem_mhz: int) -> tuple[float, float]:
        table = pairs[(stage_index, kind)]
        near = min(table, key=lambda c: (abs(c[0] - freq_mhz), abs((c[1] or 0) - mem_mhz)))
        return table[near]

    def cost(stage_index: int, kind: Kind, freq_mhz: int) -> tuple[float, float]:
        table = tables.get((stage_index, kind))
        if table is None:
            raise ProfileError(
                f"{profile.source}: simulated GPU has no {kind.profile_name!r} rows for "
                f"stage {stage_index} (profile has {profile.num_stages} stages)"
            )
        hit = table.get(freq_mhz)
        if hit is None:
            hit = table[min(table, key=lambda f: (abs(f - freq_mhz), -f))]
        return hit

    return clocks, cost, tuple(mem_clocks), (mem_cost if len(mem_clocks) > 1 else None)


def preset_costs(
    preset: GPUPreset,
    *,
    activity: float | None = None,
    op_time_s: Mapping[Kind, float] | None = None,
) -> tuple[OpCostFn, MemCostFn | None]:
    """The costs of :meth:`.SimulatedGPU.from_preset`, from ``preset``'s models.

    Returns:
        The cost function and the memory cost function (None without a memory model).
    """
    u = preset.activity if activity is None else activity
    times = {**preset.op_time_s, **(op_time_s or {})}
    model_power, model_time = preset.power, preset.time

    def cost(stage_index: int, kind: Kind, freq_mhz: int) -> tuple[float, float]:
        t = times[kind] * model_time.factor(freq_mhz)
        return t, model_power.compute_power_w(freq_mhz, u) * t

    memory = preset.memory

    def mem_cost(stage_index: int, kind: Kind, freq_mhz: int, mem_mhz: int) -> tuple[float, float]:
        assert memory is not None  # only passed with a memory model
        t, e = cost(stage_index, kind, freq_mhz)
        x = memory_clock_option(OpOption(freq_mhz, t, e), times[kind], kind, memory, mem_mhz)
        return x.time_s, x.energy_j

    return cost, (None if memory is None else mem_cost)


def split_backward(cost: OpCostFn, b_share: float) -> OpCostFn:
    """``cost`` with each full backward split into ``B`` (``b_share``) and ``W`` (the rest)."""
    if not 0.0 < b_share < 1.0:
        raise ConfigError(f"backward split share must be in (0, 1), got {b_share}")

    def split(stage_index: int, kind: Kind, freq_mhz: int) -> tuple[float, float]:
        if kind is Kind.F:
            return cost(stage_index, kind, freq_mhz)
        t, e = cost(stage_index, Kind.B, freq_mhz)
        share = b_share if kind is Kind.B else 1.0 - b_share
        return t * share, e * share

    return split


@dataclass(frozen=True, slots=True)
class SimNoise:
    """Seeded noise a real GPU has and a plan does not know.

    Attributes:
        time_sigma: Lognormal sigma of every op's time factor (0.01: ~1 % jitter).
        power_sigma: Lognormal sigma of every op's power factor.
        blocking_error: Relative blocking-power error, uniform, drawn once per device.
        seed: Seed; each device (index) gets its own stream of draws.
        counter_gain: The share of the true energy the counter reports (0.95 on an A100).
    """

    time_sigma: float = 0.01
    power_sigma: float = 0.01
    blocking_error: float = 0.02
    seed: int = 0
    counter_gain: float = 1.0

    def __post_init__(self) -> None:
        if min(self.time_sigma, self.power_sigma, self.blocking_error) < 0:
            raise ConfigError("SimNoise: sigmas and blocking_error must be >= 0")
        if not self.counter_gain > 0:
            raise ConfigError(f"SimNoise: counter_gain must be > 0, got {self.counter_gain}")

    def rng(self, index: int) -> random.Random:
        """The per-op draw generator of device ``index``."""
        return random.Random(f"perseus-sim-noise/{self.seed}/{index}")

    def blocking_offset(self, index: int) -> float:
        """The relative blocking-power error of device ``index``."""
        err = self.blocking_error
        return random.Random(f"perseus-sim-blocking/{self.seed}/{index}").uniform(-err, err)


class OpPricer:
    """What an op costs run wholly at a lock under a power cap: the highest clock at or below
    the lock whose power fits, and its ``(time_s, energy_j)`` there (cached).

    Args:
        clocks_mhz: Supported SM clocks, highest first.
        cost_fn: Uncapped cost at the default memory clock.
        mem_clocks_mhz: Lockable memory clocks, highest (the default) first.
        mem_cost_fn: Cost at a locked memory clock (None: one memory clock).
    """

    __slots__ = ("_at_default_memory", "_clocks", "_cost_fn", "_mem_clocks", "_mem_cost_fn")

    def __init__(
        self,
        clocks_mhz: tuple[int, ...],
        cost_fn: OpCostFn,
        mem_clocks_mhz: tuple[int, ...],
        mem_cost_fn: MemCostFn | None,
    ) -> None:
        self._clocks = clocks_mhz
        self._cost_fn = cost_fn
        self._mem_clocks = mem_clocks_mhz
        self._mem_cost_fn = mem_cost_fn
        self._at_default_memory = functools.cache(self._capped)

    def price(
        self, stage_index: int, kind: Kind, freq_mhz: int, cap_w: float | None, mem_mhz: int | None
    ) -> tuple[int, float, float]:
        """``(clock_mhz, time_s, energy_j)`` of an op locked at ``freq_mhz`` under ``cap_w``
        with the memory clock locked at ``mem_mhz`` (None: the default)."""
        if mem_mhz is not None and self._mem_cost_fn is not None and mem_mhz != self._mem_clocks[0]:
            # The clock the cap allows at the default memory clock, at the locked one.
            f_eff = self._at_default_memory(stage_index, kind, freq_mhz, cap_w)[0]
            t, e = self._mem_cost_fn(stage_index, kind, f_eff, mem_mhz)
            return f_eff, t, e
        return self._at_default_memory(stage_index, kind, freq_mhz, cap_w)

    def _capped(
        self, stage_index: int, kind: Kind, freq_mhz: int, cap_w: float | None
    ) -> tuple[int, float, float]:
        """Uncached :meth:`price` at the default memory clock."""
        if cap_w is None:
            f_eff = freq_mhz
        else:
            below = [f for f in self._clocks if f <= freq_mhz] or [self._clocks[-1]]
            costs = {f: self._cost_fn(stage_index, kind, f) for f in below}
            power = {f: e / t for f, (t, e) in costs.items()}
            f_eff = capped_clock_mhz(below, freq_mhz, power, cap_w)
        t, e = self._cost_fn(stage_index, kind, f_eff)
        return f_eff, t, e
