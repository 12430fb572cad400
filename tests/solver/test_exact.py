"""The frontier against true optima (MILP, brute force) and the LP floor on tiny jobs."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.errors import InfeasibleError
from perseus.solver import trace
from perseus.solver.lp_bound import lp_energy_floor_j

from .conftest import small_job
from .oracles.milp import brute_force_energy_j, optimal_energy_j

# (schedule, stages, microbatches, clocks, seed): all ≤ 12 ops and ≤ 5 clocks.
TINY = [
    ("1f1b", 2, 3, 5, 0),
    ("1f1b", 3, 2, 4, 1),
    ("gpipe", 2, 3, 5, 2),
    ("1f1b", 2, 3, 5, 3),
    ("gpipe", 3, 2, 5, 4),
    ("1f1b", 3, 2, 5, 5),
]


def _frontier_value(points, deadline):
    feasible = [p.energy_j for p in points if p.time_s <= deadline * (1 + 1e-12)]
    return min(feasible)


def test_milp_agrees_with_brute_force():
    job = small_job("1f1b", 2, 2, clocks=4, seed=7)  # 8 ops, 4^8 plans
    base = job.evaluate(job.allmax()).time_s
    for factor in (1.0, 1.1, 1.3):
        assert optimal_energy_j(job, base * factor) == pytest.approx(
            brute_force_energy_j(job, base * factor), rel=1e-7
        )


@pytest.mark.parametrize("case", TINY, ids=[f"{c[0]}-{c[1]}x{c[2]}-s{c[4]}" for c in TINY])
def test_frontier_is_near_optimal(case):
    schedule, stages, microbatches, clocks, seed = case
    job = small_job(schedule, stages, microbatches, clocks=clocks, seed=seed)
    assert job.graph.num_nodes <= 12
    result = trace(job, all_points=True, hull_gap_fraction=0.0)
    pts = result.frontier.points
    lo, hi = pts[0].time_s, pts[-1].time_s
    gaps = []
    for deadline in np.linspace(lo, hi * 1.02, 25):
        best = optimal_energy_j(job, deadline)
        ours = _frontier_value(pts, deadline)
        assert ours >= best * (1 - 1e-9)  # nothing beats the optimum
        gaps.append(ours / best - 1)
    assert max(gaps) <= 5e-3
    assert float(np.mean(gaps)) <= 1e-3


def test_optimum_fastest_time_is_reached():
    job = small_job("1f1b", 2, 3, seed=9)
    pts = trace(job).frontier.points
    with pytest.raises(InfeasibleError):
        optimal_energy_j(job, pts[0].time_s * (1 - 1e-3))


@pytest.mark.parametrize("seed", [0, 1])
def test_lp_floor_matches_the_traced_relaxation(seed):
    job = small_job("1f1b", 3, 4, seed=seed)
    result = trace(job, hull_gap_fraction=0.0)
    for deadline in np.linspace(result.lp_time_s[-1], result.lp_time_s[0], 6):
        highs = lp_energy_floor_j(job, deadline)
        assert result.lp_floor_j(deadline) == pytest.approx(highs, rel=1e-6)
        assert highs <= optimal_energy_j(job, deadline) * (1 + 1e-9)
