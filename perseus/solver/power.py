"""The power of a plan over its iteration, and the fastest plan under a power budget.

At every instant a GPU running an op draws that op's power (its energy / time at the plan's
clock; a two-clock op its mix's average), a GPU between ops the blocking power, as in the exact
evaluator; the iteration is taken on its own. Complexity: O(N log N) per plan (one sort of 2N
events).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perseus.dag.evaluate import evaluations
from perseus.dag.graph import FloatArray
from perseus.errors import InfeasibleError, PlanError
from perseus.job import PlanningJob
from perseus.plan import SCHEMA_VERSION, Frontier, PlanPoint, PointPower

__all__ = [
    "PowerTimeline",
    "TimeShare",
    "fastest_under_power",
    "plan_power",
    "power_timeline",
    "power_timelines",
    "time_share_under_power",
    "timeline_of",
    "with_power",
]

#: Event times closer than this fraction of the iteration are one instant (float noise of the
#: longest path: an op that starts as its predecessor ends).
_SAME_INSTANT = 1e-9


@dataclass(frozen=True, slots=True)
class PowerTimeline:
    """The pipeline's summed power as a step function over one iteration.

    Attributes:
        times_s: Breakpoints ``0 = t_0 < t_1 < ... < t_m = T`` (shape (m + 1,)).
        power_w: Summed power on ``[t_i, t_{i+1})`` (shape (m,)).
    """

    times_s: FloatArray
    power_w: FloatArray

    @property
    def energy_j(self) -> float:
        """The step function's integral (equals the evaluator's energy)."""
        return float(np.dot(np.diff(self.times_s), self.power_w))


def power_timeline(job: PlanningJob, point: PlanPoint) -> PowerTimeline:
    """The summed power of ``job``'s ranks over one iteration of ``point``."""
    return power_timelines(job, [point])[0]


def power_timelines(job: PlanningJob, points: Sequence[PlanPoint]) -> list[PowerTimeline]:
    """:func:`power_timeline` of each point, one longest-path pass per 64 points."""
    out: list[PowerTimeline] = []
    for lo in range(0, len(points), 64):
        costs = [job.op_costs(job.flat(p)) for p in points[lo : lo + 64]]
        time_s = np.stack([c[0] for c in costs])
        energy_j = np.stack([c[1] for c in costs])
        evs = evaluations(job.graph, time_s, energy_j, blocking_power_w=job.blocking_power_w)
        out.extend(
            timeline_of(ev.start_s, ev.end_s, t, e, job.blocking_power_w, job.graph.num_ranks)
            for ev, t, e in zip(evs, time_s, energy_j, strict=True)
        )
    return out


def timeline_of(
    start_s: FloatArray,
    end_s: FloatArray,
    op_time_s: FloatArray,
    op_energy_j: FloatArray,
    blocking_power_w: float,
    ranks: int,
) -> PowerTimeline:
    """The summed power step function from each op's start, end, time and energy; the
    iteration ends at the last op's end."""
    block = blocking_power_w
    total_s = float(end_s.max())
    busy = op_time_s > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        extra_w = np.where(busy, op_energy_j / np.where(busy, op_time_s, 1.0) - block, 0.0)
    times = np.concatenate([start_s[busy], end_s[busy]])
    deltas = np.concatenate([extra_w[busy], -extra_w[busy]])
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    # One instant per cluster of event times within float noise of each other.
    new_instant = np.diff(times, prepend=-np.inf) > _SAME_INSTANT * total_s
    ids = np.cumsum(new_instant) - 1
    instants = times[new_instant]
    net = np.bincount(ids, weights=deltas, minlength=instants.size) if times.size else deltas
    level = ranks * block + np.cumsum(net)
    # Breakpoints: 0, every instant inside (0, T), T; level after each instant.
    inside = (instants > _SAME_INSTANT * total_s) & (instants < total_s * (1 - _SAME_INSTANT))
    at_zero = instants <= _SAME_INSTANT * total_s
    start_level = float(level[at_zero][-1]) if at_zero.any() else ranks * block
    bps = np.concatenate([[0.0], instants[inside], [total_s]])
    levels = np.concatenate([[start_level], level[inside]])
    # Clean rounding residue below zero (the all-blocking floor when blocking power is 0).
    levels = np.maximum(levels, 0.0)
    return PowerTimeline(bps.astype(np.float64), levels.astype(np.float64))


def plan_power(job: PlanningJob, point: PlanPoint) -> PointPower:
    """Average (from the point's exact figures), peak and minimum summed power of ``point``,
    and its largest step change (ends and starts at one instant netted)."""
    return _point_power(point, power_timeline(job, point))


def _point_power(point: PlanPoint, timeline: PowerTimeline) -> PointPower:
    avg = point.energy_j / point.time_s
    steps = np.abs(np.diff(timeline.power_w))
    return PointPower(
        avg_power_w=avg,
        peak_power_w=max(float(timeline.power_w.max()), avg),
        min_power_w=min(float(timeline.power_w.min()), avg),
        max_step_w=float(steps.max()) if steps.size else 0.0,
    )


def with_power(job: PlanningJob, frontier: Frontier) -> Frontier:
    """A copy of ``frontier`` whose points carry their :class:`PointPower` (schema 3)."""
    timelines = power_timelines(job, frontier.points)
    points = [
        p.model_copy(update={"power": _point_power(p, tl)})
        for p, tl in zip(frontier.points, timelines, strict=True)
    ]
    return frontier.with_points(points).model_copy(update={"schema_version": SCHEMA_VERSION})


def fastest_under_power(
    points: Sequence[PlanPoint],
    budget_w: float,
    *,
    measure: Literal["average", "peak"] = "average",
) -> PlanPoint:
    """The fastest point (then the lower energy) whose average (or peak) summed power is at
    most ``budget_w``.

    Raises:
        InfeasibleError: if no point fits, naming the lowest figure any point reaches.
        PlanError: for ``measure="peak"`` on points without power figures.
    """

    def figure(p: PlanPoint) -> float:
        if measure == "average":
            return p.avg_power_w
        if p.power is None:
            raise PlanError(
                "the frontier has no peak power figures (schema version < 3); regenerate it "
                "with `perseus frontier`"
            )
        return p.power.peak_power_w

    slack = 1e-12 * max(budget_w, 1.0)
    fits = [p for p in points if figure(p) <= budget_w + slack]
    if not fits:
        lowest = min(figure(p) for p in points)
        raise InfeasibleError(
            f"no plan's {measure} power is at most {budget_w:.6g} W; the lowest any plan "
            f"reaches is {lowest:.6g} W"
        )
    return min(fits, key=lambda p: (p.time_s, p.energy_j))


@dataclass(frozen=True, slots=True)
class TimeShare:
    """Two plans alternated across iterations so that their mean power meets a budget.

    Attributes:
        fast_index, slow_index: Frontier point indices (adjacent on the lower convex hull).
        fast_share: The share of iterations that run the faster plan, in (0, 1).
        mean_time_s: Mean iteration time of the mix.
        avg_power_w: Total energy over total time of the mix (the budget).
    """

    fast_index: int
    slow_index: int
    fast_share: float
    mean_time_s: float
    avg_power_w: float


def time_share_under_power(points: Sequence[PlanPoint], budget_w: float) -> TimeShare | None:
    """The fastest mix of two plans, alternated across iterations, whose average power is at
    most ``budget_w``: where the line ``E = budget_w · t`` crosses the lower convex hull in
    (time, energy). None when one plan is as fast, or when no plan fits.
    """
    from perseus.solver.power_schedule import lower_hull_indices

    hull = lower_hull_indices(points)
    over = [points[i].energy_j - budget_w * points[i].time_s for i in hull]
    for j in range(len(hull) - 1):
        if over[j] > 0 >= over[j + 1]:
            a, b = points[hull[j]], points[hull[j + 1]]
            share = -over[j + 1] / (over[j] - over[j + 1])
            if not 0 < share < 1:
                return None
            mean_s = share * a.time_s + (1 - share) * b.time_s
            energy_j = share * a.energy_j + (1 - share) * b.energy_j
            return TimeShare(hull[j], hull[j + 1], share, mean_s, energy_j / mean_s)
    return None
