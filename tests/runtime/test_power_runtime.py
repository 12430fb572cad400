"""PowerRuntime: a schedule followed by iteration, a cap read from the store (no process group:
the decision is pure, the all-reduce is the identity)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from perseus.errors import ConfigError, PlanError
from perseus.io import load_profile
from perseus.io.power_files import schedule_document
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.emulation import take_stages
from perseus.runtime.power import PowerRuntime, clear_cap, read_cap, read_cap_ack, set_cap
from perseus.runtime.straggler.switching import DECISIONS_KEPT
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import lower_hull_indices, schedule_plans

torch_dist = pytest.importorskip("torch.distributed")


@dataclass(frozen=True)
class _Stats:
    iteration: int
    point_index: int
    phase: str = "run"


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    job = make_job(take_stages(load_profile("a100"), 4), "1f1b", 4, 4, blocking_power_w=83.64)
    return trace_frontier(job)


def _three_interval_schedule(frontier: Frontier):  # type: ignore[no-untyped-def]
    pts = frontier.points
    hull = lower_hull_indices(pts)
    order = (hull[len(hull) // 2], hull[-1], hull[0])
    lengths = [3 * pts[i].time_s * (1 + 1e-6) for i in order]
    starts = [0.0, lengths[0], lengths[0] + lengths[1]]
    s = schedule_plans(pts, starts, [3.0, 1.0, 2.0], iterations=9, deadline_s=sum(lengths))
    return schedule_document(s, frontier), order


def _run(rt: PowerRuntime, first_point: int, iterations: int, before=None) -> list[int]:  # type: ignore[no-untyped-def]
    """Drive the hook as RankSession does; the plan each iteration ran."""
    ran, current = [], first_point
    for i in range(iterations):
        ran.append(current)
        if before is not None:
            before(i)
        decision = rt(_Stats(i, current))
        if decision is not None:
            current = decision[1]
    return ran


def test_follows_the_schedule_by_iteration(frontier: Frontier) -> None:
    doc, (a, b, c) = _three_interval_schedule(frontier)
    assert doc.segments == ((0, a), (3, b), (6, c))
    rt = PowerRuntime(frontier, schedule=doc)
    assert rt.point_index == a  # what RankSession deploys before iteration 0
    assert _run(rt, a, 11) == [a] * 3 + [b] * 3 + [c] * 5  # the last plan stays
    # Iterations before the schedule's origin run its first plan.
    late = PowerRuntime(frontier, schedule=doc, origin_iteration=4)
    assert [late.scheduled_index(i) for i in (0, 4, 7, 10)] == [a, a, b, c]


def test_a_cap_moves_the_pipeline_within_two_iterations_and_is_acknowledged(
    frontier: Frontier,
) -> None:
    store = torch_dist.HashStore()
    doc, (a, b, c) = _three_interval_schedule(frontier)
    pts = frontier.points
    cap_w = pts[a].avg_power_w * 1.001
    capped = min(
        (i for i in range(len(pts)) if pts[i].avg_power_w <= cap_w), key=lambda i: pts[i].time_s
    )
    rt = PowerRuntime(frontier, schedule=doc, store=store)

    def before(i: int) -> None:
        if i == 7:  # a `perseus power set` arriving while iteration 7 runs
            set_cap(store, cap_w)
        if i == 9:
            clear_cap(store)

    ran = _run(rt, a, 12, before)
    # Iteration 8 already runs under the cap (the boundary ending 7 read it); after the
    # clearing (during iteration 9) the schedule's fast plan c returns at iteration 10.
    assert ran == [a] * 3 + [b] * 3 + [c, c, capped, capped, c, c]
    assert read_cap_ack(store) == ("-", 9)
    assert [d.reason for d in rt.decisions][7:9] == ["cap", "cap"]


def test_per_gpu_cap_is_scaled_by_the_ranks(frontier: Frontier) -> None:
    store = torch_dist.HashStore()
    rt = PowerRuntime(frontier, store=store)
    token = set_cap(store, 250.0, "gpu")
    assert read_cap(store) == (250.0, "gpu", token)
    assert rt.read_cap_w(3) == 1000.0  # 4 ranks
    assert read_cap_ack(store) == (token, 3)


def test_a_cap_below_every_plan_runs_the_lowest_power_plan_with_one_warning(
    frontier: Frontier, caplog: pytest.LogCaptureFixture
) -> None:
    store = torch_dist.HashStore()
    set_cap(store, 1.0)
    rt = PowerRuntime(frontier, store=store)
    with caplog.at_level(logging.WARNING):
        ran = _run(rt, 0, 4)
    lowest = min(range(len(frontier.points)), key=lambda i: frontier.points[i].avg_power_w)
    assert ran == [0, lowest, lowest, lowest]
    assert sum("below every plan" in r.message for r in caplog.records) == 1


def test_a_runtime_keeps_the_latest_decisions(
    frontier: Frontier, caplog: pytest.LogCaptureFixture
) -> None:
    # A run of weeks decides every iteration: only the latest DECISIONS_KEPT are kept, and the
    # warning still comes once per stretch under an unreachable cap.
    rt = PowerRuntime(frontier)
    with caplog.at_level(logging.WARNING):
        for i in range(DECISIONS_KEPT + 3):
            rt.decide(i, 1.0 if i < DECISIONS_KEPT else None)
        rt.decide(DECISIONS_KEPT + 3, 1.0)
    assert len(rt.decisions) == DECISIONS_KEPT
    assert [d.iteration for d in (rt.decisions[0], rt.decisions[-1])] == [4, DECISIONS_KEPT + 3]
    assert sum("below every plan" in r.message for r in caplog.records) == 2


def test_the_plan_under_a_cap_is_worked_out_once_per_cap_value(
    frontier: Frontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each search scans every point (168 ms per iteration at 100,000 points): once per cap.
    import perseus.runtime.power.runtime as power_runtime

    calls: list[float] = []
    real = power_runtime.fastest_under_power

    def counted(points, cap_w):  # type: ignore[no-untyped-def]
        calls.append(cap_w)
        return real(points, cap_w)

    monkeypatch.setattr(power_runtime, "fastest_under_power", counted)
    pts = frontier.points
    mid, low = pts[len(pts) // 2].avg_power_w, pts[-1].avg_power_w
    rt = PowerRuntime(frontier)
    picks = [rt.decide(i, cap).point_index for i, cap in enumerate([mid] * 5 + [low] * 5 + [mid])]
    assert calls == [mid, low, mid]
    assert picks == [pts.index(real(pts, mid))] * 5 + [pts.index(real(pts, low))] * 5 + picks[:1]


def test_profile_iterations_are_ignored_and_no_change_returns_none(frontier: Frontier) -> None:
    rt = PowerRuntime(frontier)
    assert rt(_Stats(0, 0, phase="profile")) is None
    assert rt(_Stats(0, 0)) is None  # fastest plan, no cap: nothing to deploy


def test_schedule_for_another_frontier_is_refused(frontier: Frontier) -> None:
    doc, _ = _three_interval_schedule(frontier)
    with pytest.raises(PlanError, match="made for another frontier"):
        PowerRuntime(frontier.with_points(frontier.points[:-1]), schedule=doc)


def test_bad_caps(frontier: Frontier) -> None:
    store = torch_dist.HashStore()
    with pytest.raises(ConfigError, match="`cap_w` must be a positive"):
        set_cap(store, -5.0)
    store.set("perseus/power/cap", "lots pipeline x")
    assert read_cap(store) is None  # a malformed value reads as no cap
    clear_cap(store)
    clear_cap(store)  # idempotent
