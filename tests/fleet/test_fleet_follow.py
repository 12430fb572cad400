"""A fleet that follows: jobs register, the planner re-solves, jobs switch plans (both engines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from perseus.device.clock import VirtualClock, WallClock
from perseus.device.simulated import SimulatedGPU
from perseus.fleet.member import FleetMember
from perseus.fleet.registry import FleetRegistry
from perseus.io import load_profile
from perseus.io.frontier_files import write_frontier
from perseus.job import PlanningJob, make_job
from perseus.plan import Frontier
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule
from perseus.solver import trace
from perseus.solver.fleet import fleet_job

pytest.importorskip("torch.distributed")
REPO = Path(__file__).resolve().parents[2]
BLOCKING_W = 83.64


@pytest.fixture(scope="module")
def small() -> tuple[Any, PlanningJob, Frontier]:
    """A two-rank job small enough to emulate quickly, and its frontier."""
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    return profile, job, trace(job, min_gap_fraction=0.01).frontier


def test_registry_replans_on_register_budget_finish_and_lease(
    store_url: str, small: tuple[Any, PlanningJob, Frontier]
) -> None:
    _, _, frontier = small
    clock = VirtualClock(1000.0)
    with FleetRegistry(store_url, clock=clock) as fleet:
        jobs = [fleet_job(f"j{k}", frontier, weight=1.0 + k) for k in range(3)]
        for j in jobs:
            fleet.register(j, lease_s=30.0)
        assert fleet.replan() is None  # no budget yet
        all_max_w = sum(j.average_power_w[0] for j in jobs)
        fleet.set_budget(all_max_w)
        assert fleet.replan() == 1
        assert [fleet.assignment(j.name).point for j in jobs] == [0, 0, 0]  # type: ignore[union-attr]
        assert fleet.replan() is None  # nothing changed
        least_w = sum(min(j.average_power_w) for j in jobs)
        budget_w = least_w + 0.3 * (all_max_w - least_w)
        fleet.set_budget(budget_w)
        assert fleet.replan() == 2
        first = {j.name: fleet.assignment(j.name) for j in jobs}
        assert sum(a.cap_w for a in first.values()) <= budget_w  # type: ignore[union-attr]
        # j0 stops renewing its lease; the others renew theirs: j0's power goes to them
        clock.advance(31.0)
        fleet.heartbeat("j1")
        fleet.heartbeat("j2")
        assert fleet.replan() == 3
        assert fleet.assignment("j0") is None
        for name in ("j1", "j2"):
            assert fleet.assignment(name).cap_w >= first[name].cap_w  # type: ignore[union-attr]
        assert sum(fleet.assignment(n).cap_w for n in ("j1", "j2")) > sum(  # type: ignore[union-attr]
            first[n].cap_w
            for n in ("j1", "j2")  # type: ignore[union-attr]
        )
        fleet.finish("j1")
        assert fleet.replan() == 4
        budget, epoch, members = fleet.status()
        assert (budget, epoch) == (budget_w, 4)
        assert {m.name: m.status for m in members} == {
            "j0": "expired", "j1": "finished", "j2": "running"
        }  # fmt: skip
        assert fleet.assignment("j2").point == 0  # type: ignore[union-attr]  # alone: fastest fits
    # a restarted planner picks up where it was
    with FleetRegistry(store_url, clock=clock) as again:
        assert again.status()[1] == 4 and again.replan() is None


def test_a_live_member_whose_lease_ran_out_joins_again(
    store_url: str, small: tuple[Any, PlanningJob, Frontier]
) -> None:
    """A job paused past its lease (a long checkpoint) is expired by the planner; at its next
    read it registers again and gets a share of the next plan, instead of running uncapped on
    power the plan gave the others. Until a plan gives it a share (joined, or joined again),
    it runs its lowest-power plan: it ran uncapped."""
    from perseus.fleet.member import _CAP_SLACK
    from perseus.runtime.power.cap import CAP_KEY

    _, _, frontier = small
    clock = VirtualClock(1000.0)
    url = store_url
    with FleetRegistry(url, clock=clock) as planner:
        member = FleetMember(url, "a", frontier, lease_s=30.0, clock=clock).start()
        other = FleetMember(url, "b", frontier, lease_s=600.0, clock=clock).start()
        # Joined, before the planner's first plan: the lowest-power plan (per replica)
        lowest_w = min(p.avg_power_w for p in frontier.points) * (1 + _CAP_SLACK)
        lowest = f"{lowest_w!r} pipeline pending".encode()
        assert member.check([CAP_KEY]) and member.get(CAP_KEY) == lowest
        idle = FleetMember(url, "c", frontier, clock=clock)  # not started: no cap of its own
        assert not idle.check([CAP_KEY])
        idle.registry.close()
        planner.set_budget(2 * min(p.avg_power_w for p in frontier.points) * 1.5)
        assert planner.replan() == 1
        assert member.check([CAP_KEY]) and other.check([CAP_KEY])
        clock.advance(31.0)  # "a" pauses past its lease
        other.check([CAP_KEY])
        assert planner.replan() == 2
        assert planner.assignment("a") is None
        # no share yet (it registered again): its lowest-power plan, not an uncapped one
        assert member.check([CAP_KEY]) and member.assignment is None
        assert member.get(CAP_KEY) == lowest
        assert {m.name: m.status for m in planner.status()[2]} == {"a": "running", "b": "running"}
        assert planner.replan() == 3
        assert member.check([CAP_KEY]) and member.assignment is not None
        assert member.assignment.epoch == 3
        member.close()
        assert not member.check([CAP_KEY])  # finished: it does not come back
        member.registry.close()
        assert {m.name: m.status for m in planner.status()[2]}["a"] == "finished"
        other.close()


def test_a_database_that_does_not_answer_does_not_stop_the_training(
    store_url: str, small: tuple[Any, PlanningJob, Frontier], caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0 reads the plan at every iteration boundary: a database that did not answer (a
    writer holding its lock past the busy timeout, a server restarted or out of reach) raised
    out of the power runtime's read and ended the training. The last plan now holds (past the
    lease, the lowest-power one); the database is asked again a few seconds later, not at
    every iteration meanwhile."""
    from perseus.runtime.power.cap import ACK_KEY, CAP_KEY

    _, _, frontier = small
    clock = VirtualClock(1000.0)
    with FleetRegistry(store_url, clock=clock) as planner, FleetRegistry(store_url) as holder:
        member = FleetMember(store_url, "a", frontier, lease_s=60.0, clock=clock)
        member.registry.store.busy_timeout_s = 0.2
        member.start()
        planner.set_budget(max(p.avg_power_w for p in frontier.points))
        assert planner.replan() == 1
        assert member.check([CAP_KEY]) and member.assignment is not None
        plan, epoch = member.get(CAP_KEY), member.assignment.epoch
        asked = []
        heartbeat = member.registry.heartbeat
        member.registry.heartbeat = lambda name: asked.append(name) or heartbeat(name)  # type: ignore[method-assign]
        # SQLite: the write lock; PostgreSQL: the member's row
        with holder._write() as con:
            holder.store._x(con, "UPDATE fleet_members SET heartbeat_s = 0 WHERE name = 'a'")
            for _ in range(3):
                assert member.check([CAP_KEY]) and member.get(CAP_KEY) == plan
            member.set(ACK_KEY, f"{epoch} 7")  # not recorded, not raised
            assert asked == ["a"]
            # past its lease unrenewed, the plan's power may be the others': the lowest plan
            clock.advance(61.0)
            assert member.check([CAP_KEY]) and asked == ["a", "a"]
            lowest_w = min(p.avg_power_w for p in frontier.points)
            cap_w, _, token = member.get(CAP_KEY).decode().split()
            assert float(cap_w) == pytest.approx(lowest_w) and token == f"lapsed-{epoch}"
        assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1
        clock.advance(5.0)
        assert member.check([CAP_KEY]) and member.get(CAP_KEY) == plan and len(asked) == 3
        assert planner.status()[2][0].heartbeat_age_s == 0.0  # the lease renewed again
        member.close()


def _iteration(session: RankSession) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank]:
            with session.op(action):
                pass


_KILLED = textwrap.dedent(
    """
    import sys, time
    from perseus.fleet.member import FleetMember
    from perseus.io.frontier_files import read_frontier
    member = FleetMember(sys.argv[1], "victim", read_frontier(sys.argv[2]), lease_s=5.0).start()
    print("registered", flush=True)
    while True:
        member.check(["perseus/power/cap"])
        time.sleep(0.05)
    """
)


class _SkewedWallClock(WallClock):
    """The wall clock, ``skew_s`` ahead: the planner passes a lease without waiting for it."""

    skew_s = 0.0

    def now(self) -> float:
        return super().now() + self.skew_s


def test_three_emulated_jobs_follow_the_budget_on_postgres(
    postgres_url: str, small: tuple[Any, PlanningJob, Frontier], tmp_path: Path
) -> None:
    profile, _, frontier = small
    path = tmp_path / "frontier.json"
    write_frontier(frontier, path)
    planner_clock = _SkewedWallClock()
    planner = FleetRegistry(postgres_url, clock=planner_clock)
    victim = subprocess.Popen(
        [sys.executable, "-c", _KILLED, postgres_url, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    sessions, members = [], []
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "registered"
        for k in range(3):
            member = FleetMember(postgres_url, f"job{k}", frontier, weight=1.0 + k, lease_s=60.0)
            members.append(member.start())
            gpu = SimulatedGPU.from_profile(
                profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path / f"sim{k}",
                set_latency_s=0.0,
            )  # fmt: skip
            options = SessionOptions(
                blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False,
                power_store=member,
            )  # fmt: skip
            schedule = build_schedule("1f1b", 2, 4)
            session = RankSession(schedule, 0, gpu=gpu, plan=frontier, options=options)
            sessions.append(session.start())
        fastest_w = frontier.fastest.avg_power_w
        least_w = min(p.avg_power_w for p in frontier.points)
        planner.set_budget(4 * fastest_w)
        planner.replan()
        for _ in range(3):
            for s in sessions:
                _iteration(s)
        assert [s.history[-1].point_index for s in sessions] == [0, 0, 0]
        # The budget is lowered while iteration i runs: every job runs its new plan from i + 1
        budget_w = 4 * least_w + 0.4 * 4 * (fastest_w - least_w)
        planner.set_budget(budget_w)
        epoch = planner.replan()
        planned = [planner.assignment(m.name) for m in members]
        assert all(a is not None and a.epoch == epoch for a in planned)
        start = len(sessions[0].history)
        for _ in range(3):
            for s in sessions:
                _iteration(s)
        for s, a in zip(sessions, planned, strict=True):
            ran = [h.point_index for h in s.history[start:]]
            assert ran[1:] == [a.point] * 2, ran  # type: ignore[union-attr]  # within two iterations
        total_w = sum(a.cap_w for a in planned)  # type: ignore[union-attr]
        assert total_w + planner.assignment("victim").cap_w <= budget_w  # type: ignore[union-attr]
        status = {m.name: m for m in planner.status()[2]}
        assert all(
            status[m.name].ack_point == a.point for m, a in zip(members, planned, strict=True)
        )  # type: ignore[union-attr]
        # The victim is SIGKILLed; after its lease its share goes to the three jobs
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        planner_clock.skew_s = 6.0  # past the victim's 5 s lease, well within the jobs' 60 s
        for s in sessions:
            _iteration(s)  # the jobs renew their leases
        again = planner.replan()
        assert again == epoch + 1 and planner.assignment("victim") is None
        after = [planner.assignment(m.name) for m in members]
        assert sum(a.cap_w for a in after) > total_w  # type: ignore[union-attr]
        start = len(sessions[0].history)
        for _ in range(3):
            for s in sessions:
                _iteration(s)
        for s, a in zip(sessions, after, strict=True):
            assert [h.point_index for h in s.history[start + 1 :]] == [a.point] * 2  # type: ignore[union-attr]
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.communicate(timeout=30)
        for s in sessions:
            s.close()
        for m in members:
            m.close()
        planner.close()


def test_cli_budget_serve_and_status(
    tmp_path: Path, small: tuple[Any, PlanningJob, Frontier], capsys
) -> None:  # type: ignore[no-untyped-def]
    from perseus.cli.main import main

    _, _, frontier = small
    url = f"sqlite:///{tmp_path / 'fleet.sqlite'}"
    with FleetRegistry(url) as fleet:
        fleet.register(fleet_job("a", frontier), lease_s=600.0)
        fleet.register(fleet_job("b", frontier, weight=3.0), lease_s=600.0)
    least_w = min(p.avg_power_w for p in frontier.points)
    budget_w = 2 * least_w + 0.5 * 2 * (frontier.fastest.avg_power_w - least_w)
    assert main(["fleet", "budget", "--db", url, "--set-w", str(budget_w)]) == 0
    assert main(["fleet", "serve", "--db", url, "--once"]) == 0
    capsys.readouterr()
    assert main(["fleet", "status", "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["budget_w"] == budget_w and doc["epoch"] == 1
    points = {m["name"]: m["point"] for m in doc["members"]}
    assert points["b"] <= points["a"]  # the heavier job runs at least as fast
    assert sum(m["cap_w"] for m in doc["members"]) <= budget_w
    assert main(["fleet", "status", "--db", url]) == 0
    assert "plan 1" in capsys.readouterr().out
    assert main(["fleet", "status", "--db", "postgresql://u:pw@h/db"]) == 2
    assert "PGPASSWORD" in capsys.readouterr().err


def test_timeline_and_plot(tmp_path: Path, small: tuple[Any, PlanningJob, Frontier]) -> None:
    from perseus.report.fleet import plot_fleet

    _, _, frontier = small
    clock = VirtualClock()
    with FleetRegistry(f"sqlite:///{tmp_path / 'f.sqlite'}", clock=clock) as fleet:
        a, b = fleet_job("a", frontier), fleet_job("b", frontier, weight=2.0)
        fleet.register(a, lease_s=10.0)
        fleet.register(b, lease_s=10.0)
        fleet.set_budget(2 * frontier.fastest.avg_power_w)
        fleet.replan()
        clock.advance(5.0)
        fleet.set_budget(a.average_power_w[-1] + b.average_power_w[-1])
        fleet.replan()
        events = fleet.timeline()
    assert [e[0] for e in events] == [0.0, 5.0]
    assert events[0][2]["a"] == (a.average_power_w[0], a.time_s[0])
    assert sum(w for w, _ in events[1][2].values()) <= events[1][1]  # type: ignore[operator]
    png = plot_fleet(events, 10.0)
    assert png.startswith(b"\x89PNG")


_PLANNER = textwrap.dedent(
    """
    import sys
    from perseus.fleet.registry import FleetRegistry
    fleet = FleetRegistry(sys.argv[1])
    print("planning", flush=True)
    while True:
        fleet.replan(force=True)
    """
)


def test_a_sigkilled_planner_leaves_one_whole_plan(
    store_url: str, small: tuple[Any, PlanningJob, Frontier]
) -> None:
    _, _, frontier = small
    with FleetRegistry(store_url) as fleet:
        for k in range(150):
            fleet.register(fleet_job(f"j{k:03d}", frontier, weight=1 + k % 3), lease_s=3600.0)
        fleet.set_budget(150 * min(p.avg_power_w for p in frontier.points) * 1.2)
        planner = subprocess.Popen(
            [sys.executable, "-c", _PLANNER, store_url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert planner.stdout is not None and planner.stdout.readline().strip() == "planning"
        while fleet.status()[1] < 3:  # a few whole plans written
            time.sleep(0.05)
        planner.send_signal(signal.SIGKILL)
        planner.communicate(timeout=30)
        budget_w, epoch, members = fleet.status()
        # every member carries the last committed plan, and it fits: nothing half-written
        assert {m.epoch for m in members} == {epoch}
        assert sum(m.cap_w or 0.0 for m in members) <= budget_w  # type: ignore[operator]
        # a restarted planner picks up from there
        assert fleet.replan(force=True) == epoch + 1
