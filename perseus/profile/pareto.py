"""The one Pareto filter, and its use on op options in (time, effective energy).

With blocking power ``P``, a GPU that finishes an op early idles at ``P`` watts until its next
op, so the cost of an option that keeps the iteration time fixed is its *effective* energy
``e - P·t``. An option is useful only if no faster-or-equal option has lower-or-equal
effective energy. The same filter keeps a frontier's strictly improving plans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from perseus.profile.model import OpOption

__all__ = ["pareto_indices", "pareto_options"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def pareto_indices(
    time_s: FloatArray | Sequence[float], cost: FloatArray | Sequence[float], rel_tol: float = 1e-12
) -> IntArray:
    """Indices of the strictly improving points in time order.

    A point is kept when its cost is lower (by more than ``rel_tol`` relative) than every
    point no slower than it; of equal times the cheapest comes first, so ties and duplicates
    are dropped. Costs may be negative (effective energies).

    Complexity: O(k log k) for k points.
    """
    t = np.asarray(time_s, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    kept: list[int] = []
    best = np.inf
    for i in np.lexsort((c, t)).tolist():
        ci = float(c[i])
        if not kept or ci < best - rel_tol * abs(best):
            kept.append(int(i))
            best = ci
    return np.array(kept, dtype=np.int64)


def pareto_options(options: Sequence[OpOption], blocking_power_w: float) -> tuple[OpOption, ...]:
    """The options not dominated in (time, effective energy), sorted by time ascending.

    Complexity: O(k log k) for k options.
    """
    t = [o.time_s for o in options]
    c = [o.energy_j - blocking_power_w * o.time_s for o in options]
    return tuple(options[i] for i in pareto_indices(t, c, 0.0).tolist())
