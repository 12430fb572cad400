"""How a simulated GPU prices an op: cost functions from a measured profile or a fitted preset.

A cost function maps ``(stage_index, kind, freq_mhz)`` to the op's ``(time_s, energy_j)`` at
that SM clock (uncapped, before slowdown); a memory cost function adds a locked, non-default
memory clock. :class:`~perseus.device.simulated.SimulatedGPU` takes them; its constructors
``from_profile`` and ``from_preset`` build them here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from perseus.device.power_model import memory_clock_option
from perseus.device.presets import GPUPreset
from perseus.errors import ConfigError, ProfileError
from perseus.profile.model import OpOption, Profile
from perseus.schedule.actions import Kind

__all__ = ["MemCostFn", "OpCostFn", "preset_costs", "profile_costs", "split_backward"]

#: ``(time_s, energy_j)`` of an op at an SM clock (uncapped, before slowdown).
OpCostFn = Callable[[int, Kind, int], tuple[float, float]]
#: ``(time_s, energy_j)`` of an op at an SM clock and a (locked, non-default) memory clock.
MemCostFn = Callable[[int, Kind, int, int], tuple[float, float]]


def profile_costs(
    profile: Profile,
) -> tuple[list[int], OpCostFn, tuple[int, ...], MemCostFn | None]:
    """An op at clock ``f`` costs exactly ``profile``'s time and energy (the nearest profiled
    clock when ``f`` was not profiled).

    Returns:
        The SM clocks (the union of the profile's), the cost function, the memory clocks
        (highest first; empty for a profile without them) and the memory cost function (None
        unless the profile has more than one memory clock).
    """
    clocks = sorted({o.freq_mhz for op in profile.ops.values() for o in op.options})
    # An SM clock alone means the default (highest) memory clock: OpProfile.at.
    tables = {
        key: {f: (op.at(f).time_s, op.at(f).energy_j) for f in {o.freq_mhz for o in op.options}}
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
    """Every stage costs the same: ``op_time_s[kind]`` at the highest clock (uncapped), scaled
    by the preset's time model; power from its power model at ``activity``.

    Returns:
        The cost function and the memory cost function (None without a memory model).
    """
    u = preset.activity if activity is None else activity
    times = dict(preset.op_time_s)
    if op_time_s is not None:
        times.update(op_time_s)
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
