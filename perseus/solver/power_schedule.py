"""A budget over time: which plan to run in each interval of a price or carbon signal.

:func:`schedule_plans` runs ``N`` iterations by a deadline at the least ``Σ_k value[k] ·
energy_kwh(k)``, idle GPUs included: exactly over mixes of frontier plans (cheapest hull
segments first, all intervals together, a threshold found by bisection), then in whole
iterations that never straddle an interval boundary (the method: ``docs/power.md``).
Complexity: O(K·log H) per bisection step for K intervals and H hull vertices, ~45 steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.dag.graph import BoolArray, FloatArray, IntArray
from perseus.errors import ConfigError, InfeasibleError
from perseus.plan import MAX_TIME_S, PlanPoint
from perseus.profile.pareto import convex_front

__all__ = [
    "J_PER_KWH",
    "MAX_SIGNAL_VALUE",
    "PowerSchedule",
    "lower_hull_indices",
    "schedule_plans",
]

#: Joules in one kilowatt-hour (signal values are per kWh).
J_PER_KWH = 3.6e6
#: Largest signal value, in magnitude, per kWh: far above any price or carbon intensity, far
#: below overflow in the sums.
MAX_SIGNAL_VALUE = 1e9
#: Longest signal or deadline: a thousand years of seconds.
_MAX_HORIZON_S = 1e3 * 365.25 * 86400


@dataclass(frozen=True, slots=True)
class PowerSchedule:
    """The schedule, one array entry per signal interval before the deadline.

    Attributes:
        starts_s, ends_s, values: The intervals (seconds from the signal's start).
        fast_index, fast_iterations, slow_index, slow_iterations: What runs in each.
        busy_s: Per interval, the time its iterations take (the rest idles).
        energy_j: Their energy.
        idle_energy_j: The idle GPUs' energy over the rest of the interval.
        iterations, deadline_s, idle_power_w: As given to :func:`schedule_plans`.
        cost: Total cost of the whole-iteration schedule, idle included (value × kWh).
        lp_cost: The exact fractional optimum (≤ ``cost``).
        baseline_index: The no-slowdown plan (the cheapest as fast as all-max).
        baseline_cost: Cost of running it back to back from the first interval, or None if
            that misses the deadline.
    """

    starts_s: FloatArray
    ends_s: FloatArray
    values: FloatArray
    fast_index: IntArray
    fast_iterations: IntArray
    slow_index: IntArray
    slow_iterations: IntArray
    busy_s: FloatArray
    energy_j: FloatArray
    idle_energy_j: FloatArray
    iterations: int
    deadline_s: float
    idle_power_w: float
    cost: float
    lp_cost: float
    baseline_index: int
    baseline_cost: float | None

    @property
    def interval_iterations(self) -> IntArray:
        return self.fast_iterations + self.slow_iterations

    @property
    def interval_costs(self) -> FloatArray:
        return self.values * (self.energy_j + self.idle_energy_j) / J_PER_KWH

    def cost_on(self, values_per_kwh: FloatArray) -> float:
        """The schedule's total on another series over the same intervals."""
        return float(np.sum(values_per_kwh * (self.energy_j + self.idle_energy_j))) / J_PER_KWH

    def energy_between(self, a_s: float, b_s: float) -> FloatArray:
        """Each interval's energy drawn in ``[a_s, b_s)`` (iterations back to back from its
        start at their average power, then idle)."""
        busy_end = self.starts_s + self.busy_s
        run_s = np.clip(np.minimum(b_s, busy_end) - np.maximum(a_s, self.starts_s), 0.0, None)
        idle_s = np.clip(np.minimum(b_s, self.ends_s) - np.maximum(a_s, busy_end), 0.0, None)
        run_w = np.divide(
            self.energy_j, self.busy_s, out=np.zeros_like(self.busy_s), where=self.busy_s > 0
        )
        out: FloatArray = run_w * run_s + self.idle_power_w * idle_s
        return out

    def used(self) -> IntArray:
        """Indices of the intervals that run iterations, in time order."""
        return np.flatnonzero(self.interval_iterations)

    @property
    def finish_s(self) -> float:
        """When the last iteration ends."""
        used = self.used()
        if not used.size:
            return float(self.starts_s[0]) if self.starts_s.size else 0.0
        k = int(used[-1])
        return float(self.starts_s[k] + self.busy_s[k])

    @property
    def total_energy_j(self) -> float:
        """Energy of the iterations and of the idle GPUs until the deadline."""
        return float(self.energy_j.sum() + self.idle_energy_j.sum())

    def segments(self) -> tuple[tuple[int, int], ...]:
        """``(first_iteration, point_index)`` runs in order, equal neighbours merged."""
        counts = np.stack([self.fast_iterations, self.slow_iterations], axis=1).ravel()
        index = np.stack([self.fast_index, self.slow_index], axis=1).ravel()
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        run = counts > 0
        counts, index, firsts = counts[run], index[run], firsts[run]
        new = np.concatenate([[True], index[1:] != index[:-1]])
        return tuple(zip(firsts[new].tolist(), index[new].tolist(), strict=True))


def lower_hull_indices(points: Sequence[PlanPoint], idle_power_w: float = 0.0) -> tuple[int, ...]:
    """Indices of the lower convex hull in (time, energy above idle ``e − idle_power_w · t``),
    from the fastest point to the least energy above idle; of equal times the lower energy.
    Complexity: O(P log P).
    """
    if not points:
        raise ConfigError("the frontier has no points")
    t = np.array([p.time_s for p in points])
    e = np.array([p.energy_j for p in points])
    return tuple(convex_front(t, e - idle_power_w * t).tolist())


@dataclass(frozen=True, slots=True)
class _Curves:
    """One hull's ``F(n)`` per unit of interval length: vertices and segments."""

    index: IntArray  # frontier point indices, fastest first
    times_s: FloatArray
    vertex_extra_j: FloatArray  # energy above idle of each vertex
    seg_cost_j: FloatArray  # marginal energy of each segment, in the order taken
    cum_width: FloatArray  # cum_width[p]: iterations per second of the first p segments

    @classmethod
    def build(cls, times: FloatArray, extra: FloatArray, upper: bool) -> _Curves:
        idx = convex_front(times, -extra if upper else extra)
        t, e = times[idx], extra[idx]
        m = idx.size - 1
        slopes = np.diff(e) / np.diff(t)  # edge j: vertex j to j + 1
        # Segment 0: the last vertex alone; segment r >= 1: edge m - r.
        edges = np.arange(m - 1, -1, -1)
        cost = np.concatenate([[e[m]], e[edges] - slopes[edges] * t[edges]])
        width = np.concatenate([[1.0 / t[m]], 1.0 / t[edges] - 1.0 / t[edges + 1]])
        return cls(idx, t, e, cost, np.concatenate([[0.0], np.cumsum(width)]))

    def extra_j(self, d: FloatArray, n: FloatArray) -> FloatArray:
        """Least (upper hull: greatest) energy above idle of ``n`` iterations in ``d``."""
        t, e = self.times_s, self.vertex_extra_j
        m = t.size - 1
        out = np.zeros_like(d)
        pos = n > 0
        tau = np.divide(d, n, out=np.full_like(d, np.inf), where=pos)
        # One vertex, or slower than the last one (a full interval's d / t_0 may round below).
        slow = pos & ((tau >= t[m]) | (m == 0))
        out[slow] = n[slow] * e[m]
        mixed = pos & ~slow
        if m and mixed.any():
            j = np.clip(np.searchsorted(t, tau[mixed], side="right") - 1, 0, m - 1)
            slope = (e[j + 1] - e[j]) / (t[j + 1] - t[j])
            out[mixed] = n[mixed] * (e[j] - slope * t[j]) + slope * d[mixed]
        return out

    def plans(self, d: FloatArray, n: IntArray) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Whole iterations: (fast point, fast count, slow point, slow count) per interval,
        finishing within ``d`` (``n`` at most ``d / t_0``)."""
        t = self.times_s
        m = t.size - 1
        fast_v = np.full(n.shape, m, dtype=np.int64)
        slow_v = fast_v.copy()
        fast_n = n.copy()
        slow_n = np.zeros_like(n)
        mixed = (n > 0) & (n * t[m] > d)
        if m and mixed.any():
            nm = n[mixed]
            tau = d[mixed] / nm
            j = np.clip(np.searchsorted(t, tau * (1 + 1e-12), side="right") - 1, 0, m - 1)
            fast = np.ceil((nm * t[j + 1] - d[mixed]) / (t[j + 1] - t[j]) - 1e-9)
            fast = np.clip(fast, 0, nm).astype(np.int64)
            fast_v[mixed], fast_n[mixed] = j, fast
            slow_v[mixed], slow_n[mixed] = j + 1, nm - fast
        return self.index[fast_v], fast_n, self.index[slow_v], slow_n


def _check_inputs(
    starts_s: FloatArray, values: FloatArray, iterations: int, deadline_s: float, idle_w: float
) -> None:
    """One line naming the argument (or signal row) at fault, for every bad input."""
    if starts_s.shape != values.shape or not starts_s.size:
        raise ConfigError(
            f"signal needs one value per start, at least one row; got {starts_s.size} starts "
            f"and {values.size} values"
        )
    if not 1 <= iterations <= 10**15:
        raise ConfigError(f"`iterations` must be in [1, 1e15], got {iterations}")
    if not (math.isfinite(deadline_s) and 0 < deadline_s <= _MAX_HORIZON_S):
        raise ConfigError(
            f"`deadline_s` must be a positive number of seconds up to {_MAX_HORIZON_S:.3g}, "
            f"got {deadline_s}"
        )
    if not (math.isfinite(idle_w) and 0 <= idle_w <= 1e9):
        raise ConfigError(f"`idle_power_w` must be in [0, 1e9] W, got {idle_w}")
    if starts_s[0] != 0:
        raise ConfigError(f"signal must start at 0 s (the job's start), got {starts_s[0]}")
    bad = np.flatnonzero(~(np.diff(starts_s) > 0))
    if bad.size:
        k = int(bad[0]) + 1
        raise ConfigError(
            f"signal row {k + 1}: start {starts_s[k]} s is not after the previous row's "
            f"{starts_s[k - 1]} s; sort the rows by start, without repeats"
        )
    if not np.isfinite(starts_s[-1]) or starts_s[-1] > _MAX_HORIZON_S:
        raise ConfigError(f"signal: start {starts_s[-1]} s is beyond {_MAX_HORIZON_S:.3g} s")
    bad = np.flatnonzero(~(np.abs(values) <= MAX_SIGNAL_VALUE))
    if bad.size:
        k = int(bad[0])
        raise ConfigError(
            f"signal row {k + 1}: value {values[k]} is not a finite number within "
            f"±{MAX_SIGNAL_VALUE:g} (a price or carbon intensity per kWh)"
        )


def schedule_plans(
    points: Sequence[PlanPoint],
    starts_s: Sequence[float] | FloatArray,
    values: Sequence[float] | FloatArray,
    *,
    iterations: int,
    deadline_s: float,
    baseline_time_s: float | None = None,
    idle_power_w: float = 0.0,
    from_s: float = 0.0,
) -> PowerSchedule:
    """The least-cost schedule of ``iterations`` iterations by ``deadline_s`` (see module).

    Args:
        points: The frontier's points (indices in the result refer to them).
        starts_s: Interval starts in seconds from the job's start: 0 first, increasing.
        values: Cost per kWh of each interval, within ±:data:`MAX_SIGNAL_VALUE` (negative: the
            grid pays for energy).
        iterations: ``N``.
        deadline_s: ``D``; the last interval ends at it.
        baseline_time_s: The all-max iteration time; the no-slowdown plan is the cheapest
            point no slower (default: the fastest point's time).
        idle_power_w: The job's summed idle power, drawn while no iteration runs.
        from_s: Plan from this time on (a re-plan; earlier intervals are left out).

    Returns:
        The schedule; its ``lp_cost`` is the exact optimum over mixes of frontier plans.

    Raises:
        ConfigError: for a bad signal, ``N``, ``D``, idle power or ``from_s``, or no points.
        InfeasibleError: if ``N`` iterations cannot finish by ``D`` even at the fastest plan
            (naming how many can and the deadline ``N`` needs).
    """
    st = np.asarray(starts_s, dtype=np.float64)
    va = np.asarray(values, dtype=np.float64)
    _check_inputs(st, va, iterations, deadline_s, idle_power_w)
    if not 0 <= from_s < deadline_s:
        raise ConfigError(f"`from_s` must be in [0, deadline), got {from_s}")
    if not points:
        raise ConfigError("the frontier has no points")
    times = np.array([p.time_s for p in points])
    energies = np.array([p.energy_j for p in points])
    first = int(np.searchsorted(st, from_s, side="right")) - 1
    last = int(np.searchsorted(st, deadline_s, side="left"))  # intervals [first, last)
    bounds = np.concatenate([[from_s], st[first + 1 : last], [deadline_s]])
    prob = _Problem.build(times, energies - idle_power_w * times, np.diff(bounds), va[first:last])
    max_whole = prob.capacity(iterations, deadline_s, bounds)
    share = _lp_shares(prob, iterations)
    fixed_j = idle_power_w * prob.d
    lp_cost = float(np.sum(prob.v * (prob.extra_j(share) + fixed_j))) / J_PER_KWH
    fast_i, fast_n, slow_i, slow_n = prob.plans(_round_shares(prob, share, max_whole, iterations))
    busy = fast_n * times[fast_i] + slow_n * times[slow_i]
    energy = fast_n * energies[fast_i] + slow_n * energies[slow_i]
    idle_j = idle_power_w * np.maximum(prob.d - busy, 0.0)
    no_slow = _no_slowdown(times, energies, baseline_time_s)
    return PowerSchedule(
        starts_s=bounds[:-1],
        ends_s=bounds[1:],
        values=prob.v,
        fast_index=fast_i,
        fast_iterations=fast_n,
        slow_index=slow_i,
        slow_iterations=slow_n,
        busy_s=busy,
        energy_j=energy,
        idle_energy_j=idle_j,
        iterations=iterations,
        deadline_s=deadline_s,
        idle_power_w=idle_power_w,
        cost=float(np.sum(prob.v * (energy + idle_j))) / J_PER_KWH,
        lp_cost=lp_cost,
        baseline_index=no_slow,
        baseline_cost=_back_to_back_cost(
            times[no_slow], energies[no_slow], bounds, prob.v, iterations, idle_power_w
        ),
    )


def _no_slowdown(times: FloatArray, energies: FloatArray, baseline_time_s: float | None) -> int:
    """The cheapest point no slower than the baseline (default: the fastest point's time)."""
    base_t = float(times[0]) if baseline_time_s is None else baseline_time_s
    return min(
        (i for i in range(times.size) if times[i] <= base_t * (1 + 1e-12)),
        key=lambda i: (energies[i], times[i]),
        default=0,
    )


@dataclass(frozen=True, slots=True)
class _Problem:
    """The intervals to plan: lengths ``d``, values ``v``, and the hulls their costs follow
    (``high``, the upper hull, where ``v`` < 0; ``low`` itself when none is)."""

    low: _Curves
    high: _Curves
    neg: BoolArray
    d: FloatArray
    v: FloatArray

    @classmethod
    def build(cls, times: FloatArray, extra: FloatArray, d: FloatArray, v: FloatArray) -> _Problem:
        low = _Curves.build(times, extra, upper=False)
        high = _Curves.build(times, extra, upper=True) if (v < 0).any() else low
        return cls(low, high, v < 0, d, v)

    def capacity(self, iterations: int, deadline_s: float, bounds: FloatArray) -> IntArray:
        """Whole fastest iterations per interval; InfeasibleError if ``iterations`` do not
        fit, with the deadline they need."""
        t0 = float(self.low.times_s[0])
        max_whole = np.floor(self.d / t0 * (1 + 1e-12)).astype(np.int64)
        capacity = int(max_whole.sum())
        if iterations > capacity:
            needed = _needed_deadline_s(bounds[:-1], max_whole[:-1], t0, iterations)
            fix = (
                f"lower `iterations` or raise `deadline_s` to at least {needed}"
                if float(needed) <= _MAX_HORIZON_S
                else f"lower `iterations` (a deadline past {_MAX_HORIZON_S:.6g} s is refused)"
            )
            raise InfeasibleError(
                f"{iterations} iterations cannot finish by {deadline_s:g} s: at the fastest "
                f"plan ({t0:.6g} s per iteration, whole iterations per signal interval) at most "
                f"{capacity} fit; {fix}"
            )
        return max_whole

    def extra_j(self, n: FloatArray, ks: IntArray | None = None) -> FloatArray:
        """Least (where ``v`` < 0: greatest) energy above idle of ``n`` iterations in each
        interval (of ``ks``, default all)."""
        d, neg = (self.d, self.neg) if ks is None else (self.d[ks], self.neg[ks])
        out = self.low.extra_j(d, n)
        if self.high is not self.low and neg.any():
            out[neg] = self.high.extra_j(d[neg], n[neg])
        return out

    def plans(self, whole: IntArray) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """(fast point, fast count, slow point, slow count) per interval."""
        fast_i, fast_n, slow_i, slow_n = self.low.plans(self.d, whole)
        neg = self.neg
        if self.high is not self.low and neg.any():
            hv = self.high.plans(self.d[neg], whole[neg])
            fast_i[neg], fast_n[neg], slow_i[neg], slow_n[neg] = hv
        return fast_i, fast_n, slow_i, slow_n


@dataclass(frozen=True, slots=True)
class _Block:
    """Intervals of one sign of value: a threshold ``θ`` takes the prefix
    ``searchsorted(order, θ · scale)`` of each one's segments (``scale`` None: zero values,
    all or nothing)."""

    curves: _Curves
    ks: IntArray
    d: FloatArray
    order: FloatArray
    scale: FloatArray | None

    def taken(self, theta: float) -> IntArray:
        """How many segments of each interval cost at most ``theta``."""
        if self.scale is None:
            return np.full(self.ks.size, self.curves.seg_cost_j.size if theta >= 0 else 0)
        return np.searchsorted(self.order, theta * self.scale, side="right")

    def count(self, theta: float) -> float:
        return float(np.dot(self.d, self.curves.cum_width[self.taken(theta)]))

    def cost_range(self, v: FloatArray) -> list[float]:
        if not self.ks.size:
            return []
        ends = v[self.ks][[v[self.ks].argmin(), v[self.ks].argmax()]]
        return [float(x) for x in np.outer(ends, self.curves.seg_cost_j).ravel()]


def _lp_shares(prob: _Problem, iterations: int) -> FloatArray:
    """The LP optimum's iterations per interval: every segment cheaper than the threshold,
    and the threshold's ties filled earliest interval first."""
    low, high, d, v = prob.low, prob.high, prob.d, prob.v
    pos, zero = np.flatnonzero(v > 0), np.flatnonzero(v == 0)
    negs = np.flatnonzero(prob.neg)
    blocks = [
        # v > 0: v·c <= θ  <=>  c <= θ / v (c increases along a lower hull).
        _Block(low, pos, d[pos], low.seg_cost_j, 1.0 / v[pos]),
        # v < 0: v·c <= θ  <=>  -c <= θ / -v (c decreases along an upper hull).
        _Block(high, negs, d[negs], -high.seg_cost_j, -1.0 / v[negs]),
        _Block(low, zero, d[zero], low.seg_cost_j, None),
    ]

    def count(theta: float) -> float:
        return sum(b.count(theta) for b in blocks)

    extremes = [x for b in blocks for x in b.cost_range(v)]
    scale = max(max(abs(x) for x in extremes), 1e-300)
    lo, hi = min(extremes) - scale, max(extremes) + scale  # count(lo) = 0 < N <= count(hi)
    while hi - lo > 1e-12 * scale:
        mid = lo + (hi - lo) / 2
        if count(mid) >= iterations:
            hi = mid
        else:
            lo = mid
    share = np.zeros_like(d)
    band: list[tuple[IntArray, FloatArray]] = []  # (interval, room in the tie band)
    for b in blocks:
        p_lo, p_hi = b.taken(lo), b.taken(hi)
        share[b.ks] = b.d * b.curves.cum_width[p_lo]
        tie = p_hi > p_lo
        room = b.d[tie] * (b.curves.cum_width[p_hi[tie]] - b.curves.cum_width[p_lo[tie]])
        band.append((b.ks[tie], room))
    need = iterations - float(share.sum())
    ks = np.concatenate([k for k, _ in band])
    if need > 0 and ks.size:
        order = np.argsort(ks, kind="stable")
        ks, room = ks[order], np.concatenate([r for _, r in band])[order]
        before = np.concatenate([[0.0], np.cumsum(room)[:-1]])
        share[ks] += np.clip(need - before, 0.0, room)
    return share


def _round_shares(
    prob: _Problem, share: FloatArray, max_whole: IntArray, iterations: int
) -> IntArray:
    """Whole iterations: the integer part of each share, then the rest one each per round to
    the intervals whose next iteration costs least."""
    whole = np.minimum(np.floor(share + 1e-9).astype(np.int64), max_whole)
    left = iterations - int(whole.sum())
    while left > 0:
        open_ = np.flatnonzero(whole < max_whole)  # capacity was checked: never empty
        n = whole[open_].astype(np.float64)
        marginal = prob.v[open_] * (prob.extra_j(n + 1, open_) - prob.extra_j(n, open_))
        take = min(left, open_.size)
        pick = open_[np.argsort(marginal, kind="stable")[:take]]
        whole[pick] += 1
        left -= take
    return whole


def _needed_deadline_s(starts_s: FloatArray, fit: IntArray, t0_s: float, iterations: int) -> str:
    """The least deadline at which ``iterations`` whole fastest iterations fit (``fit[k]`` in
    interval ``k``), written rounded up."""
    done_before = np.concatenate([[0], np.cumsum(fit)])
    k = int(np.searchsorted(done_before, iterations, side="left")) - 1
    k = max(0, min(k, starts_s.size - 1))
    # Interval k holds the rest; the last one is open-ended.
    needed = float(starts_s[k]) + (iterations - int(done_before[k])) * t0_s
    return _ceil_text(needed * (1 + 1e-12) + 1e-9)


def _ceil_text(x: float, digits: int = 6) -> str:
    """``x`` written with ``digits`` significant digits, rounded up (never below ``x``)."""
    step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    up = math.ceil(x / step) * step
    while float(f"{up:.{digits}g}") < x:  # formatting can round the last digit down
        up += step
    return f"{up:.{digits}g}"


def _back_to_back_cost(
    time_s: float,
    energy_j: float,
    bounds: FloatArray,
    values: FloatArray,
    iterations: int,
    idle_power_w: float,
) -> float | None:
    start = float(bounds[0])
    end_s = start + iterations * time_s
    if end_s > bounds[-1] * (1 + 1e-12) or end_s > MAX_TIME_S * 1e6:
        return None
    run_w = energy_j / time_s
    running = np.clip(np.minimum(end_s, bounds[1:]) - bounds[:-1], 0.0, None)
    idle = np.diff(bounds) - running
    return float(np.sum(values * (run_w * running + idle_power_w * idle))) / J_PER_KWH
