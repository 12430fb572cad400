"""Intrinsic-bloat savings on the bundled real profiles beat the Perseus authors' planner."""

from __future__ import annotations

import pytest

from perseus.io import load_profile
from perseus.job import make_job
from perseus.solver import trace_frontier

# The authors' predicted saving (%) of the cheapest plan no slower than all-max, 1F1B, 8 stages.
AUTHORS = {("a100", 12): 15.2, ("a100", 24): 14.2, ("a40", 12): 11.8, ("a40", 24): 10.2}
POWER = {"a100": 83.64, "a40": 70.38}


@pytest.mark.slow
@pytest.mark.parametrize("profile,micro", sorted(AUTHORS))
def test_intrinsic_bloat_saving_beats_authors(profile, micro):
    job = make_job(load_profile(profile), "1f1b", 8, micro, blocking_power_w=POWER[profile])
    frontier = trace_frontier(job)
    base = job.evaluate(job.allmax())
    plan = frontier.cheapest_within(base.time_s)
    assert plan.time_s <= base.time_s + 1e-9
    ev = job.evaluate(job.flat(plan))
    assert (ev.time_s, ev.energy_j) == (plan.time_s, plan.energy_j)
    assert 100 * (1 - plan.energy_j / base.energy_j) >= AUTHORS[(profile, micro)]
