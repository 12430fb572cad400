"""``plan schedule``: the least-cost schedule over a signal, checked against an independent LP.

The reference is scipy's LP over *every* frontier point (not the hull the solver uses) and the
idle GPUs: variables ``n[k, j]`` >= 0 iterations of point ``j`` in interval ``k`` and
``idle[k]`` >= 0 seconds of idle GPUs, ``Σ_j n[k, j] t_j + idle[k] = d_k``, ``Σ n = N``,
minimising ``Σ value_k (e_j n[k, j] + P0 idle[k])``. Values may be negative or zero.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from perseus.errors import ConfigError, InfeasibleError
from perseus.io import load_profile
from perseus.io.power_files import read_signal
from perseus.job import make_job
from perseus.plan import Frontier, PlanPoint
from perseus.runtime.emulation import take_stages
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import (
    J_PER_KWH,
    MAX_SIGNAL_VALUE,
    lower_hull_indices,
    schedule_plans,
)

HOURS = 168
WEEK_S = HOURS * 3600.0


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    job = make_job(take_stages(load_profile("a100"), 4), "1f1b", 4, 4, blocking_power_w=83.64)
    return trace_frontier(job)


def _reference_lp(
    points: tuple[PlanPoint, ...],
    starts: list[float],
    values: list[float],
    n: int,
    d: float,
    idle_w: float = 0.0,
) -> float:
    bounds = [s for s in starts if s < d] + [d]
    k_count, p_count = len(bounds) - 1, len(points)
    t = np.array([p.time_s for p in points])
    e = np.array([p.energy_j for p in points])
    width = p_count + 1  # the points, then the idle seconds
    # In joules x value: dividing by J_PER_KWH here would put the costs under HiGHS's
    # tolerances (about 1e-7) and cost it four digits.
    c = np.concatenate([values[k] * np.append(e, idle_w) for k in range(k_count)])
    a_eq = np.zeros((k_count + 1, k_count * width))
    for k in range(k_count):
        a_eq[k, k * width : (k + 1) * width] = np.append(t, 1.0)
        a_eq[k_count, k * width : k * width + p_count] = 1.0
    res = linprog(
        c,
        A_eq=a_eq,
        b_eq=np.append(np.diff(bounds), n),
        bounds=(0, None),
        method="highs",
    )
    assert res.status == 0, res.message
    return float(res.fun) / J_PER_KWH


def _check(
    frontier: Frontier, values: list[float], load: float, idle_w: float = 0.0
) -> dict[str, float]:
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
        idle_power_w=idle_w,
    )
    ref = _reference_lp(pts, starts, values, n, WEEK_S, idle_w)
    # The exact optimum is the LP's; whole iterations cost at most 0.1 % more.
    assert s.lp_cost == pytest.approx(ref, rel=1e-6)  # HiGHS solves to ~1e-7
    assert ref <= s.cost + 1e-9 * abs(s.cost) and s.cost - ref <= 1e-3 * abs(ref)
    # All N iterations, each interval's work within the interval, the deadline met.
    assert int(s.interval_iterations.sum()) == n
    assert (s.busy_s <= s.ends_s - s.starts_s + 1e-9).all()
    # At most two plans, adjacent on the hull.
    hull = lower_hull_indices(pts)
    for k in np.flatnonzero((s.slow_iterations > 0) & (s.fast_iterations > 0)).tolist():
        assert hull.index(int(s.slow_index[k])) == hull.index(int(s.fast_index[k])) + 1
    assert s.finish_s <= WEEK_S
    # Independently recomputed cost of the schedule as written, idle GPUs included.
    cost = 0.0
    for k in range(s.starts_s.size):
        run_j = (
            s.fast_iterations[k] * pts[s.fast_index[k]].energy_j
            + s.slow_iterations[k] * pts[s.slow_index[k]].energy_j
        )
        idle_j = idle_w * (s.ends_s[k] - s.starts_s[k] - s.busy_s[k])
        cost += s.values[k] * (run_j + idle_j) / J_PER_KWH
    assert cost == pytest.approx(s.cost, rel=1e-9)
    # The saving against the no-slowdown plan run back to back from the start.
    assert s.baseline_cost is not None and s.cost < s.baseline_cost
    no_slow = frontier.cheapest_within(frontier.baseline.time_s)
    end = n * no_slow.time_s
    base = 0.0
    for h in range(HOURS):
        running = max(0.0, min(end, 3600.0 * (h + 1)) - 3600.0 * h)
        base += values[h] * (no_slow.avg_power_w * running + idle_w * (3600.0 - running))
    base /= J_PER_KWH
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
        ([0.0, 5.0], [1.0, -1e308], "row 2: value -1e.308 is not a finite number within"),
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


SIGNALS = Path(__file__).parent / "signals"  # real DE-LU day-ahead weeks; see README.md there
NEGATIVE_WEEK = "de_lu_2023-06-27_negative_prices.csv"
JUMP_WEEK = "de_lu_2024-12-09_price_jump.csv"


def _prices_per_kwh(name: str) -> list[float]:
    signal = read_signal(SIGNALS / name)
    assert signal.starts_s.tolist() == [3600.0 * h for h in range(HOURS)]
    assert signal.series[0].unit == "EUR/MWh"
    return signal.series[0].values_per_kwh.tolist()


@pytest.mark.parametrize("load", [0.5, 0.9])
@pytest.mark.parametrize("name", [NEGATIVE_WEEK, JUMP_WEEK])
def test_market_weeks_with_idle_power_match_the_independent_lp(
    frontier: Frontier, name: str, load: float
) -> None:
    values = _prices_per_kwh(name)
    if name == NEGATIVE_WEEK:
        assert sum(v < 0 for v in values) == 21
    idle_w = 60.0 * frontier.job.ranks  # the A100 preset's idle power, every GPU
    figures = _check(frontier, values, load, idle_w)
    assert figures["saving"] > 0


def test_idle_power_changes_the_answer_and_is_charged(frontier: Frontier) -> None:
    """A schedule that waits for cheap hours pays for the GPUs it holds meanwhile."""
    values = _prices_per_kwh(JUMP_WEEK)
    starts = [3600.0 * h for h in range(HOURS)]
    n = int(0.3 * WEEK_S / frontier.fastest.time_s)
    free = schedule_plans(frontier.points, starts, values, iterations=n, deadline_s=WEEK_S)
    idle_w = 60.0 * frontier.job.ranks
    held = schedule_plans(
        frontier.points, starts, values, iterations=n, deadline_s=WEEK_S, idle_power_w=idle_w
    )
    idle_cost = (
        float(np.dot(values, idle_w * (held.ends_s - held.starts_s - held.busy_s))) / J_PER_KWH
    )
    assert idle_cost > 0.2 * held.cost  # idle GPUs are a large share at 30 % load
    # The schedule made without idle power, charged for it, costs at least the one made with it.
    free_charged = (
        free.cost
        + float(np.dot(values, idle_w * (free.ends_s - free.starts_s - free.busy_s))) / J_PER_KWH
    )
    assert held.cost <= free_charged * (1 + 1e-9)
    assert held.lp_cost == pytest.approx(
        _reference_lp(frontier.points, starts, values, n, WEEK_S, idle_w), rel=1e-6
    )


def test_negative_hours_take_more_energy_and_a_free_hour_costs_nothing(frontier: Frontier) -> None:
    # The fastest plan draws the most energy (as on the 8-stage A100 frontier): the upper hull
    # is one vertex, and a full paid hour holds d / t_0 iterations, a float edge.
    # Times scaled so that the fastest is the 8x16 A100 frontier's (3.4480783125559453 s): at
    # that value d / (d / t_0) rounds below t_0.
    fastest = 3.4480783125559453
    scale = fastest / frontier.points[0].time_s
    pts = tuple(
        p.model_copy(update={"time_s": fastest if i == 0 else p.time_s * scale})
        for i, p in enumerate(frontier.points)
        if p.energy_j <= frontier.points[0].energy_j
    )
    t0 = fastest
    hour = 3600.0
    starts, values = [0.0, hour, 2 * hour], [0.2, -0.05, 0.0]
    for n in (int(hour / t0), int(1.5 * hour / t0)):  # within the paid hour's room, and beyond
        s = schedule_plans(pts, starts, values, iterations=n, deadline_s=3 * hour)
        ref = _reference_lp(pts, starts, values, n, 3 * hour)
        assert s.lp_cost == pytest.approx(ref, rel=1e-6, abs=1e-9)
        assert ref <= s.cost + 1e-9 * abs(s.cost)
        # Paid to consume: the negative hour runs every iteration it can, at the most energy.
        paid = int(s.interval_iterations[1])
        assert paid == min(n, math.floor(hour / t0))
        assert s.interval_iterations[0] == 0
        assert s.energy_j[1] >= paid * min(p.energy_j for p in pts)


def test_prices_near_the_float_limit_are_refused_in_one_line(frontier: Frontier) -> None:
    with pytest.raises(ConfigError, match=r"value 1e\+308 is not a finite number within") as e:
        schedule_plans(frontier.points, [0.0, 10.0], [1.0, 1e308], iterations=1, deadline_s=20.0)
    assert "\n" not in str(e.value)
    # The largest allowed value in magnitude computes without overflow.
    s = schedule_plans(
        frontier.points,
        [0.0, 10.0],
        [MAX_SIGNAL_VALUE, -MAX_SIGNAL_VALUE],
        iterations=1,
        deadline_s=20.0,
    )
    assert math.isfinite(s.cost) and math.isfinite(s.lp_cost)


def test_suggested_deadline_is_enough(frontier: Frontier) -> None:
    """The deadline the error suggests, passed back, fits N (it is rounded up, never down)."""
    pts = frontier.points
    t0 = frontier.fastest.time_s
    for n in (7, 1234567, 3000001):
        with pytest.raises(InfeasibleError, match="raise `deadline_s` to at least") as e:
            schedule_plans(pts, [0.0], [1.0], iterations=n, deadline_s=n * t0 * 0.5)
        suggested = float(str(e.value).rsplit(" ", 1)[-1])
        assert suggested >= n * t0
        schedule_plans(pts, [0.0], [1.0], iterations=n, deadline_s=suggested)


def test_replanning_from_a_later_time_keeps_the_rest(frontier: Frontier) -> None:
    """A re-plan from an interval's start with realised values plans only what is left."""
    values = _prices_per_kwh(JUMP_WEEK)
    starts = [3600.0 * h for h in range(HOURS)]
    n = int(0.5 * WEEK_S / frontier.fastest.time_s)
    s = schedule_plans(frontier.points, starts, values, iterations=n, deadline_s=WEEK_S)
    done = int(s.interval_iterations[:24].sum())
    realised = list(values)
    realised[24:48] = [v * 3 for v in values[24:48]]
    again = schedule_plans(
        frontier.points,
        starts,
        realised,
        iterations=n - done,
        deadline_s=WEEK_S,
        from_s=24 * 3600.0,
    )
    assert again.starts_s[0] == 24 * 3600.0 and again.starts_s.size == HOURS - 24
    assert int(again.interval_iterations.sum()) == n - done
    # The dearer day now runs less than it was scheduled to.
    assert again.interval_iterations[:24].sum() <= s.interval_iterations[24:48].sum()


def test_energy_between_spreads_each_interval_over_its_busy_and_idle_time(
    frontier: Frontier,
) -> None:
    """Over the whole horizon it is the schedule's energy; split anywhere, the parts add up;
    inside an interval's busy time it grows at the iterations' average power."""
    values = _prices_per_kwh(JUMP_WEEK)
    starts = [3600.0 * h for h in range(HOURS)]
    n = int(0.5 * WEEK_S / frontier.fastest.time_s)
    s = schedule_plans(
        frontier.points, starts, values, iterations=n, deadline_s=WEEK_S, idle_power_w=480.0
    )
    whole = s.energy_between(0.0, WEEK_S)
    np.testing.assert_allclose(whole, s.energy_j + s.idle_energy_j, rtol=1e-12)
    cut = 1e5 + 123.4
    np.testing.assert_allclose(
        s.energy_between(0.0, cut) + s.energy_between(cut, WEEK_S), whole, rtol=1e-12
    )
    k = int(s.used()[0])
    a = float(s.starts_s[k])
    part = s.energy_between(a, a + 0.5 * s.busy_s[k])
    assert part[k] == pytest.approx(0.5 * s.energy_j[k]) and part.sum() == part[k]
