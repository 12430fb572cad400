"""``plan schedule``: the least-cost schedule over a signal, checked against an independent LP.

The reference is scipy's LP over *every* frontier point (not the hull the solver uses):
variables ``n[k, j]`` >= 0 iterations of point ``j`` in interval ``k``, ``Σ_j n[k, j] t_j <=
d_k``, ``Σ n = N``, minimising ``Σ value_k e_j n[k, j]``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import linprog

from perseus.errors import ConfigError, InfeasibleError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import Frontier, PlanPoint
from perseus.runtime.emulation import take_stages
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import J_PER_KWH, lower_hull_indices, schedule_plans

HOURS = 168
WEEK_S = HOURS * 3600.0


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    job = make_job(take_stages(load_profile("a100"), 4), "1f1b", 4, 4, blocking_power_w=83.64)
    return trace_frontier(job)


def _reference_lp(
    points: tuple[PlanPoint, ...], starts: list[float], values: list[float], n: int, d: float
) -> float:
    bounds = [s for s in starts if s < d] + [d]
    k_count, p_count = len(bounds) - 1, len(points)
    t = np.array([p.time_s for p in points])
    e = np.array([p.energy_j for p in points])
    c = np.concatenate([values[k] * e for k in range(k_count)]) / J_PER_KWH
    a_ub = np.zeros((k_count, k_count * p_count))
    for k in range(k_count):
        a_ub[k, k * p_count : (k + 1) * p_count] = t
    res = linprog(
        c,
        A_ub=a_ub,
        b_ub=np.diff(bounds),
        A_eq=np.ones((1, k_count * p_count)),
        b_eq=[n],
        bounds=(0, None),
        method="highs",
    )
    assert res.status == 0, res.message
    return float(res.fun)


def _check(frontier: Frontier, values: list[float], load: float) -> dict[str, float]:
    starts = [3600.0 * h for h in range(HOURS)]
    pts = frontier.points
    n = int(load * WEEK_S / pts[0].time_s)
    s = schedule_plans(
        pts,
        starts,
        values,
        iterations=n,
        deadline_s=WEEK_S,
        baseline_time_s=frontier.baseline.time_s,
    )
    ref = _reference_lp(pts, starts, values, n, WEEK_S)
    # The exact optimum is the LP's; whole iterations cost at most 0.1 % more.
    assert s.lp_cost == pytest.approx(ref, rel=1e-6)  # HiGHS solves to ~1e-7
    assert ref <= s.cost * (1 + 1e-9) and s.cost <= ref * 1.001
    # All N iterations, each interval's work within the interval, the deadline met.
    assert sum(iv.iterations for iv in s.intervals) == n
    for iv in s.intervals:
        assert iv.busy_s <= iv.end_s - iv.start_s + 1e-9
        # At most two plans, adjacent on the hull.
        if iv.slow_iterations and iv.fast_iterations:
            hull = lower_hull_indices(pts)
            assert hull.index(iv.slow_index) == hull.index(iv.fast_index) + 1
    assert s.finish_s <= WEEK_S
    # Independently recomputed cost of the schedule as written.
    cost = sum(
        iv.value
        * (iv.fast_iterations * pts[iv.fast_index].energy_j + iv.slow_iterations * pts[iv.slow_index].energy_j)
        for iv in s.intervals
    ) / J_PER_KWH  # fmt: skip
    assert cost == pytest.approx(s.cost, rel=1e-12)
    # The saving against the no-slowdown plan run back to back from the start.
    assert s.baseline_cost is not None and s.cost < s.baseline_cost
    no_slow = frontier.cheapest_within(frontier.baseline.time_s)
    end = n * no_slow.time_s
    base = sum(
        values[h] * no_slow.energy_j / no_slow.time_s * max(0.0, min(end, 3600.0 * (h + 1)) - 3600.0 * h)
        for h in range(HOURS)
    ) / J_PER_KWH  # fmt: skip
    assert s.baseline_cost == pytest.approx(base, rel=1e-9)
    return {"cost": s.cost, "lp": ref, "baseline": s.baseline_cost, "saving": 1 - s.cost / base}


@pytest.mark.parametrize("load", [0.5, 0.9, 0.99])
def test_week_of_hourly_values_with_a_daily_pattern(frontier: Frontier, load: float) -> None:
    values = [100 + 80 * math.sin(2 * math.pi * h / 24) for h in range(HOURS)]
    figures = _check(frontier, values, load)
    assert figures["saving"] > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_random_series(frontier: Frontier, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = [float(v) for v in rng.uniform(0, 500, HOURS)]
    values[5] = 0.0  # a free hour is allowed
    _check(frontier, values, 0.8)


def test_a_flat_signal_at_full_load_runs_fast_and_saves_only_the_plan_difference(
    frontier: Frontier,
) -> None:
    pts = frontier.points
    n = int(0.999 * WEEK_S / pts[0].time_s)
    s = schedule_plans(pts, [0.0], [1.0], iterations=n, deadline_s=WEEK_S)
    assert s.cost == pytest.approx(_reference_lp(pts, [0.0], [1.0], n, WEEK_S), rel=1e-3)
    assert s.finish_s <= WEEK_S


def test_refuses_when_n_cannot_finish_by_the_deadline(frontier: Frontier) -> None:
    t0 = frontier.fastest.time_s
    starts = [3600.0 * h for h in range(HOURS)]
    fits = sum(math.floor(3600.0 / t0) for _ in range(HOURS))
    schedule_plans(frontier.points, starts, [1.0] * HOURS, iterations=fits, deadline_s=WEEK_S)
    with pytest.raises(InfeasibleError, match=f"at most {fits} fit; lower `iterations`"):
        schedule_plans(
            frontier.points, starts, [1.0] * HOURS, iterations=fits + 1, deadline_s=WEEK_S
        )


@pytest.mark.parametrize(
    ("starts", "values", "match"),
    [
        ([1.0], [1.0], "must start at 0"),
        ([0.0, 5.0, 5.0], [1.0, 1.0, 1.0], "row 3: start 5.0 s is not after"),
        ([0.0, 5.0], [1.0, -1.0], "row 2: value -1.0"),
        ([0.0], [math.nan], "row 1: value nan"),
    ],
)
def test_bad_signals_are_config_errors(frontier: Frontier, starts, values, match) -> None:
    with pytest.raises(ConfigError, match=match):
        schedule_plans(frontier.points, starts, values, iterations=1, deadline_s=10.0)


def test_hull_is_convex_and_spans_fastest_to_min_energy(frontier: Frontier) -> None:
    pts = frontier.points
    hull = lower_hull_indices(pts)
    assert hull[0] == 0 and pts[hull[-1]] == frontier.min_energy
    t = [pts[i].time_s for i in hull]
    e = [pts[i].energy_j for i in hull]
    slopes = [(e[i + 1] - e[i]) / (t[i + 1] - t[i]) for i in range(len(hull) - 1)]
    assert all(b > a for a, b in itertools.pairwise(slopes))
    # Every point lies on or above the hull.
    for p in pts:
        if p.time_s > t[-1]:
            continue
        j = max(i for i in range(len(t)) if t[i] <= p.time_s)
        if j + 1 < len(t):
            at = e[j] + slopes[j] * (p.time_s - t[j])
            assert p.energy_j >= at - 1e-9 * at
