"""The planner's loop on virtual time: a budget that follows a price signal, on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.errors import ConfigError
from perseus.fleet.registry import FleetRegistry
from perseus.fleet.serve import serve, signal_budget
from perseus.io import load_profile
from perseus.io.power_files import read_signal
from perseus.job import make_job
from perseus.runtime.emulation import take_stages
from perseus.solver import trace
from perseus.solver.fleet import fleet_job


def test_the_budget_follows_a_price_signal_at_its_interval_boundaries(
    store_url: str, tmp_path: Path
) -> None:
    job = make_job(take_stages(load_profile("a100"), 2), "1f1b", 2, 4, blocking_power_w=83.64)
    frontier = trace(job, min_gap_fraction=0.01).frontier
    jobs = [fleet_job(f"j{k}", frontier, weight=1.0 + k) for k in range(2)]
    all_max_w = sum(j.average_power_w[0] for j in jobs)
    least_w = sum(min(j.average_power_w) for j in jobs)
    low_w = least_w + 0.3 * (all_max_w - least_w)
    csv = tmp_path / "price.csv"
    csv.write_text("start,price_eur_per_mwh\n0,50\n30,200\n90,80\n")
    # 200 EUR/MWh is above 100 in the column's declared unit (0.2 per kWh would not be).
    track = signal_budget(
        read_signal(csv), budget_w=all_max_w, above=100.0, high_signal_budget_w=low_w
    )
    clock = VirtualClock(1000.0)
    with FleetRegistry(store_url, clock=clock) as fleet:
        for j in jobs:
            fleet.register(j, lease_s=1e6)
        # Polled every 7 s, yet each change lands on the signal's boundary, not the next poll.
        serve(fleet, clock=clock, interval_s=7.0, track=track, until_s=120.0)
        timeline = fleet.timeline()
    assert [(t, b) for t, b, _ in timeline] == [
        (1000.0, all_max_w),
        (1030.0, low_w),
        (1090.0, all_max_w),
    ]
    for _, budget_w, plan in timeline:
        assert budget_w is not None and sum(p for p, _ in plan.values()) <= budget_w
    assert sum(p for p, _ in timeline[1][2].values()) < sum(p for p, _ in timeline[0][2].values())


def test_a_signal_budget_must_be_watts(tmp_path: Path) -> None:
    csv = tmp_path / "price.csv"
    csv.write_text("0,0.1\n")
    with pytest.raises(ConfigError, match="high_signal_budget_w"):
        signal_budget(read_signal(csv), budget_w=100.0, above=0.0, high_signal_budget_w=0.0)


def test_cli_serve_takes_its_first_budget_from_the_signal(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from perseus.cli.main import main

    url = f"sqlite:///{tmp_path / 'fleet.sqlite'}"
    csv = tmp_path / "carbon.csv"
    csv.write_text("start,carbon_g_per_kwh_location_average\n0,400\n3600,100\n")
    signal = ["--budget-signal", str(csv), "--budget-w", "900", "--signal-above", "300"]
    assert main(["fleet", "serve", "--db", url, "--once", *signal, "--signal-budget-w", "500"]) == 0
    assert main(["fleet", "status", "--db", url, "--json"]) == 0
    assert '"budget_w": 500.0' in capsys.readouterr().out  # 400 gCO2/kWh is above 300
    assert main(["fleet", "serve", "--db", url, "--once", *signal]) == 2
    assert "--signal-budget-w" in capsys.readouterr().err
    assert main(["fleet", "serve", "--db", url, "--once", "--signal-above", "1"]) == 2
    assert "--budget-signal" in capsys.readouterr().err


def test_the_planner_outlives_a_database_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A busy database, a restarted PostgreSQL server or one out of reach ended `perseus
    fleet serve` at its next look: no more plans until someone restarted it. It now looks
    again at its next poll; a first look that fails (a wrong URL) still raises."""
    from perseus.errors import PerseusError
    from perseus.solver.fleet import FleetJob

    clock = VirtualClock(1000.0)
    with FleetRegistry(f"sqlite:///{tmp_path / 'f.sqlite'}", clock=clock) as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.1), (100.0, 60.0), (100.0, 60.0)))
        replan, looks = fleet.replan, []

        def flaky(*, force: bool = False) -> int | None:
            looks.append(clock.now())
            if len(looks) in (1, 3):
                raise PerseusError("db: server closed the connection unexpectedly")
            return replan(force=force)

        monkeypatch.setattr(fleet, "replan", flaky)
        with pytest.raises(PerseusError, match="closed the connection"):
            serve(fleet, clock=clock, interval_s=7.0, budget_w=150.0, until_s=21.0)
        assert looks == [1000.0]
        serve(fleet, clock=clock, interval_s=7.0, budget_w=150.0, until_s=21.0)
        assert looks == [1000.0, 1000.0, 1007.0, 1014.0, 1021.0]
        assert fleet.status()[1] == 1 and fleet.assignment("a") is not None
    assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1


def test_the_planners_log_line_reads_the_running_members_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After each plan the loop logged the running jobs' count from status(), which reads
    every member that ever ran (finished and expired ones stay): 0.85-1.3 s a plan at
    100,000 members that once ran; by the index now (0.04 ms)."""
    import logging

    from perseus.solver.fleet import FleetJob

    clock = VirtualClock(1000.0)
    with FleetRegistry(f"sqlite:///{tmp_path / 'f.sqlite'}", clock=clock) as fleet:
        for name in ("a", "b", "c"):
            fleet.register(FleetJob(name, 1.0, (0, 1), (1.0, 1.1), (100.0, 60.0), (100.0, 60.0)))
        fleet.finish("c")

        def every_member() -> None:
            raise AssertionError("the loop read every member")

        monkeypatch.setattr(fleet, "status", every_member)
        with caplog.at_level(logging.INFO, logger="perseus.fleet.serve"):
            serve(fleet, clock=clock, interval_s=7.0, budget_w=150.0, once=True)
        assert fleet.running() == (150.0, 2)
    assert "plan 1: 2 running jobs under 150.0 W" in caplog.text


def test_the_plan_log_keeps_the_last_plans_not_every_one(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fleet_log`` gained a row per member and one per plan for ever (a fleet re-planning
    every 5 s for a year: 3 GB at 10 members, all read by ``timeline()``); it keeps the
    last ``LOG_PLANS`` plans (up to ``_LOG_PRUNE_EVERY`` more), whole, newest last."""
    from perseus.fleet import registry

    monkeypatch.setattr(registry, "LOG_PLANS", 4, raising=False)
    monkeypatch.setattr(registry, "_LOG_PRUNE_EVERY", 2, raising=False)
    job = make_job(take_stages(load_profile("a100"), 2), "1f1b", 2, 4, blocking_power_w=83.64)
    frontier = trace(job, min_gap_fraction=0.01).frontier
    clock = VirtualClock(1000.0)
    with FleetRegistry(store_url, clock=clock) as fleet:
        for k in range(2):
            fleet.register(fleet_job(f"j{k}", frontier, weight=1.0), lease_s=1e6)
        fleet.set_budget(1e6)
        kept = []
        for _ in range(13):
            clock.advance(1.0)
            fleet.replan(force=True)
            kept.append(len(fleet.timeline()))
        timeline = fleet.timeline()
    assert max(kept) <= 4 + 2 and kept[-1] >= 4, kept
    assert [t for t, _, _ in timeline][-1] == clock.now()
    assert all(set(plan) == {"j0", "j1"} for _, _, plan in timeline)  # whole plans
