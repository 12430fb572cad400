from __future__ import annotations

import numpy as np

from perseus.profile import pareto_options
from perseus.schedule import Kind
from perseus.solver.cost_model import build_cost_model, lower_hull

from .conftest import small_job


def test_lower_hull_drops_points_above_the_chords():
    t = np.array([1.0, 2.0, 3.0, 4.0])
    c = np.array([10.0, 9.0, 5.0, 4.5])  # (2, 9) lies above the chord from (1, 10) to (3, 5)
    assert lower_hull(t, c).tolist() == [0, 2, 3]


def test_hull_is_convex_and_made_of_pareto_options():
    job = small_job(seed=3)
    model = build_cost_model(job)
    for k in range(model.num_hull.size):
        h = int(model.num_hull[k])
        slopes = model.hull_slope[k, : h - 1]
        assert np.all(slopes > 0)
        assert np.all(np.diff(slopes) <= 1e-12)  # convex: savings per second shrink
        opts = set(model.opt_time_s[k, : model.num_opts[k]].tolist())
        assert set(model.hull_time_s[k, :h].tolist()) <= opts


def test_options_are_the_pareto_set():
    job = small_job(seed=5)
    model = build_cost_model(job)
    stage, kind = int(job.graph.stage[0]), Kind.F
    expected = pareto_options(job.profile.op(stage, kind).options, job.blocking_power_w)
    k = int(model.node_type[0])
    got = model.opt_freq_mhz[k, : model.num_opts[k]].tolist()
    assert got == [o.freq_mhz for o in expected]
