"""Synthetic pipeline profiles from a documented A100 physical model (fixed seeds).

The model is the simulator's A100-SXM4 model from ``shared/notes/gpu-backend.md`` §5:

* **Clocks**: 1410 MHz down to 810 MHz in 30 MHz steps (21 clocks; the band a planner uses).
* **Time**: smooth max of compute and memory time,
  ``t(f) = t_ref·((c·f₀/f)^p + m^p)^(1/p) / (c^p + m^p)^(1/p)`` with p = 8, c = 0.91, m = 0.89,
  f₀ = 1410 MHz.
* **Power** while computing: ``P = P_base + u·C·(f/GHz)·V(f)²`` with P_base = 37 W,
  C = 470 W/(GHz·V²), u = 0.75, and V(f) = 0.70 V up to the 1095 MHz knee, rising linearly to
  0.83 V at 1410 MHz; energy = P·t.
* **Stages**: stage ``s`` has forward time ``t_ref = 0.05 s · (1 + 0.08·z_s)`` with
  ``z_s ~ N(0, 1)`` drawn from ``numpy.random.default_rng(seed)`` (imbalance as in real
  partitions); backward takes 2× the forward time and energy (so blocking power 85 W, the A100
  P2P-wait power, applies).
"""

from __future__ import annotations

import numpy as np

from perseus.profile import Profile, build_profile
from perseus.schedule import Kind

__all__ = ["SYNTHETIC_BLOCKING_POWER_W", "synthetic_profile"]

#: Power of a GPU spinning in a P2P wait (A100, notes §5.1).
SYNTHETIC_BLOCKING_POWER_W = 85.0

_F0_MHZ = 1410
_P, _C, _M = 8.0, 0.91, 0.89
_P_BASE_W, _C_W, _U = 37.0, 470.0, 0.75
_V_MIN, _V_MAX, _F_KNEE = 0.70, 0.83, 1095


def _voltage(freq_mhz: float) -> float:
    if freq_mhz <= _F_KNEE:
        return _V_MIN
    return _V_MIN + (_V_MAX - _V_MIN) * (freq_mhz - _F_KNEE) / (_F0_MHZ - _F_KNEE)


def _time_factor(freq_mhz: float) -> float:
    num = ((_C * _F0_MHZ / freq_mhz) ** _P + _M**_P) ** (1 / _P)
    return float(num / (_C**_P + _M**_P) ** (1 / _P))


def _power_w(freq_mhz: float) -> float:
    return _P_BASE_W + _U * _C_W * (freq_mhz / 1000.0) * _voltage(freq_mhz) ** 2


def synthetic_profile(num_stages: int, seed: int = 0) -> Profile:
    """A profile of ``num_stages`` stages (forward and backward) from the model above."""
    rng = np.random.default_rng(seed)
    imbalance = 1.0 + 0.08 * rng.standard_normal(num_stages)
    rows: list[tuple[int, Kind, int, float, float]] = []
    for s in range(num_stages):
        t_ref = 0.05 * float(max(imbalance[s], 0.5))
        for freq in range(_F0_MHZ, 809, -30):
            t = t_ref * _time_factor(freq)
            e = _power_w(freq) * t
            rows.append((s, Kind.F, freq, t, e))
            rows.append((s, Kind.B, freq, 2 * t, 2 * e))
    return build_profile(rows, source=f"synthetic A100 model ({num_stages} stages, seed {seed})")
