"""The power of a plan over its iteration, and the fastest plan under a power budget."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest

from perseus.errors import InfeasibleError, PlanError
from perseus.io.frontier_files import read_frontier, write_frontier
from perseus.job import PlanningJob
from perseus.plan import Frontier, PlanPoint, PointPower, points_sha256
from perseus.solver import trace_frontier
from perseus.solver.power import fastest_under_power, plan_power, power_timeline, with_power
from tests.solver.conftest import small_job


def _reference_power_w(job: PlanningJob, point: PlanPoint, t: float) -> float:
    """Summed power at instant ``t``, rank by rank, from the evaluator's op intervals."""
    freqs = job.flat(point)
    op_t, op_e = job.op_costs(freqs)
    ev = job.evaluate(freqs)
    total = 0.0
    for r in range(job.graph.num_ranks):
        lo, hi = int(job.graph.rank_start[r]), int(job.graph.rank_start[r + 1])
        running = [i for i in range(lo, hi) if ev.start_s[i] <= t < ev.end_s[i] and op_t[i] > 0]
        total += op_e[running[0]] / op_t[running[0]] if running else job.blocking_power_w
    return total


@pytest.fixture(scope="module", params=[("1f1b", 1), ("zb", 1), ("interleaved", 2)])
def job_and_frontier(request: pytest.FixtureRequest) -> tuple[PlanningJob, Frontier]:
    schedule, virtual = request.param
    job = small_job(schedule, stages=4 if virtual == 2 else 3, microbatches=4, seed=3,
                    virtual_stages=virtual)  # fmt: skip
    return job, trace_frontier(job)


def test_timeline_integral_is_the_exact_energy_and_matches_a_pointwise_reference(
    job_and_frontier: tuple[PlanningJob, Frontier],
) -> None:
    job, frontier = job_and_frontier
    for point in (
        frontier.fastest,
        frontier.points[len(frontier.points) // 2],
        frontier.min_energy,
    ):
        tl = power_timeline(job, point)
        assert tl.times_s[0] == 0 and tl.times_s[-1] == pytest.approx(point.time_s)
        assert np.all(np.diff(tl.times_s) > 0)
        assert tl.energy_j == pytest.approx(point.energy_j, rel=1e-9)
        # Each step equals the summed power at its midpoint, computed rank by rank.
        mids = (tl.times_s[:-1] + tl.times_s[1:]) / 2
        ref = [_reference_power_w(job, point, float(t)) for t in mids]
        assert np.allclose(tl.power_w, ref, rtol=1e-9)
        summary = plan_power(job, point)
        assert summary.peak_power_w == pytest.approx(max(ref))
        assert summary.min_power_w == pytest.approx(min(ref))
        steps = [abs(b - a) for a, b in itertools.pairwise(ref)]
        assert summary.max_step_w == pytest.approx(max(steps))
        assert summary.avg_power_w == pytest.approx(point.energy_j / point.time_s)


def test_idle_ranks_draw_blocking_power_so_the_floor_is_known() -> None:
    job = small_job("gpipe", stages=3, microbatches=1, seed=1, power_w=50.0)
    point = job.point(job.allmax())
    tl = power_timeline(job, point)
    # One microbatch through three stages: at most one rank computes at a time, the other two
    # wait at blocking power.
    op_t, op_e = job.op_costs(job.flat(point))
    assert tl.power_w.max() == pytest.approx(float((op_e / op_t).max()) + 2 * 50.0)
    assert tl.power_w.min() >= 3 * 50.0 - 1e-9


def test_frontier_with_power_round_trips_as_schema_3(
    tmp_path, job_and_frontier: tuple[PlanningJob, Frontier]
) -> None:
    job, frontier = job_and_frontier
    powered = with_power(job, frontier)
    path = tmp_path / "f.json"
    write_frontier(powered, path)
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 3
    back = read_frontier(path)
    assert back.points == powered.points
    assert all(p.power is not None for p in back.points)
    # The frontier's points are priced together; each gets what it gets alone.
    assert [p.power for p in powered.points] == [plan_power(job, p) for p in frontier.points]


def test_old_files_without_power_still_read_and_digest_as_before(tmp_path) -> None:
    job = small_job(seed=2)
    frontier = trace_frontier(job)
    point = frontier.fastest.model_dump(mode="json")
    point.pop("power")
    # The digest a schema-2 writer computed: the point without any power key.
    text = json.dumps([point], sort_keys=True, separators=(",", ":"))
    old_digest = hashlib.sha256(text.encode()).hexdigest()
    assert points_sha256([frontier.fastest]) == old_digest
    doc = frontier.with_points([frontier.fastest]).model_dump(mode="json")
    doc["points"] = [point]
    doc.update(schema_version=2, points_sha256=old_digest)
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(doc))
    assert read_frontier(path).points[0].power is None
    # A schema-2 file cannot carry power figures.
    point["power"] = plan_power(job, frontier.fastest).model_dump()
    doc["points"] = [point]
    doc["points_sha256"] = None
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="schema_version 3"):
        read_frontier(path)


def test_power_figures_are_checked_against_the_point() -> None:
    job = small_job(seed=2)
    p = job.point(job.allmax())
    good = plan_power(job, p)
    with pytest.raises(ValueError, match="energy_j / time_s"):
        p.model_copy(update={"power": None}).model_validate(
            {**p.model_dump(), "power": {**good.model_dump(), "avg_power_w": good.avg_power_w * 2,
                                         "peak_power_w": good.peak_power_w * 2}}
        )  # fmt: skip
    with pytest.raises(ValueError, match="out of order"):
        PointPower(avg_power_w=10, peak_power_w=5, min_power_w=1, max_step_w=0)


def test_fastest_under_power_average_and_peak(job_and_frontier) -> None:
    job, frontier = job_and_frontier
    pts = with_power(job, frontier).points
    for budget in np.linspace(min(p.avg_power_w for p in pts), max(p.avg_power_w for p in pts), 7):
        got = fastest_under_power(pts, float(budget))
        assert got.avg_power_w <= budget * (1 + 1e-12)
        # No faster point fits.
        assert all(p.avg_power_w > budget for p in pts if p.time_s < got.time_s)
    peak_budget = float(np.median([p.power.peak_power_w for p in pts if p.power]))
    got = fastest_under_power(pts, peak_budget, measure="peak")
    assert got.power is not None and got.power.peak_power_w <= peak_budget
    assert all(
        p.power is not None and p.power.peak_power_w > peak_budget
        for p in pts
        if p.time_s < got.time_s
    )


def test_unreachable_budget_names_the_lowest_figure(job_and_frontier) -> None:
    _job, frontier = job_and_frontier
    lowest = min(p.avg_power_w for p in frontier.points)
    with pytest.raises(InfeasibleError, match=f"lowest any plan reaches is {lowest:.6g} W"):
        fastest_under_power(frontier.points, lowest * 0.9)
    with pytest.raises(PlanError, match="no peak power"):
        fastest_under_power(frontier.points, 1e6, measure="peak")  # no power figures yet


def test_time_share_is_the_fastest_mix_of_any_two_plans_under_an_average_cap(
    job_and_frontier,
) -> None:
    """Against every pair of plans (brute force): no mix meeting the budget is faster."""
    from perseus.solver.power import time_share_under_power

    _, frontier = job_and_frontier
    pts = frontier.points
    powers = sorted(p.avg_power_w for p in pts)
    for budget in np.linspace(powers[0], powers[-1], 9)[1:-1]:
        single = fastest_under_power(pts, float(budget)).time_s
        mix = time_share_under_power(pts, float(budget))
        best = single
        for a in pts:
            for b in pts:
                # The largest share of a (faster, above budget) with b keeping the mean power.
                over_a = a.energy_j - budget * a.time_s
                over_b = b.energy_j - budget * b.time_s
                if over_a > 0 >= over_b:
                    x = -over_b / (over_a - over_b)
                    best = min(best, x * a.time_s + (1 - x) * b.time_s)
        got = mix.mean_time_s if mix is not None else single
        assert got <= best * (1 + 1e-12)
        assert got == pytest.approx(best, rel=1e-12)
        if mix is not None:
            assert mix.avg_power_w == pytest.approx(float(budget), rel=1e-12)
