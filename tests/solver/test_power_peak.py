"""The fastest plan under a peak budget, against a brute force over every plan of small jobs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from perseus.errors import InfeasibleError
from perseus.job import PlanningJob
from perseus.schedule.actions import Kind
from perseus.solver import trace_frontier
from perseus.solver.lp_bound import lp_peak_time_bound_s
from perseus.solver.power import fastest_under_power, power_timeline, with_power
from perseus.solver.power_peak import fastest_under_peak
from tests.solver.conftest import small_job


def _every_plan(job: PlanningJob) -> list[tuple[float, float]]:
    """(time, peak) of every plan: every op at every clock."""
    freqs = sorted({o.freq_mhz for op in job.profile.ops.values() for o in op.options})
    every = []
    for combo in itertools.product(freqs, repeat=job.graph.num_nodes):
        point = job.point(np.array(combo, dtype=np.int64))
        every.append((point.time_s, float(power_timeline(job, point).power_w.max())))
    return every


@pytest.mark.parametrize(
    ("microbatches", "clocks", "seed"), [(2, 2, 0), (2, 2, 3), (1, 4, 0), (1, 4, 5), (2, 3, 0)]
)
def test_peak_pick_is_as_fast_as_a_brute_force_over_all_plans(
    microbatches: int, clocks: int, seed: int
) -> None:
    job = small_job(stages=2, microbatches=microbatches, clocks=clocks, seed=seed)
    frontier = with_power(job, trace_frontier(job))
    every = _every_plan(job)
    peaks = sorted(pk for _, pk in every)
    budgets = [peaks[len(peaks) // 10], peaks[len(peaks) // 2], peaks[9 * len(peaks) // 10]]
    for budget in budgets:
        brute = min(t for t, pk in every if pk <= budget * (1 + 1e-12))
        got = fastest_under_peak(job, frontier.points, budget)
        assert got.method == "exhaustive" and got.point.time_s <= brute * (1 + 1e-12)
        assert got.point.power is not None and got.point.power.peak_power_w <= budget * (1 + 1e-12)
        assert got.gap == 0
        # The search (for jobs too large to enumerate) fits, and is never slower than the
        # frontier's own pick.
        found = fastest_under_peak(job, frontier.points, budget, method="search")
        assert found.point.power is not None
        assert found.point.power.peak_power_w <= budget * (1 + 1e-12)
        if found.frontier_time_s is not None:
            assert found.point.time_s <= found.frontier_time_s
        assert found.bound_time_s <= brute * (1 + 1e-12)  # a true lower bound here


def test_below_every_plan_is_infeasible_naming_the_lowest() -> None:
    job = small_job(stages=2, microbatches=2, clocks=3, seed=1)
    frontier = with_power(job, trace_frontier(job))
    with pytest.raises(InfeasibleError, match="the lowest seen is"):
        fastest_under_peak(job, frontier.points, 1.0, method="search")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_bound_is_below_every_plan(seed: int) -> None:
    """The peak LP bounds every plan (brute force over every op at every clock) from below."""
    job = small_job(stages=2, microbatches=2, clocks=3, seed=seed)
    frontier = with_power(job, trace_frontier(job))
    every = _every_plan(job)
    peaks = sorted(pk for _, pk in every)
    for q in (1, 3, 5, 7):
        budget = peaks[q * len(peaks) // 10]
        brute = min(t for t, pk in every if pk <= budget * (1 + 1e-12))
        got = fastest_under_peak(job, frontier.points, budget, method="search")
        assert got.bound_time_s <= brute * (1 + 1e-9)
        # Fewer intervals (also what a cap on the LP's size gives a large job): still a bound.
        assert lp_peak_time_bound_s(job, budget, brute, intervals=16) <= brute * (1 + 1e-9)
        assert lp_peak_time_bound_s(job, budget, brute, max_time_vars=1) <= brute * (1 + 1e-9)


def test_search_bound_is_tighter_than_the_average_power_pick() -> None:
    """Where the peak binds, the bound lies above the frontier's fastest plan whose *average*
    power fits (the bound before it), and the gap it states shrinks."""
    job = small_job(stages=2, microbatches=2, clocks=3, seed=0)
    frontier = with_power(job, trace_frontier(job))
    peaks = sorted(pk for _, pk in _every_plan(job))
    for budget in (peaks[len(peaks) // 10], peaks[len(peaks) // 2]):
        got = fastest_under_peak(job, frontier.points, budget, method="search")
        average_s = fastest_under_power(frontier.points, budget).time_s
        assert got.bound_time_s > average_s * (1 + 1e-4)
        assert got.gap < got.point.time_s / average_s - 1


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_search_result_cannot_be_sped_up_by_raising_one_clock(share: float) -> None:
    """The search hill-climbs what peak shaving found: no single op one clock higher is both
    faster and within the budget (shaving alone leaves such ops behind)."""
    job = small_job(stages=3, microbatches=4, clocks=4, seed=2)
    frontier = with_power(job, trace_frontier(job))
    peaks = sorted(p.power.peak_power_w for p in frontier.points if p.power is not None)
    budget = peaks[int(share * len(peaks))]
    got = fastest_under_peak(job, frontier.points, budget, method="search")
    flat = job.flat(got.point)
    assert isinstance(flat, np.ndarray)
    for node in range(flat.size):
        options = job.profile.op(int(job.graph.stage[node]), list(Kind)[int(job.graph.kind[node])])
        higher = sorted(o.freq_mhz for o in options.options if o.freq_mhz > flat[node])
        if not higher:
            continue
        trial = flat.copy()
        trial[node] = higher[0]
        point = job.point(trial)
        if point.time_s < got.point.time_s * (1 - 1e-12):
            assert power_timeline(job, point).power_w.max() > budget * (1 + 1e-12)
