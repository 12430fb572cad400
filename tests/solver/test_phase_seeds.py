"""A frontier of more phases per op holds the plans of one phase fewer (it contains them), so
none of its points is worse than that frontier's at the same time (``--all-points``)."""

from __future__ import annotations

import bisect

import pytest

from perseus.io import load_profile
from perseus.job import make_job
from perseus.solver import trace

POWER = {"a100": 83.64, "a40": 70.38}


def _beaten(fewer, more):
    """The points of ``fewer`` that no point of ``more`` as fast matches in energy."""
    pts = sorted((p.time_s, p.energy_j) for p in more.points)
    times, best, low = [t for t, _ in pts], [], float("inf")
    for _, e in pts:
        low = min(low, e)
        best.append(low)
    out = []
    for p in fewer.points:
        i = bisect.bisect_right(times, p.time_s * (1 + 1e-12)) - 1
        if i < 0 or best[i] > p.energy_j * (1 + 1e-9):
            out.append((p.time_s, p.energy_j, best[i] if i >= 0 else None))
    return out


@pytest.mark.parametrize(
    ("name", "microbatches", "fewer", "more"),
    # Before, the two-clock frontier lost to one clock at 2.841521 s (6145.688 J against
    # 6145.029 J), and three phases to two at 750 of 1292 points (by up to 0.29 %).
    [("a100", 12, 1, 2), ("a40", 8, 2, 3)],
)
def test_more_phases_are_never_worse_than_fewer(name, microbatches, fewer, more):
    job = make_job(
        load_profile(name),
        "1f1b",
        8,
        microbatches,
        blocking_power_w=POWER[name],
        layers_per_stage=[12],
    )
    few = trace(job, all_points=True, max_clocks_per_op=fewer).frontier
    many = trace(job, all_points=True, max_clocks_per_op=more).frontier
    assert _beaten(few, many) == []
