"""A budget over time: which plan to run in each interval of a price or carbon signal.

Given a signal (interval ``k`` starts at ``start_s[k]`` and costs ``value[k]`` per kWh until
the next start, the last until the deadline), a number of iterations ``N`` and a deadline
``D``, :func:`schedule_plans` finds how many iterations to run in each interval and with which
frontier plans so that all ``N`` finish by ``D`` at the least total cost
``Σ_k value[k] · energy_kwh(interval k)``.

**Method (exact).** Mixing plans within an interval, the least energy of ``n`` iterations in
``d`` seconds is ``F(n) = n · h(d / n)``, where ``h`` is the lower convex hull of the frontier's
points in (time, energy) from the fastest point to the minimum-energy one (any mix of points
lies on or above it, and a point of the hull is a mix of its two adjacent vertices). ``F`` is
convex and piecewise linear in ``n``: up to ``d / t_m`` iterations cost ``e_m`` each (the
minimum-energy vertex ``m``; the rest of the interval idles), and between ``d / t_{j+1}`` and
``d / t_j`` each further iteration costs ``e_j − s_j · t_j``, the hull edge's intercept
(``s_j`` its slope), increasing towards the fast end. The whole problem is therefore the
allocation of ``N`` units over convex piecewise-linear costs, and taking the cheapest segments
first (``value[k]`` × intercept), all intervals together, is optimal: this is the LP over the
hull's points solved exactly, with at most two adjacent hull vertices per interval.

**Whole iterations.** The LP optimum is rounded to whole iterations: each interval keeps the
integer part of its share, the remaining iterations (fewer than the number of intervals) go
one by one to the interval whose next iteration costs least, and an interval's two plans are
split so that its iterations finish within it (the faster plan gets the rounded-up share).
An iteration never straddles an interval boundary. The reported ``lp_cost`` is the exact
fractional optimum (a lower bound); ``cost`` is the whole-iteration schedule's.

Complexity: O(K·H·log(K·H)) for K intervals and H hull vertices.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from perseus.errors import ConfigError, InfeasibleError
from perseus.plan import PlanPoint

__all__ = [
    "J_PER_KWH",
    "PowerSchedule",
    "ScheduleInterval",
    "lower_hull_indices",
    "schedule_plans",
]

#: Joules in one kilowatt-hour (signal values are per kWh).
J_PER_KWH = 3.6e6


@dataclass(frozen=True, slots=True)
class ScheduleInterval:
    """One interval of the signal and what runs in it.

    Attributes:
        start_s, end_s: The interval, in seconds from the job's start (clipped to the deadline).
        value: The signal's value (cost per kWh) in this interval.
        fast_index, fast_iterations: The faster plan (a frontier point index) and its count.
        slow_index, slow_iterations: The slower adjacent plan and its count (0 if unused).
        busy_s: Time the interval's iterations take (the rest of the interval idles).
        energy_j: Their energy; ``cost`` = ``value`` × ``energy_j`` in kWh.
    """

    start_s: float
    end_s: float
    value: float
    fast_index: int
    fast_iterations: int
    slow_index: int
    slow_iterations: int
    busy_s: float
    energy_j: float

    @property
    def iterations(self) -> int:
        return self.fast_iterations + self.slow_iterations

    @property
    def cost(self) -> float:
        return self.value * self.energy_j / J_PER_KWH


@dataclass(frozen=True, slots=True)
class PowerSchedule:
    """The schedule: intervals in time order and its figures.

    Attributes:
        intervals: One record per signal interval before the deadline.
        iterations: ``N``.
        deadline_s: ``D``.
        cost: Total cost of the whole-iteration schedule (value × kWh).
        lp_cost: The exact fractional optimum (≤ ``cost``).
        baseline_index: The no-slowdown plan (the cheapest as fast as all-max).
        baseline_cost: Cost of running it back to back from time 0, or None if that misses
            the deadline.
        hull: Frontier point indices of the lower convex hull used.
    """

    intervals: tuple[ScheduleInterval, ...]
    iterations: int
    deadline_s: float
    cost: float
    lp_cost: float
    baseline_index: int
    baseline_cost: float | None
    hull: tuple[int, ...]

    @property
    def finish_s(self) -> float:
        """When the last iteration ends (its interval's start plus the interval's busy time)."""
        busy = [iv for iv in self.intervals if iv.iterations]
        return busy[-1].start_s + busy[-1].busy_s if busy else 0.0

    @property
    def energy_j(self) -> float:
        return sum(iv.energy_j for iv in self.intervals)

    def segments(self) -> tuple[tuple[int, int], ...]:
        """``(first_iteration, point_index)`` runs in order (consecutive equal plans merged):
        what a running job follows."""
        out: list[tuple[int, int]] = []
        done = 0
        for iv in self.intervals:
            for index, count in (
                (iv.fast_index, iv.fast_iterations),
                (iv.slow_index, iv.slow_iterations),
            ):
                if count and (not out or out[-1][1] != index):
                    out.append((done, index))
                done += count
        return tuple(out)


def lower_hull_indices(points: Sequence[PlanPoint]) -> tuple[int, ...]:
    """Indices of the lower convex hull in (time, energy), fastest point to minimum energy.

    Points slower than the minimum-energy point are never useful and are left out; among
    equal times the lower energy is kept. Complexity: O(P log P) (monotone chain).
    """
    if not points:
        raise ConfigError("the frontier has no points")
    best = min(range(len(points)), key=lambda i: (points[i].energy_j, points[i].time_s))
    t_best = points[best].time_s
    order = sorted(
        (i for i in range(len(points)) if points[i].time_s <= t_best),
        key=lambda i: (points[i].time_s, points[i].energy_j),
    )
    hull: list[int] = []
    for i in order:
        if hull and points[hull[-1]].time_s == points[i].time_s:
            continue  # same time, higher energy
        while len(hull) >= 2:
            a, b = points[hull[-2]], points[hull[-1]]
            c = points[i]
            cross = (b.time_s - a.time_s) * (c.energy_j - a.energy_j) - (
                b.energy_j - a.energy_j
            ) * (c.time_s - a.time_s)
            if cross <= 0:  # b is on or above the chord a-c
                hull.pop()
            else:
                break
        hull.append(i)
    return tuple(hull)


def _check_inputs(
    starts_s: Sequence[float], values: Sequence[float], iterations: int, deadline_s: float
) -> None:
    if len(starts_s) != len(values) or not starts_s:
        raise ConfigError(
            f"signal needs one value per start, at least one row; got {len(starts_s)} starts "
            f"and {len(values)} values"
        )
    if iterations < 1:
        raise ConfigError(f"`iterations` must be >= 1, got {iterations}")
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(f"`deadline_s` must be a positive number of seconds, got {deadline_s}")
    if starts_s[0] != 0:
        raise ConfigError(f"signal must start at 0 s (the job's start), got {starts_s[0]}")
    for k in range(1, len(starts_s)):
        if not starts_s[k] > starts_s[k - 1]:
            raise ConfigError(
                f"signal row {k + 1}: start {starts_s[k]} s is not after the previous row's "
                f"{starts_s[k - 1]} s; sort the rows by start, without repeats"
            )
    for k, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(
                f"signal row {k + 1}: value {v} is not a finite number >= 0 (a price or carbon "
                "intensity per kWh)"
            )


@dataclass(frozen=True, slots=True)
class _Curve:
    """``F(n)`` of one interval: least energy of ``n`` iterations in ``d`` seconds."""

    d_s: float
    times_s: tuple[float, ...]  # hull vertex times, fastest first
    energies_j: tuple[float, ...]

    @property
    def max_iterations(self) -> int:
        return math.floor(self.d_s / self.times_s[0] * (1 + 1e-12))

    def energy_j(self, n: float) -> float:
        t, e = self.times_s, self.energies_j
        if n <= 0:
            return 0.0
        tau = self.d_s / n
        if tau >= t[-1]:
            return n * e[-1]
        j = max(i for i in range(len(t)) if t[i] <= tau * (1 + 1e-12))
        if j == len(t) - 1:
            return n * e[-1]
        slope = (e[j + 1] - e[j]) / (t[j + 1] - t[j])
        return n * (e[j] - slope * t[j]) + slope * self.d_s

    def segments(self) -> list[tuple[float, float]]:
        """``(iterations, energy per iteration)``, cheapest first."""
        t, e, d = self.times_s, self.energies_j, self.d_s
        out = [(d / t[-1], e[-1])]
        for j in range(len(t) - 2, -1, -1):
            slope = (e[j + 1] - e[j]) / (t[j + 1] - t[j])
            out.append((d / t[j] - d / t[j + 1], e[j] - slope * t[j]))
        return out

    def split(self, n: int) -> tuple[int, int, int, int]:
        """Whole iterations: ``(fast vertex, fast count, slow vertex, slow count)`` finishing
        within ``d`` (``n`` ≤ :attr:`max_iterations`)."""
        t = self.times_s
        m = len(t) - 1
        if n == 0:
            return m, 0, m, 0
        if n * t[m] <= self.d_s:
            return m, n, m, 0
        tau = self.d_s / n
        j = max(i for i in range(m) if t[i] <= tau * (1 + 1e-12))
        fast = math.ceil((n * t[j + 1] - self.d_s) / (t[j + 1] - t[j]) - 1e-9)
        fast = min(max(fast, 0), n)
        return j, fast, j + 1, n - fast


def schedule_plans(
    points: Sequence[PlanPoint],
    starts_s: Sequence[float],
    values: Sequence[float],
    *,
    iterations: int,
    deadline_s: float,
    baseline_time_s: float | None = None,
) -> PowerSchedule:
    """The least-cost schedule of ``iterations`` iterations by ``deadline_s`` (see module).

    Args:
        points: The frontier's points (indices in the result refer to them).
        starts_s: Interval starts in seconds from the job's start: 0 first, increasing.
        values: Cost per kWh of each interval (>= 0).
        iterations: ``N``.
        deadline_s: ``D``; intervals starting at or after it are ignored, the last one ends
            at it.
        baseline_time_s: The all-max iteration time; the no-slowdown plan (the baseline the
            saving is measured against) is the cheapest point no slower. Default: the
            fastest point's time.

    Returns:
        The schedule; its ``lp_cost`` is the exact optimum over mixes of frontier plans.

    Raises:
        ConfigError: for a bad signal, ``N`` or ``D``.
        InfeasibleError: if ``N`` iterations cannot finish by ``D`` even at the fastest plan,
            naming how many can and the deadline that ``N`` needs.
    """
    _check_inputs(starts_s, values, iterations, deadline_s)
    hull = lower_hull_indices(points)
    times = tuple(points[i].time_s for i in hull)
    energies = tuple(points[i].energy_j for i in hull)
    bounds = [s for s in starts_s if s < deadline_s] + [deadline_s]
    curves = [_Curve(bounds[k + 1] - bounds[k], times, energies) for k in range(len(bounds) - 1)]
    capacity = sum(c.max_iterations for c in curves)
    if iterations > capacity:
        t0 = times[0]
        raise InfeasibleError(
            f"{iterations} iterations cannot finish by {deadline_s:g} s: at the fastest plan "
            f"({t0:.6g} s per iteration, whole iterations per signal interval) at most "
            f"{capacity} fit; lower `iterations` or raise `deadline_s` to at least "
            f"{_needed_deadline_s(starts_s, t0, iterations):.6g}"
        )
    # The LP: cheapest segments first, all intervals together.
    segs = sorted(
        (values[k] * cost, k, rank, length)
        for k, c in enumerate(curves)
        for rank, (length, cost) in enumerate(c.segments())
    )
    share = [0.0] * len(curves)
    left = float(iterations)
    for _, k, _, length in segs:
        take = min(length, left)
        share[k] += take
        left -= take
        if left <= 0:
            break
    lp_cost = sum(values[k] * c.energy_j(share[k]) for k, c in enumerate(curves)) / J_PER_KWH
    whole = _round_shares(curves, values, share, iterations)
    out = []
    for k, c in enumerate(curves):
        fj, fn, sj, sn = c.split(whole[k])
        energy = fn * energies[fj] + sn * energies[sj]
        out.append(
            ScheduleInterval(
                start_s=bounds[k],
                end_s=bounds[k + 1],
                value=values[k],
                fast_index=hull[fj],
                fast_iterations=fn,
                slow_index=hull[sj],
                slow_iterations=sn,
                busy_s=fn * times[fj] + sn * times[sj],
                energy_j=energy,
            )
        )
    base_t = points[0].time_s if baseline_time_s is None else baseline_time_s
    no_slow = min(
        (i for i in range(len(points)) if points[i].time_s <= base_t * (1 + 1e-12)),
        key=lambda i: (points[i].energy_j, points[i].time_s),
        default=0,
    )
    return PowerSchedule(
        intervals=tuple(out),
        iterations=iterations,
        deadline_s=deadline_s,
        cost=sum(iv.cost for iv in out),
        lp_cost=lp_cost,
        baseline_index=no_slow,
        baseline_cost=_back_to_back_cost(points[no_slow], bounds, values, iterations),
        hull=hull,
    )


def _round_shares(
    curves: list[_Curve], values: Sequence[float], share: list[float], iterations: int
) -> list[int]:
    whole = [
        min(math.floor(s + 1e-9), c.max_iterations) for s, c in zip(share, curves, strict=True)
    ]
    left = iterations - sum(whole)

    def marginal(k: int) -> float:
        c = curves[k]
        return values[k] * (c.energy_j(whole[k] + 1) - c.energy_j(whole[k]))

    heap = [(marginal(k), k) for k in range(len(curves)) if whole[k] < curves[k].max_iterations]
    heapq.heapify(heap)
    while left > 0:
        _, k = heapq.heappop(heap)  # capacity was checked: never empty here
        whole[k] += 1
        left -= 1
        if whole[k] < curves[k].max_iterations:
            heapq.heappush(heap, (marginal(k), k))
    return whole


def _needed_deadline_s(starts_s: Sequence[float], t0_s: float, iterations: int) -> float:
    """The least deadline at which ``iterations`` whole fastest iterations fit the intervals."""
    done = 0
    for k, start in enumerate(starts_s):
        if k + 1 == len(starts_s):  # the last interval is unbounded
            break
        fit = math.floor((starts_s[k + 1] - start) / t0_s * (1 + 1e-12))
        if done + fit >= iterations:
            break
        done += fit
    return start + (iterations - done) * t0_s


def _back_to_back_cost(
    point: PlanPoint, bounds: list[float], values: Sequence[float], iterations: int
) -> float | None:
    end_s = iterations * point.time_s
    if end_s > bounds[-1] * (1 + 1e-12):
        return None
    power_w = point.energy_j / point.time_s
    total = 0.0
    for k in range(len(bounds) - 1):
        overlap = max(0.0, min(end_s, bounds[k + 1]) - bounds[k])
        total += values[k] * power_w * overlap
    return total / J_PER_KWH
