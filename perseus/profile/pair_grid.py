"""Which (SM, memory) clock pairs to measure: a coarse grid first, then refined near the hull.

Only pairs on the lower convex hull of an op's options in (time, effective energy) matter to the
planner, so a sweep measures every ``stride``-th SM clock at every memory clock, then, round by
round, the SM clocks next to each hull vertex, until a round adds nothing. Pure: the caller
measures and feeds the options back (:func:`next_pairs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perseus.profile.model import OpOption
from perseus.profile.pareto import lower_hull, pareto_options

__all__ = ["coarse_pair_grid", "next_pairs"]

Pair = tuple[int, int]


def coarse_pair_grid(
    sm_clocks_mhz: Sequence[int], mem_clocks_mhz: Sequence[int], stride: int = 4
) -> tuple[Pair, ...]:
    """Every ``stride``-th SM clock (and the lowest) at every memory clock, highest first.

    Complexity: O(S·M) for S SM and M memory clocks.

    Raises:
        ValueError: if ``stride`` < 1 or a clock list is empty.
    """
    if stride < 1 or not sm_clocks_mhz or not mem_clocks_mhz:
        raise ValueError(f"need stride >= 1 and clock lists, got {stride}")
    sm = sorted(set(sm_clocks_mhz), reverse=True)
    picked = sorted({*sm[::stride], sm[-1]}, reverse=True)
    return tuple((f, m) for m in sorted(set(mem_clocks_mhz), reverse=True) for f in picked)


def _hull(options: Sequence[OpOption], blocking_power_w: float) -> list[OpOption]:
    opts = pareto_options(options, blocking_power_w)
    t = np.array([o.time_s for o in opts])
    c = np.array([o.energy_j - blocking_power_w * o.time_s for o in opts])
    return [opts[i] for i in lower_hull(t, c).tolist()]


def next_pairs(
    measured: Sequence[OpOption],
    sm_clocks_mhz: Sequence[int],
    blocking_power_w: float,
    radius: int = 4,
) -> tuple[Pair, ...]:
    """The unmeasured pairs worth measuring next: for each hull vertex ``(f, m)`` of the
    measured options, the SM clocks within ``radius`` places of ``f`` in the clock list, at
    memory clock ``m``. Empty when the hull's neighbourhood is measured (the sweep is done).

    Complexity: O(K log K + H·radius) for K measured options and H hull vertices.
    """
    sm = sorted(set(sm_clocks_mhz), reverse=True)
    where = {f: i for i, f in enumerate(sm)}
    done = {(o.freq_mhz, o.mem_freq_mhz) for o in measured}
    out: set[Pair] = set()
    for v in _hull(measured, blocking_power_w):
        if v.mem_freq_mhz is None or v.freq_mhz not in where:
            continue
        i = where[v.freq_mhz]
        for j in range(max(0, i - radius), min(len(sm), i + radius + 1)):
            out.add((sm[j], v.mem_freq_mhz))
    return tuple(sorted(out - done, key=lambda p: (-p[1], -p[0])))
