"""The one Pareto filter, and its use on op options in (time, effective energy).

A GPU that finishes an op early idles at the blocking power ``P``, so an option's cost at a
fixed iteration time is its *effective* energy ``e - P·t``; an option is useful only if no
faster-or-equal one costs as little. The same filter keeps a frontier's improving plans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from perseus.profile.model import OpOption

__all__ = ["convex_front", "lower_hull", "pareto_indices", "pareto_options"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def pareto_indices(
    time_s: FloatArray | Sequence[float], cost: FloatArray | Sequence[float], rel_tol: float = 1e-12
) -> IntArray:
    """Indices of the strictly improving points in time order.

    A point is kept when its cost is lower (by more than ``rel_tol`` relative) than every
    point no slower than it; of equal times the cheapest comes first, so ties and duplicates
    are dropped. Costs may be negative (effective energies).

    Complexity: O(k log k) for k points (vectorised).
    """
    t = np.asarray(time_s, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    if t.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((c, t))
    cs = c[order]
    # The best cost among all faster-or-equal points before each one (sorted order).
    before = np.concatenate(([np.inf], np.minimum.accumulate(cs)[:-1]))
    keep = cs < before - rel_tol * np.abs(np.where(np.isfinite(before), before, 0.0))
    return order[keep].astype(np.int64)


def pareto_options(options: Sequence[OpOption], blocking_power_w: float) -> tuple[OpOption, ...]:
    """The options not dominated in (time, effective energy), sorted by time ascending.

    Complexity: O(k log k) for k options.
    """
    t = [o.time_s for o in options]
    c = [o.energy_j - blocking_power_w * o.time_s for o in options]
    return tuple(options[i] for i in pareto_indices(t, c, 0.0).tolist())


def lower_hull(time_s: FloatArray, cost_j: FloatArray) -> IntArray:
    """Indices of the lower convex hull of points sorted by time (Andrew's monotone chain).

    The whole hull, from the fastest point to the slowest; with Pareto input (cost strictly
    decreasing) it ends at the cheapest point. :func:`convex_front` stops at the cheapest one.

    Complexity: O(K) for K sorted points.
    """
    # Python floats: the same doubles, without a NumPy scalar made per element read.
    t: list[float] = np.asarray(time_s, dtype=np.float64).tolist()
    c: list[float] = np.asarray(cost_j, dtype=np.float64).tolist()
    hull: list[int] = []
    for i in range(len(t)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (t[b] - t[a]) * (c[i] - c[a]) - (c[b] - c[a]) * (t[i] - t[a])
            if cross <= 0:  # b lies on or above segment a-i
                hull.pop()
            else:
                break
        hull.append(i)
    return np.array(hull, dtype=np.int64)


def convex_front(x: FloatArray, y: FloatArray) -> IntArray:
    """Indices of the lower convex hull of the points ``(x, y)``, ``x`` ascending, from the
    least ``x`` to the least ``y`` (of equal ``y`` the least ``x``; of equal ``x`` the least
    ``y``). Complexity: O(P log P).
    """
    xs: list[float] = np.asarray(x, dtype=np.float64).tolist()
    ys: list[float] = np.asarray(y, dtype=np.float64).tolist()
    best = min(range(len(xs)), key=lambda i: (ys[i], xs[i]))
    order = sorted((i for i in range(len(xs)) if xs[i] <= xs[best]), key=lambda i: (xs[i], ys[i]))
    # Of equal x only the least y (the first) can be on the hull.
    order = [i for k, i in enumerate(order) if k == 0 or xs[order[k - 1]] != xs[i]]
    out: IntArray = np.array(order, dtype=np.int64)[lower_hull(x[order], y[order])]
    return out
