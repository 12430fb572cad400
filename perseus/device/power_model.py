"""The simulator's physics: power and op time as functions of the SM clock.

Follows ``docs/hardware.md#sim-model``: under compute, ``P = P_base + u·C·(f/GHz)·V(f)²`` with a
voltage floor below a knee clock and a linear rise above it; op time follows either a smooth
max of compute and memory time or the simpler linear compute-bound share. A power cap clamps
the *effective* clock to the highest supported clock whose power fits. All functions are pure
(no clock, no files) so the sanity check of docs/hardware.md#sim-defaults can be checked exactly in
tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["PowerModel", "TimeModel", "capped_clock_mhz"]


@dataclass(frozen=True, slots=True)
class PowerModel:
    """Board power under load, idle and while blocked on communication.

    Attributes:
        base_w: ``P_base``, the fitted constant of the compute formula (below idle power because
            the fit only covers loaded clocks).
        c_w_per_ghz_v2: ``C``, watts per GHz·V² at activity 1.
        v_min: Voltage floor (volts), used up to ``knee_mhz``.
        knee_mhz: Clock where the voltage starts to rise.
        v_max: Voltage at ``max_mhz``.
        max_mhz: Highest supported clock.
        idle_w: Power with no kernels running.
        blocking_w: Power while spinning in a P2P/collective wait; also the floor under compute.
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
    """Op time relative to its time at ``ref_mhz``.

    ``smooth_max``: ``t(f)/t_ref = ((c·f_ref/f)^p + m^p)^(1/p) / (c^p + m^p)^(1/p)``, a smooth
    maximum of a compute term (∝ 1/f) and a memory term (flat). ``linear``:
    ``t(f)/t_ref = α·f_ref/f + 1 − α`` with ``α`` the compute-bound share.
    """

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
    """The effective clock: the largest supported clock ≤ ``freq_mhz`` whose power fits the cap.

    Args:
        clocks_mhz: Supported clocks, highest first.
        freq_mhz: The requested (already snapped) clock.
        power_of: Power at each supported clock for the op in question.
        cap_w: Enforced power limit, or None for no cap.

    Returns:
        The clamped clock; the lowest supported clock if nothing fits (a real GPU cannot go
        lower either). O(len(clocks_mhz)).
    """
    candidates = [f for f in clocks_mhz if f <= freq_mhz]
    if not candidates:
        candidates = [min(clocks_mhz)]
    if cap_w is None:
        return candidates[0]
    for f in candidates:
        if power_of[f] <= cap_w:
            return f
    return candidates[-1]
