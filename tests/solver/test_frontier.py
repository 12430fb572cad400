"""Invariants of trace_frontier on every schedule the core supports."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.solver import baseline_plans, global_clock_plans, trace, trace_frontier
from perseus.solver.lp_bound import lp_energy_floor_j

from .conftest import small_job

CASES = [
    ("gpipe", 3, 4, 1),
    ("1f1b", 4, 6, 1),
    ("interleaved", 4, 4, 2),
    ("zb", 3, 5, 1),
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def traced(request):
    schedule, stages, microbatches, virtual = request.param
    job = small_job(schedule, stages, microbatches, seed=11, virtual_stages=virtual)
    return job, trace(job)


def test_points_are_exact(traced):
    job, result = traced
    for p in result.frontier.points:
        ev = job.evaluate(job.flat(p))
        assert p.time_s == ev.time_s
        assert p.energy_j == ev.energy_j


def test_points_are_strictly_pareto(traced):
    _, result = traced
    pts = result.frontier.points
    times = np.array([p.time_s for p in pts])
    energies = np.array([p.energy_j for p in pts])
    assert np.all(np.diff(times) > 0)
    assert np.all(np.diff(energies) < 0)


def test_fastest_point_beats_all_max(traced):
    job, result = traced
    base = job.evaluate(job.allmax())
    fastest = result.frontier.fastest
    assert fastest.time_s <= base.time_s + 1e-9
    assert fastest.energy_j <= base.energy_j


def test_min_energy_beats_every_baseline(traced):
    job, result = traced
    best = result.frontier.min_energy.energy_j
    assert best <= min(p.energy_j for p in global_clock_plans(job))
    for name, plan in baseline_plans(job).items():
        within = result.frontier.cheapest_within(plan.time_s)
        assert within.energy_j <= plan.energy_j, name


def test_lp_floor_is_below_every_point(traced):
    job, result = traced
    pts = result.frontier.points
    for p in (pts[0], pts[len(pts) // 2], pts[-1]):
        assert lp_energy_floor_j(job, p.time_s) <= p.energy_j * (1 + 1e-9)


def test_baselines_have_the_promised_names_and_are_exact(traced):
    job, _ = traced
    plans = baseline_plans(job)
    assert set(plans) == {"all-max", "global-clock", "per-stage", "envpipe"}
    for p in plans.values():
        ev = job.evaluate(job.flat(p))
        assert (p.time_s, p.energy_j) == (ev.time_s, ev.energy_j)
    base = job.evaluate(job.allmax())
    assert plans["envpipe"].time_s <= base.time_s + 1e-9
    assert plans["envpipe"].energy_j <= base.energy_j


def test_a_gap_fraction_between_0_and_the_floor_is_refused():
    # Each decade below 1e-6 cost ~8x the time for under 1 % more points (1e-12: hours).
    job = small_job("1f1b", 2, 4, seed=2)
    with pytest.raises(ConfigError, match=r"1e-07 would sample .* use 0 .* or at least 1e-06"):
        trace_frontier(job, min_gap_fraction=1e-7)


def test_gap_thinning_keeps_both_ends():
    job = small_job("1f1b", 4, 8, seed=2)
    full = trace_frontier(job, all_points=True)
    thin = trace_frontier(job, min_gap_fraction=0.02)
    assert len(thin.points) <= len(full.points)
    assert thin.fastest.time_s == pytest.approx(full.fastest.time_s, rel=1e-12)
    # Thinning samples fewer candidates, so its cheapest end may differ slightly.
    assert thin.min_energy.energy_j == pytest.approx(full.min_energy.energy_j, rel=5e-3)
    assert thin.points[-1] == thin.min_energy
    times = [p.time_s for p in thin.points]
    gaps = np.diff(times[:-1])
    assert np.all(gaps >= 0.02 * times[0] * (1 - 1e-9))


def _same_search(job):
    thin, full = trace_frontier(job), trace_frontier(job, all_points=True)
    kept = {(p.time_s, p.energy_j) for p in full.points}
    assert {(p.time_s, p.energy_j) for p in thin.points} <= kept
    assert len(thin.points) <= len(full.points)
    no_slowdown = [f.cheapest_within(f.baseline.time_s) for f in (thin, full)]
    assert no_slowdown[0] == no_slowdown[1]


@pytest.mark.parametrize("seed", [0, 5])
def test_keeping_every_point_does_not_change_the_search(seed):
    # all_points only stops thinning the output: every thinned point is one of its points.
    _same_search(small_job("1f1b", 4, 8, clocks=8, seed=seed))


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "blocking_power_w"), [("a100", 83.64), ("a40", 70.38)])
def test_keeping_every_point_keeps_the_bundled_no_slowdown_plan(profile, blocking_power_w):
    # 8x12 at no slowdown: A100 15.913 %, A40 12.147 %, by default and with every point kept.
    from perseus.io import load_profile
    from perseus.job import make_job

    job = make_job(load_profile(profile), "1f1b", 8, 12, blocking_power_w=blocking_power_w)
    _same_search(job)


def test_progress_is_reported_up_to_one():
    seen: list[float] = []
    trace_frontier(small_job(seed=4), progress=seen.append)
    assert seen and seen[-1] == 1.0
    assert all(0.0 <= x <= 1.0 for x in seen)
    assert seen == sorted(seen)


def test_input_job_is_not_mutated():
    job = small_job(seed=6)
    before = (job.graph.edge_src.copy(), job.allmax().copy(), job.spec)
    trace_frontier(job)
    assert np.array_equal(before[0], job.graph.edge_src)
    assert np.array_equal(before[1], job.allmax())
    assert before[2] == job.spec


@pytest.mark.parametrize("kwargs", [{"time_quantum_s": 0.0}, {"min_gap_fraction": -1.0}])
def test_bad_arguments_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        trace_frontier(small_job(), **kwargs)


def test_bad_hull_gap_raises_config_error():
    with pytest.raises(ConfigError):
        trace(small_job(), hull_gap_fraction=1.5)


def test_zero_blocking_power_still_works():
    job = small_job(seed=8, power_w=0.0)
    f = trace_frontier(job)
    assert f.fastest.time_s <= job.evaluate(job.allmax()).time_s + 1e-9


def test_thinning_keeps_the_no_slowdown_plan():
    # However coarse the spacing, the cheapest plan within the all-max time survives it. (The
    # all-max time is taken at the dense frontier's third point, so that point is the anchor.)
    from perseus.solver import frontier as frontier_module
    from perseus.solver.cost_model import build_cost_model
    from perseus.solver.paths import build_topology

    job = small_job("1f1b", 4, 6, seed=11)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    dense = trace(job, all_points=True).frontier
    assert len(dense.points) > 4
    cand = [frontier_module._to_options(job, model, job.flat(p)) for p in dense.points]
    anchor = dense.points[2]
    for gap_s in (0.0, 0.01 * anchor.time_s, anchor.time_s):
        points = frontier_module._select(job, model, topo, cand, gap_s, anchor.time_s)
        assert anchor in points
        assert points[0] == dense.points[0] and points[-1] == dense.points[-1]
    assert len(frontier_module._select(job, model, topo, cand, anchor.time_s, anchor.time_s)) == 3


@pytest.mark.parametrize("method", ["compiled", "reference"])  # the tests' numpy oracle
def test_every_walk_returns_reclaimed_candidates(method):
    # The final selection does not reclaim again, so every walk must hand over plans that
    # reclaiming leaves as they are.
    from perseus.solver.cost_model import build_cost_model
    from perseus.solver.paths import build_topology
    from perseus.solver.reclaim import reclaim_slack
    from perseus.solver.walk import METHODS, core_of

    from .oracles.reference_walk import walk_chunk

    job = small_job("1f1b", 4, 6, seed=11)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    allmax_s = float(job.evaluate(job.allmax()).time_s)
    walk = (job, model, topo, 1e-9 * allmax_s, 0.0, 1e-3 * allmax_s, False, None, None)
    core = METHODS["compiled"] if method == "compiled" else core_of(walk_chunk)
    cand, *_ = core(*walk)
    rows = np.stack(cand)
    assert len(rows) > 2
    assert np.array_equal(reclaim_slack(model, topo, rows), rows)
