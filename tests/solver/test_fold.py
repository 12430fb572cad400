"""Folding long jobs: the lift map, period balancing, speed-ups, and the folded frontier."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.solver import frontier, trace, walk
from perseus.solver.cost_model import build_cost_model
from perseus.solver.fold import (
    FOLD_EXTRA_MICROBATCHES,
    balance_periods,
    fold_job,
    lift_map,
    lift_plans,
    period_times_s,
)
from perseus.solver.paths import build_topology
from perseus.solver.plan_kernels import tighten_kernel
from perseus.solver.walk import Lifter, pareto_within

from .conftest import small_job

FOLDING = [("1f1b", 1, 2), ("interleaved", 2, 8), ("zb", 1, 3)]


@pytest.mark.parametrize("schedule,virtual,period", FOLDING, ids=[c[0] for c in FOLDING])
def test_lift_map_copies_ops_of_the_same_rank_stage_and_kind(schedule, virtual, period):
    job = small_job(schedule, 4, 40, virtual_stages=virtual)
    folded = fold_job(job, build_cost_model(job), 0.0)
    assert folded is not None
    assert folded.job.spec.microbatches == 4 + FOLD_EXTRA_MICROBATCHES
    full, small, node_map = job.graph, folded.job.graph, folded.lift.node_map
    assert np.array_equal(small.rank[node_map], full.rank)
    assert np.array_equal(small.stage[node_map], full.stage)
    assert np.array_equal(small.kind[node_map], full.kind)
    assert all(len(p) == period for p in folded.lift.periods)
    # Every folded op is used, and the ends of each rank's sequence are copied in order.
    assert set(node_map.tolist()) == set(range(small.num_nodes))
    for r in range(full.num_ranks):
        lo, hi = full.rank_start[r], full.rank_start[r + 1]
        s_lo, s_hi = small.rank_start[r], small.rank_start[r + 1]
        assert node_map[lo] == s_lo and node_map[hi - 1] == s_hi - 1
        assert not folded.lift.middle[lo] and not folded.lift.middle[hi - 1]


def test_jobs_that_do_not_fold_are_walked_whole():
    short = small_job("1f1b", 4, 4 + FOLD_EXTRA_MICROBATCHES)
    assert fold_job(short, build_cost_model(short), 0.0) is None
    # GPipe's middle (the switch from forwards to backwards) is not periodic.
    gpipe = small_job("gpipe", 4, 40)
    assert fold_job(gpipe, build_cost_model(gpipe), 0.0) is None
    result = trace(gpipe, fold=True)
    assert result.folded_microbatches is None and result.complete
    # Different stage counts never map.
    assert lift_map(small_job("1f1b", 4, 40).graph, small_job("1f1b", 3, 40).graph) is None


def test_the_folded_job_is_the_same_job_with_fewer_microbatches():
    """Every field of the job's spec is kept (a two-clock job with a non-default switch stall
    was folded with the default one, its options no longer matched, and it was walked whole)."""
    from .conftest import noisy_profile

    job = make_job(
        noisy_profile(4, 5, 0),
        "1f1b",
        4,
        40,
        blocking_power_w=80.0,
        p2p_latency_s=1e-4,
        layers_per_stage=4,
        switch_latency_s=0.002,
        switch_energy_j=0.5,
        switch_stall_s=0.0007,
        profile_name="noisy",
    )
    folded = fold_job(job, build_cost_model(job, 0.0, 2), 0.0, 2)
    assert folded is not None
    full, small = job.spec.model_dump(), folded.job.spec.model_dump()
    assert {k: v for k, v in small.items() if v != full[k]} == {
        "microbatches": 4 + FOLD_EXTRA_MICROBATCHES
    }


def test_balance_periods_caps_every_period_and_only_speeds_up():
    job = small_job("1f1b", 4, 40, clocks=6)
    folded = fold_job(job, build_cost_model(job), 0.0)
    assert folded is not None
    model, periods = folded.model, folded.lift.periods
    types = model.node_type
    slowest = model.num_opts[types] - 1
    fastest = period_times_s(np.zeros_like(types), periods, types, model.opt_time_s)
    before = period_times_s(slowest, periods, types, model.opt_time_s)
    limits = (fastest + before) / 2
    out = balance_periods(slowest, periods, limits, types, model.opt_time_s, model.opt_cost_j)
    after = period_times_s(out, periods, types, model.opt_time_s)
    assert np.all(after <= limits * (1 + 1e-12))
    assert np.all(out <= slowest) and np.any(out < slowest)
    untouched = np.setdiff1d(np.arange(types.size), np.concatenate(periods))
    assert np.array_equal(out[untouched], slowest[untouched])


def test_tighten_meets_each_target_without_slowing_any_op():
    job = small_job("1f1b", 4, 12, clocks=6, seed=3)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    types = model.node_type
    rng = np.random.default_rng(0)
    plans = rng.integers(0, model.num_opts[types], size=(20, types.size))
    allmax_s = float(topo.forward(model.opt_time_s[types, 0])[1].max())
    targets = allmax_s * rng.uniform(1.0, 1.3, size=20)
    out = tighten_kernel(topo.csr(), types, model.opt_time_s, plans, targets)
    assert np.all(out <= plans)
    for row, target in zip(out, targets, strict=True):
        assert topo.forward(model.opt_time_s[types, row])[1].max() <= target * (1 + 1e-12)


@pytest.mark.slow
def test_folded_frontier_is_exact_and_close_to_the_full_walk():
    job = make_job(load_profile("a100"), "1f1b", 8, 48, blocking_power_w=83.64)
    folded = trace(job, fold=True)
    whole = trace(job, fold=False)
    assert folded.folded_microbatches == 8 + FOLD_EXTRA_MICROBATCHES
    assert whole.folded_microbatches is None
    fastest_s = whole.frontier.points[0].time_s
    with pytest.raises(ConfigError, match="folded"):
        folded.lp_floor_j(fastest_s)
    assert whole.lp_floor_j(fastest_s) > 0
    points = folded.frontier.points
    for p in points:
        ev = job.evaluate(job.flat(p))
        assert (p.time_s, p.energy_j) == (ev.time_s, ev.energy_j)
    assert all(
        a.time_s < b.time_s and a.energy_j > b.energy_j for a, b in itertools.pairwise(points)
    )
    base = folded.frontier.baseline
    assert points[0].time_s <= base.time_s + 1e-9 and points[0].energy_j <= base.energy_j
    # The point users run at: the cheapest plan no slower than all-max.
    saving = 1 - folded.frontier.cheapest_within(base.time_s).energy_j / base.energy_j
    exact = 1 - whole.frontier.cheapest_within(base.time_s).energy_j / base.energy_j
    assert saving >= exact - 0.003, (saving, exact)


def test_plans_lifted_as_they_come_are_the_batches_lifted_at_the_end():
    job = small_job("1f1b", 3, 30)
    model = build_cost_model(job, 0.02, 1)
    folded = fold_job(job, model, 0.02, 1)
    assert folded is not None
    topo = build_topology(job.graph)
    allmax_s = float(job.evaluate(job.allmax()).time_s)
    rng = np.random.default_rng(0)
    small_types = folded.model.node_type
    plans = [
        rng.integers(0, folded.model.num_opts[small_types]).astype(np.int64) for _ in range(75)
    ]
    size = walk._LIFT_BATCH
    with ThreadPoolExecutor(max_workers=1) as lane, ThreadPoolExecutor(max_workers=2) as pool:
        lifter = Lifter(job, model, topo, folded, allmax_s, (lane, pool))
        streamed = [c for lo in range(0, 75, 7) for c in lifter(plans[lo : lo + 7])]
        streamed += lifter.flush()
        assert lifter.flush() == []
    # Full batches in order, then what is left in two halves (the first the larger).
    full = 75 // size * size
    half = full + (75 - full + 1) // 2
    bounds = [*range(0, full + 1, size), half, 75]
    at_end = [
        c
        for lo, hi in itertools.pairwise(bounds)
        for c in pareto_within(
            job, model, topo, lift_plans(folded, plans[lo:hi], model, topo, allmax_s)
        )
    ]
    assert len(streamed) == len(at_end) > 0
    assert all(np.array_equal(a, b) for a, b in zip(streamed, at_end, strict=True))


def test_jobs_above_the_threshold_fold_by_default(monkeypatch):
    job = small_job("1f1b", 3, 30)
    assert trace(job).folded_microbatches is None
    monkeypatch.setattr(frontier, "FOLD_ABOVE_OPS", job.graph.num_nodes - 1)
    assert trace(job).folded_microbatches == 3 + FOLD_EXTRA_MICROBATCHES
    assert trace(job, fold=False).folded_microbatches is None
