"""A forecast and its realisation: a job following a schedule re-plans the rest from the cached
frontier when an interval's realised value differs, pays less than the stale plan would when
the price jumps, and the cost it measures matches the re-plans' stated cost. Emulated on a
virtual clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.io.power_files import read_schedule, read_signal, write_schedule
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.emulation import take_stages
from perseus.runtime.power.follow import CostMeter
from perseus.runtime.power.replan import ReplanCost, Replanner
from perseus.runtime.power.runtime import PowerRuntime, attach_power
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import schedule_plans

pytest.importorskip("torch.distributed")
BLOCKING_W = 83.64
N = 50
FORECAST = [3.0, 1.0, 1.2, 5.0]
#: Interval 2's price jumps tenfold: the rest belongs in interval 3 now.
REALISED = [3.0, 1.0, 12.0, 5.0]


#: The last ``_run``: the wait before its first iteration, then the plan each iteration ran.
_RAN: list[float] = []


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    job = make_job(take_stages(load_profile("a100"), 1), "1f1b", 1, 4, blocking_power_w=BLOCKING_W)
    return trace_frontier(job)


def _signal(path: Path, starts: list[float], values: list[float]) -> Path:
    path.write_text("".join(f"{s!r},{v!r}\n" for s, v in zip(starts, values, strict=True)))
    return path


def _point_at(segments: tuple[tuple[int, int], ...], iteration: int) -> int:
    return [index for first, index in segments if first <= iteration][-1]


def _setup(tmp_path: Path, frontier: Frontier) -> tuple[Path, Path, list[float]]:
    # Intervals of 40 fastest iterations: the energy counter publishes every 100 ms.
    length_s = 40 * frontier.fastest.time_s
    starts = [k * length_s for k in range(4)]
    s = schedule_plans(
        frontier.points, starts, FORECAST, iterations=N, deadline_s=4 * length_s,
        idle_power_w=BLOCKING_W,
    )  # fmt: skip
    path = tmp_path / "schedule.json"
    write_schedule(s, frontier, path)
    assert s.interval_iterations[2] > 0  # the forecast puts work in the interval that jumps
    return path, _signal(tmp_path / "forecast.csv", starts, FORECAST), starts


def _run(
    tmp_path: Path,
    frontier: Frontier,
    schedule: Path,
    *,
    via_options: bool = False,
    **replan: object,
) -> tuple[PowerRuntime, list[int | None], float]:
    """Run N iterations of the emulated job following ``schedule``, then idle until the
    deadline; the GPU's locked clock seen at every wait, and when the last iteration ended.
    ``via_options``: configured through :class:`SessionOptions` alone, not ``attach_power``."""
    locked: list[int | None] = []
    finished_s: list[float] = []
    _RAN.clear()

    class Clock(VirtualClock):
        def sleep(self, seconds: float) -> None:
            if seconds > 1.0:
                locked.append(gpu.locked_clock_mhz())
            super().sleep(seconds)

    state = tmp_path / f"gpu{len(list(tmp_path.glob('gpu*')))}"  # a fresh GPU each run
    state.mkdir()
    gpu = SimulatedGPU.from_profile(
        take_stages(load_profile("a100"), 1), blocking_power_w=BLOCKING_W, state_dir=state,
        set_latency_s=0.0, clock=Clock(),
    )  # fmt: skip
    power_options = {f"power_{k}": v for k, v in replan.items()} if via_options else {}
    options = SessionOptions(
        blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False,
        power_schedule=schedule if via_options else None, **power_options,  # type: ignore[arg-type]
    )  # fmt: skip
    with RankSession(
        build_schedule("1f1b", 1, 4), 0, gpu=gpu, plan=frontier, options=options
    ) as session:
        gpu, power = session.gpu, session.power
        if not via_options:
            power = attach_power(session, schedule, None, **replan)  # type: ignore[arg-type]
        _RAN.append(power.waited_s)
        for _ in range(N):
            with session.iteration():
                _RAN.append(session.point_index)
                for action in session.schedule.rank_actions[session.rank]:
                    with session.op(action):
                        pass
        waits = list(locked)
        finished_s.append(power.elapsed_s())
        # Hold the GPU, idle, until the deadline: both runs are priced over the same time.
        gpu.clock.sleep(4 * 40 * frontier.fastest.time_s - power.elapsed_s())
        power.mark()
    return power, waits, finished_s[0]


@pytest.mark.parametrize("how", ["file", "callable"])
def test_a_price_jump_is_replanned_cheaper_than_the_stale_plan_and_costs_what_it_states(
    tmp_path: Path, frontier: Frontier, how: str
) -> None:
    schedule, forecast, starts = _setup(tmp_path, frontier)
    realised = (
        _signal(tmp_path / "realised.csv", starts, REALISED)
        if how == "file"
        else (lambda k: REALISED[k])
    )
    power, locked, finished_s = _run(
        tmp_path, frontier, schedule, forecast=forecast, realised=realised
    )
    report = power.incurred()
    assert isinstance(report, ReplanCost) and power.replanner is not None
    # One re-plan, when interval 2 opened, from its start, for what was left.
    (replan,) = power.replanner.replans
    assert replan.interval == 2 and replan.at_s == pytest.approx(starts[2])
    assert 0 < replan.done < N
    # Every iteration ran, by the deadline, and the GPU was unlocked during every wait.
    assert finished_s <= 4 * starts[1] and power.replanner.pieces[-1][1].finish_s <= 4 * starts[1]
    assert finished_s > starts[3]  # the rest ran in the last interval, after the jump
    assert locked and all(mhz is None for mhz in locked)
    # Every iteration ran its plan: the original's until the re-plan, the re-plan's after.
    expected = [_point_at(power.replanner.original.segments(), i) for i in range(replan.done)]
    again = power.replanner.pieces[1][1].segments()
    expected += [_point_at(again, i) for i in range(N - replan.done)]
    assert _RAN[1:] == expected
    # The measured cost (energy counter x realised price) matches the stated one within 1 %.
    assert abs(report.incurred - report.scheduled) <= 0.01 * report.scheduled, report
    # Sticking to the stale plan costs more: in the model, and measured on the same job.
    assert report.scheduled < 0.9 * report.original_at_realised
    stale, _, _ = _run(tmp_path, frontier, schedule)
    assert stale.meter is not None
    priced = CostMeter(np.array(starts), np.array([*starts[1:], 4 * starts[1]]), np.array(REALISED))
    for span in stale.meter.spans:
        priced.add(*span)
    assert report.incurred < 0.9 * priced.incurred


def test_no_replan_when_the_realised_values_are_the_forecast(
    tmp_path: Path, frontier: Frontier
) -> None:
    schedule, forecast, _ = _setup(tmp_path, frontier)
    power, _, _ = _run(
        tmp_path, frontier, schedule, forecast=forecast, realised=lambda k: FORECAST[k]
    )
    report = power.incurred()
    assert isinstance(report, ReplanCost) and report.replans == 0
    assert report.original == pytest.approx(report.scheduled)
    assert abs(report.incurred - report.original) <= 0.01 * report.original


def test_replanner_refuses_what_does_not_match(tmp_path: Path, frontier: Frontier) -> None:
    schedule, forecast, starts = _setup(tmp_path, frontier)
    doc = read_schedule(schedule)
    shifted = _signal(tmp_path / "shifted.csv", [s * 1.5 for s in starts], REALISED)
    with pytest.raises(ConfigError, match="start at other times"):
        Replanner.from_signals(frontier, doc, forecast, shifted)
    other = _signal(tmp_path / "other.csv", starts, [1.0, 5.0, 5.0, 1.0])
    with pytest.raises(ConfigError, match="not made from this signal"):
        Replanner.from_signals(frontier, doc, other, lambda k: None)
    # Re-planning checks each interval once, when it opens; None keeps the forecast.
    r = Replanner.from_signals(frontier, doc, read_signal(forecast), lambda k: None)
    assert r.replan(starts[3], 10) is None and not r.replans
    bad = Replanner.from_signals(frontier, doc, forecast, lambda k: float("nan"))
    with pytest.raises(ConfigError, match="not a finite number"):
        bad.observe(0.0)


def test_a_cheaper_first_interval_is_replanned_before_the_first_iteration(
    tmp_path: Path, frontier: Frontier
) -> None:
    """The forecast makes the job wait; interval 0 settles cheap: the job re-plans at once,
    deploys the new schedule's first plan and starts without waiting."""
    schedule, forecast, _ = _setup(tmp_path, frontier)
    cheap = [0.1, *FORECAST[1:]]
    power, _, _ = _run(tmp_path, frontier, schedule, forecast=forecast, realised=lambda k: cheap[k])
    assert power.replanner is not None
    first = power.replanner.replans[0]
    assert first.interval == 0 and first.at_s == 0 and first.done == 0
    waited_s, first_point = _RAN[:2]
    assert waited_s == 0
    assert first_point == power.replanner.pieces[1][1].segments()[0][1]


def test_session_options_alone_configure_the_replan(tmp_path: Path, frontier: Frontier) -> None:
    """``SessionOptions(power_schedule=, power_forecast=, power_realised=)`` re-plans as
    ``attach_power`` does; the realised values without their forecast are refused at once."""
    schedule, forecast, starts = _setup(tmp_path, frontier)
    power, _, _ = _run(
        tmp_path, frontier, schedule, via_options=True, forecast=forecast,
        realised=lambda k: REALISED[k], objective=None,
    )  # fmt: skip
    assert power.replanner is not None
    (replan,) = power.replanner.replans
    assert replan.interval == 2 and replan.at_s == pytest.approx(starts[2])
    for missing in ("power_forecast", "power_schedule"):
        given = {"power_schedule": schedule, "power_forecast": forecast, missing: None}
        with pytest.raises(ConfigError, match="power_realised= needs power_schedule="):
            SessionOptions(power_realised=lambda k: REALISED[k], **given)  # type: ignore[arg-type]
