"""The Pareto local search that fills gaps between rounded frontier points."""

from __future__ import annotations

import numpy as np

from perseus.dag.evaluate import evaluate_many
from perseus.solver.cost_model import build_cost_model
from perseus.solver.pareto_search import search_neighbours
from perseus.solver.paths import build_topology

from .conftest import small_job


def _exact(job, model, plans):
    types = model.node_type
    return evaluate_many(
        job.graph,
        model.opt_time_s[types, plans],
        model.opt_energy_j[types, plans],
        model.blocking_power_w,
    )


def test_search_keeps_a_strict_pareto_set_that_dominates_its_input():
    job = small_job("1f1b", 3, 4, clocks=5, seed=2)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    types = model.node_type
    rng = np.random.default_rng(1)
    start = rng.integers(0, model.num_opts[types], size=(12, types.size))
    found = search_neighbours(model, topo, job.graph.num_ranks, start)
    t_in, e_in = _exact(job, model, start)
    t_out, e_out = _exact(job, model, found)
    assert np.all(np.diff(t_out) > 0) and np.all(np.diff(e_out) < 0)
    for t, e in zip(t_in, e_in, strict=True):
        ok = t_out <= t * (1 + 1e-12)
        assert ok.any() and e_out[ok].min() <= e * (1 + 1e-12)
    # It found plans the random start did not have, and options stay in range.
    assert len(found) > len(set(map(tuple, start.tolist())) & set(map(tuple, found.tolist())))
    assert np.all((found >= 0) & (found < model.num_opts[types]))


def test_search_reaches_a_plan_two_option_steps_away():
    # From the all-fastest plan alone, the search walks to slower, cheaper plans step by step.
    job = small_job("1f1b", 2, 3, clocks=4, seed=5)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    fastest = np.zeros((1, job.graph.num_nodes), dtype=np.int64)
    found = search_neighbours(model, topo, job.graph.num_ranks, fastest)
    steps = (found - fastest).sum(axis=1)
    assert steps.max() >= 2
    _, e_out = _exact(job, model, found)
    _, e_fast = _exact(job, model, fastest)
    assert e_out.min() < e_fast[0]


def test_no_round_runs_beyond_the_budget():
    job = small_job("1f1b", 3, 4, clocks=5, seed=2)
    model = build_cost_model(job)
    topo = build_topology(job.graph)
    plans = np.zeros((3, job.graph.num_nodes), dtype=np.int64)
    plans[1] += 1
    plans[2] += 2
    found = search_neighbours(model, topo, job.graph.num_ranks, plans, work_budget=0.0)
    assert {tuple(r) for r in found.tolist()} <= {tuple(r) for r in plans.tolist()}
