"""The simulator's physics: power and op time as functions of the SM (and memory) clock.

Pure functions of ``docs/hardware.md#sim-model`` (power ``P_base + u·C·f·V(f)²`` with a voltage
knee, smooth-max or linear op time, a power cap clamping the effective clock) and of
``docs/memory-clocks.md`` (:class:`MemoryModel`: memory power and memory-bound op time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from perseus.errors import ConfigError
from perseus.profile.model import OpOption, Profile, ProfileRow, build_profile
from perseus.schedule.actions import Kind

__all__ = [
    "MemoryModel",
    "PowerModel",
    "TimeModel",
    "capped_clock_mhz",
    "memory_clock_option",
    "with_memory_clocks",
]


@dataclass(frozen=True, slots=True)
class PowerModel:
    """Board power under load, idle and while blocked on communication.

    Attributes:
        base_w: ``P_base``, the fitted constant (below idle: the fit covers loaded clocks).
        c_w_per_ghz_v2: ``C``, watts per GHz·V² at activity 1.
        v_min: Voltage floor (volts), up to ``knee_mhz``.
        knee_mhz: Clock where the voltage starts to rise.
        v_max: Voltage at ``max_mhz``.
        max_mhz: Highest supported clock.
        idle_w: Power with no kernels running.
        blocking_w: Power in a P2P/collective wait; also the floor under compute.
    """

    base_w: float
    c_w_per_ghz_v2: float
    v_min: float
    knee_mhz: float
    v_max: float
    max_mhz: float
    idle_w: float
    blocking_w: float

    def voltage(self, freq_mhz: float) -> float:
        """``V(f)``: flat below the knee, linear up to ``v_max`` at ``max_mhz``."""
        if freq_mhz <= self.knee_mhz or self.max_mhz <= self.knee_mhz:
            return self.v_min
        share = min(1.0, (freq_mhz - self.knee_mhz) / (self.max_mhz - self.knee_mhz))
        return self.v_min + (self.v_max - self.v_min) * share

    def compute_power_w(self, freq_mhz: float, activity: float = 1.0) -> float:
        """Power while an op of activity ``u`` runs at ``freq_mhz`` (never below blocking power)."""
        v = self.voltage(freq_mhz)
        raw = self.base_w + activity * self.c_w_per_ghz_v2 * (freq_mhz / 1000.0) * v * v
        return max(raw, self.blocking_w)


@dataclass(frozen=True, slots=True)
class TimeModel:
    """Op time relative to its time at ``ref_mhz``: a smooth max of a compute and a memory
    term, or ``linear`` with compute-bound share ``alpha``."""

    ref_mhz: float
    form: Literal["smooth_max", "linear"] = "smooth_max"
    p: float = 8.0
    c: float = 0.91
    m: float = 0.89
    alpha: float = 0.78

    def factor(self, freq_mhz: float) -> float:
        """``t(f) / t(ref_mhz)``; 1 at the reference clock, growing as the clock drops."""
        ratio = self.ref_mhz / freq_mhz
        if self.form == "linear":
            return self.alpha * ratio + 1.0 - self.alpha
        p = self.p
        num = ((self.c * ratio) ** p + self.m**p) ** (1.0 / p)
        den = (self.c**p + self.m**p) ** (1.0 / p)
        return float(num / den)


def capped_clock_mhz(
    clocks_mhz: Sequence[int], freq_mhz: int, power_of: dict[int, float], cap_w: float | None
) -> int:
    """The largest clock in ``clocks_mhz`` (highest first) at or below ``freq_mhz`` whose
    power (``power_of``) fits ``cap_w`` (None: no cap); the lowest one if nothing fits.
    O(len(clocks_mhz))."""
    candidates = [f for f in clocks_mhz if f <= freq_mhz] or [min(clocks_mhz)]
    if cap_w is None:
        return candidates[0]
    return next((f for f in candidates if power_of[f] <= cap_w), candidates[-1])


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """A lockable memory clock: its power and how much of each op kind it bounds.

    Attributes:
        clocks_mhz: Supported memory clocks, highest (the default) first.
        power_at_max_w: Memory power under load at the highest memory clock (part of the SM
            model's power).
        static_share: Share of that power that does not scale with the memory clock.
        memory_bound_share: Per op kind, the share ``β`` of its time that scales with ``1/g``.
        source: Where the figures come from.
    """

    clocks_mhz: tuple[int, ...]
    power_at_max_w: float
    static_share: float
    memory_bound_share: Mapping[Kind, float] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        if not self.clocks_mhz or list(self.clocks_mhz) != sorted(self.clocks_mhz, reverse=True):
            raise ConfigError(
                f"memory clocks must be a non-empty list, highest first; got {self.clocks_mhz}"
            )
        if not (math.isfinite(self.power_at_max_w) and self.power_at_max_w >= 0):
            raise ConfigError(f"memory power must be >= 0 W, got {self.power_at_max_w}")
        if not 0.0 <= self.static_share <= 1.0:
            raise ConfigError(f"memory static share must be in [0, 1], got {self.static_share}")
        for kind, beta in self.memory_bound_share.items():
            if not 0.0 <= beta < 1.0:
                raise ConfigError(
                    f"memory-bound share of {kind.profile_name} must be in [0, 1), got {beta}"
                )

    @property
    def max_mhz(self) -> int:
        return self.clocks_mhz[0]

    def power_w(self, mem_freq_mhz: float) -> float:
        """``P_mem(g)`` under load."""
        share = self.static_share + (1.0 - self.static_share) * mem_freq_mhz / self.max_mhz
        return self.power_at_max_w * share

    def extra_time_s(self, kind: Kind, ref_time_s: float, mem_freq_mhz: float) -> float:
        """Time an op of ``kind`` (``ref_time_s`` at the highest clocks) gains at ``g``."""
        beta = self.memory_bound_share.get(kind, 0.0)
        return beta * ref_time_s * (self.max_mhz / mem_freq_mhz - 1.0)


def memory_clock_option(
    at_max_mem: OpOption, ref_time_s: float, kind: Kind, model: MemoryModel, mem_freq_mhz: int
) -> OpOption:
    """The option of an op at memory clock ``mem_freq_mhz``, from its option at the same SM
    clock and the highest memory clock (``ref_time_s``: its time at the highest clocks)."""
    time_s = at_max_mem.time_s + model.extra_time_s(kind, ref_time_s, mem_freq_mhz)
    power_w = (
        at_max_mem.energy_j / at_max_mem.time_s
        - model.power_w(model.max_mhz)
        + model.power_w(mem_freq_mhz)
    )
    return OpOption(at_max_mem.freq_mhz, time_s, power_w * time_s, mem_freq_mhz)


def with_memory_clocks(profile: Profile, model: MemoryModel) -> Profile:
    """A profile of (SM, memory) clock pairs from one measured at the default memory clock.
    O(options × memory clocks).

    Raises:
        ConfigError: if ``profile`` already has memory clocks.
    """
    rows: list[ProfileRow] = []
    for (stage, kind), op in profile.ops.items():
        if op.has_memory_clocks:
            raise ConfigError(
                f"{profile.source}: already has memory clocks; derive pairs from a profile "
                "measured at the default memory clock"
            )
        ref = op.max_freq.time_s
        for o in op.options:
            for g in model.clocks_mhz:
                x = o if g == model.max_mhz else memory_clock_option(o, ref, kind, model, g)
                rows.append((stage, kind, o.freq_mhz, x.time_s, x.energy_j, g))
    return build_profile(rows, source=f"{profile.source} (memory clocks {list(model.clocks_mhz)})")
