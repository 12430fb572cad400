"""A job follows a plan schedule in time: it waits for each interval with its clocks released,
runs its iterations there, and the cost it incurred (its GPU's energy counter, priced by the
interval it was drawn in) matches the schedule's. Emulated on a virtual clock."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.io import load_profile
from perseus.io.power_files import read_schedule, read_signal, write_schedule
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.profile import Profile
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.power.follow import SPANS_KEPT, CostMeter, ScheduleClock
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule
from perseus.solver import trace_frontier
from perseus.solver.power_schedule import J_PER_KWH, schedule_plans

pytest.importorskip("torch.distributed")
BLOCKING_W = 83.64
SIGNALS = Path(__file__).parents[1] / "solver" / "signals"  # real market weeks


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


def _frontier(profile: Profile) -> Frontier:
    return trace_frontier(make_job(profile, "1f1b", 1, 4, blocking_power_w=BLOCKING_W))


@pytest.mark.parametrize(
    "signal",
    [
        [3.0, 1.0, 5.0, 0.5],
        [0.2, -0.05, 0.0, 4.0],
        "de_lu_2023-06-27_negative_prices.csv",
        "de_lu_2024-12-09_price_jump.csv",
    ],
)
def test_an_emulated_job_follows_the_schedule_in_time_and_pays_what_it_stated(
    tmp_path: Path, signal: list[float] | str
) -> None:
    profile = take_stages(load_profile("a100"), 1)
    if isinstance(signal, str):
        # A real market week as published: 168 hourly intervals; op times scaled so that an
        # hour holds 10.5 iterations at the fastest plan; 30 % of the week's room asked for.
        week = read_signal(SIGNALS / signal)
        starts, values = week.starts_s.tolist(), week.series[0].values_per_kwh.tolist()
        profile = scale_profile(profile, 3600.0 / (10.5 * _frontier(profile).fastest.time_s))
        frontier = _frontier(profile)
        length_s, iterations = 3600.0, 529
    else:
        # Intervals of 40 iterations: the energy counter publishes every 100 ms, as NVML's does.
        frontier = _frontier(profile)
        length_s, iterations, values = 40 * frontier.fastest.time_s, 50, signal
        starts = [k * length_s for k in range(4)]
    s = schedule_plans(
        frontier.points,
        starts,
        values,
        iterations=iterations,
        deadline_s=len(starts) * length_s,
        idle_power_w=BLOCKING_W,  # a simulated GPU idles at its blocking power
    )
    path = tmp_path / "schedule.json"
    write_schedule(s, frontier, path)
    doc = read_schedule(path)
    # The job must wait: for its first interval, or between two it runs in.
    ivs = doc.intervals
    assert ivs[0].start_s > 0 or any(b.start_s > a.end_s for a, b in itertools.pairwise(ivs))
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
        for _ in range(iterations):
            _iteration(session)
        power = session.power
        report = power.incurred()
    assert report is not None
    # It waited (clocks released, nothing locked) rather than running in the dear hours.
    assert power.waited_s > length_s * 0.9
    # Waits longer than two iterations are told from device time by their length; a week
    # also has shorter ones (an hour's last iterations end just before the next hour).
    recorded_s = sum(w for w, _ in clock.waits)
    assert recorded_s <= power.waited_s * (1 + 1e-9)
    if not isinstance(signal, str):
        assert recorded_s == pytest.approx(power.waited_s)
    assert all(locked is None for _, locked in clock.waits)
    # Every iteration ran inside its interval: the measured time reached the last one.
    last = doc.intervals[-1]
    assert last.start_s <= report.elapsed_s <= last.end_s
    # The cost it incurred matches the schedule's within 1 %: of the scheduled cost on the
    # short signals and on the price-jump week (all its prices are positive: gross = net), of
    # the week's gross cost (sum of |value| x energy) on the negative week, whose net is a
    # near-cancelling sum of dear and paid hours. Repeatable: on this virtual clock the clock
    # worker runs inline, each op's work before the emulating host waits for the op's end, so
    # mixed-clock hours land their clock changes as planned too (both weeks within 0.002 %).
    assert report.scheduled != 0
    gross = sum(abs(iv.value) * (iv.energy_j + iv.idle_energy_j) for iv in ivs) / J_PER_KWH
    bound = 0.01 * (gross if isinstance(signal, str) else abs(report.scheduled))
    assert abs(report.incurred - report.scheduled) <= bound, report
    # Running back to back from the start instead costs more than ten such bounds.
    assert s.baseline_cost is not None and s.baseline_cost - s.cost > 10 * bound
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


def test_a_meter_keeps_the_latest_spans_and_totals_over_all(tmp_path: Path) -> None:
    """A run of weeks marks every iteration: the meter keeps :data:`SPANS_KEPT` spans, and its
    totals and report cover every span, the first one's start included."""
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.05)
    frontier = trace_frontier(make_job(profile, "1f1b", 1, 4, blocking_power_w=BLOCKING_W))
    s = schedule_plans(
        frontier.points, [0.0, 1.0], [9.0, 2.0], iterations=3, deadline_s=2e6, idle_power_w=10.0
    )
    write_schedule(s, frontier, tmp_path / "s.json")
    doc = read_schedule(tmp_path / "s.json")
    meter = CostMeter.of_schedule(doc)  # priced in [1 s, 2e6 s) only, at 2 per kWh
    marks = SPANS_KEPT + 5
    for i in range(marks + 1):  # one span a second, the first second outside the intervals
        meter.mark(float(i), 100.0 * i)
    assert len(meter.spans) == SPANS_KEPT and meter.spans[0] == (5.0, 6.0, 100.0)
    assert meter.outside_j == pytest.approx(100.0)
    assert meter.incurred == pytest.approx(2.0 * 100.0 * (marks - 1) / J_PER_KWH)
    r = meter.report(doc)
    assert r.scheduled_outside_j == pytest.approx(10.0)  # idle power x the first second


class _Priced(np.ndarray):
    """Interval values that note how many of them each pricing reads."""

    read: ClassVar[list[int]] = []

    def __matmul__(self, other):  # type: ignore[no-untyped-def]
        _Priced.read.append(self.size)
        return np.asarray(self) @ other


def test_a_meter_prices_a_span_against_the_intervals_it_overlaps_only() -> None:
    """A re-planner's meter holds every signal interval (a year of minutes: 525,600): a mark
    priced against all of them took 25 ms on the training thread. Intervals in time order are
    searched; in another order all are read, to the same figures."""
    n = 100_000
    starts, values = np.arange(n) * 60.0, 1.0 + np.arange(n) % 7
    meter = CostMeter(starts, starts + 60.0, values.view(_Priced))
    _Priced.read = []
    for i in range(400):  # 45 s spans of 4.5 kJ, some across a minute's edge
        meter.mark(45.0 * i, 4500.0 * i)
    assert max(_Priced.read) <= 2 and len(_Priced.read) == 399
    # Each span's energy at 100 W over the minutes it touches, priced at theirs.
    once = sum(
        100.0 * values[k] * max(0.0, min(45.0 * (i + 1), 60.0 * (k + 1)) - max(45.0 * i, 60.0 * k))
        for i in range(399)
        for k in {int(45.0 * i // 60), int(45.0 * (i + 1) // 60)}
    )
    assert meter.incurred == pytest.approx(once / J_PER_KWH)
    order = np.arange(n)[::-1]
    shuffled = CostMeter(starts[order], starts[order] + 60.0, values[order])
    for i in range(400):
        shuffled.mark(45.0 * i, 4500.0 * i)
    assert shuffled.incurred == pytest.approx(meter.incurred) and shuffled.outside_j == 0.0


class _Interval:
    """A schedule interval that counts the reads of its start."""

    reads: ClassVar[list[int]] = [0]

    def __init__(self, k: int) -> None:
        self._start_s, self.end_s = 60.0 * k, 60.0 * k + 50.0 + k % 3
        self.value, self.busy_s, self.energy_j = 1.0 + k % 7, 40.0 + k % 5, 4000.0 + k

    @property
    def start_s(self) -> float:
        _Interval.reads[0] += 1
        return self._start_s


def test_a_report_at_each_interval_change_does_not_rescan_the_intervals_passed() -> None:
    """The power hook reports at every interval change (a year of minutes: 525,600): each
    report summed every interval passed again, a cost growing with the run on the training
    thread. The whole intervals are summed once; the figures are the same to the bit."""
    from types import SimpleNamespace

    n = 3000
    schedule: Any = SimpleNamespace(
        intervals=tuple(_Interval(k) for k in range(n)), idle_power_w=7.0
    )
    meter = CostMeter.of_schedule(schedule)
    _Interval.reads[0] = 0
    reports = []
    for k in range(n):  # a mark inside each interval, a report after it
        meter.mark(60.0 * k + 30.0, 1000.0 * k)
        reports.append(meter.report(schedule))
    assert _Interval.reads[0] <= 10 * n  # was n * n / 2: every interval passed, every report
    for r in reports[:: n // 7]:  # the figures of the plain sum over the intervals passed
        scheduled, inside_s = 0.0, 0.0
        for iv in schedule.intervals:
            if iv.start_s >= r.elapsed_s:
                break
            passed = min(r.elapsed_s, iv.end_s) - iv.start_s
            scheduled += iv.value * (iv.energy_j + 7.0 * max(0.0, passed - iv.busy_s)) / J_PER_KWH
            inside_s += passed
        assert r.scheduled == scheduled
        assert r.scheduled_outside_j == 7.0 * max(0.0, r.elapsed_s - 30.0 - inside_s)
