"""A job follows a plan schedule in time: it waits for each interval with its clocks released,
runs its iterations there, and the cost it incurred (its GPU's energy counter, priced by the
interval it was drawn in) matches the schedule's. Emulated on a virtual clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.io import load_profile
from perseus.io.power_files import read_schedule, write_schedule
from perseus.job import make_job
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.power.follow import CostMeter, ScheduleClock
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import schedule_plans

pytest.importorskip("torch.distributed")
BLOCKING_W = 83.64


class _WatchedClock(VirtualClock):
    """A virtual clock that notes the GPU's locked clock during every sleep longer than an
    iteration (a wait for an interval)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpu: SimulatedGPU | None = None
        self.longer_than_s = 0.0
        self.waits: list[tuple[float, int | None]] = []

    def sleep(self, seconds: float) -> None:
        if seconds > self.longer_than_s and self.gpu is not None:
            self.waits.append((seconds, self.gpu.locked_clock_mhz()))
        super().sleep(seconds)


def _iteration(session: RankSession) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank]:
            with session.op(action):
                pass


@pytest.mark.parametrize("values", [[3.0, 1.0, 5.0, 0.5], [0.2, -0.05, 0.0, 4.0]])
def test_an_emulated_job_follows_the_schedule_in_time_and_pays_what_it_stated(
    tmp_path: Path, values: list[float]
) -> None:
    profile = take_stages(load_profile("a100"), 1)
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=BLOCKING_W)
    frontier = trace_frontier(job)
    t0 = frontier.fastest.time_s
    # Intervals of 40 iterations: the energy counter publishes every 100 ms, as NVML's does.
    length_s = 40 * t0
    starts = [k * length_s for k in range(4)]
    s = schedule_plans(
        frontier.points,
        starts,
        values,
        iterations=50,
        deadline_s=4 * length_s,
        idle_power_w=BLOCKING_W,  # a simulated GPU idles at its blocking power
    )
    path = tmp_path / "schedule.json"
    write_schedule(s, frontier, path)
    doc = read_schedule(path)
    assert doc.intervals[0].start_s > 0  # the job must wait for its first interval
    clock = _WatchedClock()
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path, set_latency_s=0.0, clock=clock
    )
    clock.gpu, clock.longer_than_s = gpu, 2 * max(p.time_s for p in frontier.points)
    options = SessionOptions(
        blocking_power_w=BLOCKING_W, power_schedule=path, watchdog=False, handle_signals=False
    )
    schedule = build_schedule("1f1b", 1, 4)
    with RankSession(schedule, 0, gpu=gpu, plan=frontier, options=options) as session:
        clock.gpu = session.gpu
        for _ in range(50):
            _iteration(session)
        power = session.power
        report = power.incurred()
    assert report is not None
    # It waited (clocks released, nothing locked) rather than running in the dear hours.
    assert power.waited_s > length_s * 0.9
    assert sum(w for w, _ in clock.waits) == pytest.approx(power.waited_s)
    assert all(locked is None for _, locked in clock.waits)
    # Every iteration ran inside its interval: the measured time reached the last one.
    last = doc.intervals[-1]
    assert last.start_s <= report.elapsed_s <= last.end_s
    # The cost it incurred matches the schedule's within 1 %.
    assert report.scheduled != 0
    assert abs(report.incurred - report.scheduled) <= 0.01 * abs(report.scheduled), report
    # Waiting outside the schedule's intervals drew idle power.
    assert report.outside_j == pytest.approx(report.scheduled_outside_j, rel=0.01)


def test_schedule_clock_and_meter_by_hand(tmp_path: Path) -> None:
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.05)
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=BLOCKING_W)
    frontier = trace_frontier(job)
    t0 = frontier.fastest.time_s
    s = schedule_plans(
        frontier.points, [0.0, 4 * t0], [9.0, 1.0], iterations=3, deadline_s=8 * t0,
        idle_power_w=100.0,
    )  # fmt: skip
    path = tmp_path / "s.json"
    write_schedule(s, frontier, path)
    doc = read_schedule(path)
    timer = ScheduleClock(doc)
    assert [timer.interval_of(i) for i in (0, 2, 3)] == [0, 0, None]
    assert timer.wait_s(0, 0.0) == pytest.approx(4 * t0) and timer.wait_s(0, 5 * t0) == 0
    assert timer.wait_s(3, 0.0) == 0  # past the schedule: no wait
    meter = CostMeter.of_schedule(doc)
    meter.mark(0.0, 0.0)
    meter.mark(4 * t0, 400.0 * t0)  # waiting outside the schedule's interval
    meter.mark(6 * t0, 400.0 * t0 + 2000.0)  # inside it, value 1
    r = meter.report(doc)
    assert r.outside_j == pytest.approx(400.0 * t0) and r.scheduled_outside_j == pytest.approx(
        400 * t0
    )
    assert r.incurred == pytest.approx(1.0 * 2000.0 / 3.6e6)
