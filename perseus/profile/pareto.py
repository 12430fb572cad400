"""Pareto filtering of op options in (time, effective energy).

With blocking power ``P``, a GPU that finishes an op early idles at ``P`` watts until its next
op, so the cost of an option that keeps the iteration time fixed is its *effective* energy
``e - P·t``. An option is useful only if no faster-or-equal option has lower-or-equal
effective energy.
"""

from __future__ import annotations

from collections.abc import Sequence

from perseus.profile.model import OpOption

__all__ = ["pareto_options"]


def pareto_options(options: Sequence[OpOption], blocking_power_w: float) -> tuple[OpOption, ...]:
    """The options not dominated in (time, effective energy), sorted by time ascending.

    Complexity: O(k log k) for k options.
    """
    ordered = sorted(options, key=lambda o: (o.time_s, o.energy_j - blocking_power_w * o.time_s))
    kept: list[OpOption] = []
    best = float("inf")
    for o in ordered:
        eff = o.energy_j - blocking_power_w * o.time_s
        if eff < best:
            kept.append(o)
            best = eff
    return tuple(kept)
