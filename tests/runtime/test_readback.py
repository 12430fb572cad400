"""Closing the loop: what the GPU ran, read back inside each op, against the plan; drift of
measured against predicted figures; the summary that says when it does not measure the plan."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceNotSupportedError, DevicePermissionError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.agent.readback import (
    ClockHeldWarning,
    HeldClockReport,
    HeldOp,
    OpReading,
    clock_delivery,
)
from perseus.runtime.drift import PATIENCE, DriftMonitor
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.metrics import CSV_FIELDS, _csv_row, iteration_metrics
from perseus.runtime.summary import IterationStats, drift_cause, summarize, waited_share
from perseus.schedule import Kind, build_schedule

BLOCKING_W = 83.64
CAP = 0x4  # NVML's SW power cap reason
IDLE = 0x1


# ------------------------------------------------------------------------------------------
# Per-iteration delivery and the one warning


def test_delivery_counts_op_time_at_the_planned_clock_and_names_held_ops():
    readings = [
        OpReading("0F0", 1410, 1410, 1410, 0, 1.0),  # delivered
        OpReading("0F1", 1410, 1410, 1005, CAP, 3.0),  # held by the power cap
        OpReading("0B0", 1410, 1410, 1200, 0, 5.0),  # held, no reason set
        OpReading("0B1", 1095, 1410, 1410, 0, 7.0),  # read before its clock was applied: left out
        OpReading("0F2", 1410, 1410, 1410, IDLE, 9.0),  # read in a gap: left out
        OpReading("0F3", 1410, None, None, 0, 11.0),  # not read
    ]
    delivery = clock_delivery(readings)
    assert delivery is not None and delivery.ops_read == 3
    assert delivery.share_at_plan == pytest.approx(1.0 / 9.0)
    assert delivery.held == (
        HeldOp("0F1", 1410, 1005, ("sw_power_cap",)),
        HeldOp("0B0", 1410, 1200, ("no_reason_reported",)),
    )
    assert str(delivery.held[0]) == "0F1 planned 1410 MHz, ran 1005 MHz (power cap)"
    assert clock_delivery([OpReading("0F0", 1410, None, None, 0, 1.0)]) is None


def test_a_hold_is_warned_once_and_again_only_when_it_changes():
    report = HeldClockReport(0, "H100")
    held = clock_delivery(
        [OpReading("0F0", 1980, 1980, 1500, CAP, 1.0), OpReading("0B0", 1980, 1980, 1980, 0, 1.0)]
    )
    more = clock_delivery(
        [OpReading("0F0", 1980, 1980, 1485, CAP, 1.0), OpReading("0B0", 1980, 1980, 1700, CAP, 1.0)]
    )
    hot = clock_delivery([OpReading("0F0", 1980, 1980, 1200, CAP | 0x40, 1.0)])  # HW thermal too
    fine = clock_delivery([OpReading("0F0", 1980, 1980, 1980, 0, 1.0)])
    with pytest.warns(ClockHeldWarning, match=r"0F0 planned 1980 MHz, ran 1500 MHz \(power cap\)"):
        report.update(held, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.update(held, 1) is None  # the same hold: no second warning
        assert report.update(more, 2) is None  # more ops caught held, the same cause
    with pytest.warns(ClockHeldWarning, match=r"power cap \+ thermal \(HW\)"):
        report.update(hot, 3)  # another reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.update(held, 4) is None
        assert report.update(fine, 5) is None  # delivered again
    with pytest.warns(ClockHeldWarning):
        report.update(held, 6)  # held afresh


# ------------------------------------------------------------------------------------------
# The simulated GPU's cap through the agent


def _h100(tmp_path: Path, clock: VirtualClock, cap_w: float | None) -> SimulatedGPU:
    return SimulatedGPU.from_preset(
        "h100",
        state_dir=tmp_path / str(cap_w),
        clock=clock,
        set_latency_s=0.0,
        publish_interval_s=0.0,
        power_cap_w=cap_w,
    )


def _top_clock_plan():  # type: ignore[no-untyped-def]
    """One rank's 1F1B ops, every one at the H100's top clock."""
    from tests.runtime.plans import tiny_plan

    actions = build_schedule("1f1b", 1, 4).rank_actions[0]
    return tiny_plan(
        1980, stage_ops=(tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions),)
    )


def _run(agent: RankAgent, gpu: SimulatedGPU, iterations: int) -> list[float]:
    times = []
    actions = build_schedule("1f1b", 1, 4).rank_actions[0]
    for _ in range(iterations):
        agent.step_begin()
        for a in actions:
            with agent.op(a.kind, a.microbatch_index):
                gpu.launch(a.stage_index, a.kind)
                agent.mark_op_end()
        times.append(agent.step_end().time_s)
    return times


def test_a_cap_halves_a_locked_top_clocks_throughput_and_is_flagged_in_the_first_iteration(
    tmp_path: Path,
):
    """An H100 locked at its top clock (1980 MHz) under a 300 W cap runs near half its
    clock: twice the time. The runtime reads it back and warns within the first iteration,
    naming the ops, planned and applied clocks and the power cap."""
    clock = VirtualClock()
    free, capped = _h100(tmp_path, clock, None), _h100(tmp_path, clock, 300.0)
    plan = _top_clock_plan()
    times = {}
    for name, gpu in (("free", free), ("capped", capped)):
        agent = RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False, clock=clock).start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            times[name] = _run(agent, gpu, 1)
            record = agent.records.iterations[0]
        agent.close()
        held = [w for w in caught if issubclass(w.category, ClockHeldWarning)]
        delivery = record.clock_delivery
        assert delivery is not None and delivery.ops_read == 8
        if name == "free":
            assert not held and delivery.share_at_plan == 1.0 and not delivery.held
        else:
            assert len(held) == 1
            assert "power cap" in str(held[0].message) and "planned 1980 MHz" in str(
                held[0].message
            )
            assert delivery.share_at_plan == 0.0 and len(delivery.held) == 8
            assert all(
                h.applied_mhz <= 1050 and h.reasons == ("sw_power_cap",) for h in delivery.held
            )
    assert times["capped"][0] / times["free"][0] >= 1.9  # throughput halved


def test_a_steady_cap_keeps_each_held_op_once_however_many_iterations_hold_it(tmp_path: Path):
    """Every iteration under a steady cap holds the same ops at the same clocks: the agent's
    iteration records (up to 100,000) share those held ops rather than keep new ones per
    iteration (64 ops: 11 KB an iteration, over 1 GB per rank)."""
    clock = VirtualClock()
    gpu = _h100(tmp_path, clock, 300.0)
    agent = RankAgent(
        _top_clock_plan(), gpu, 0, watchdog=False, handle_signals=False, clock=clock
    ).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClockHeldWarning)
        _run(agent, gpu, 60)
    agent.close()
    deliveries = [r.clock_delivery for r in agent.records.iterations]
    assert all(d is not None and len(d.held) == 8 for d in deliveries)
    held = [h for d in deliveries if d is not None for h in d.held]
    assert len(held) == 480
    assert len({id(h) for h in held}) == len(set(held)) <= 16  # one object per held op seen
    assert len({id(d) for d in deliveries}) == len(set(deliveries))


def test_shared_holds_keep_at_most_their_limit():
    from perseus.runtime.agent import readback

    shared = readback.SharedHolds()
    for mhz in range(readback._SHARED_LIMIT + 10):
        op = HeldOp("0F0", 1980, mhz, ("sw_power_cap",))
        assert shared.one(op) is op
        assert shared.one(HeldOp("0F0", 1980, mhz, ("sw_power_cap",))) is op
        assert len(shared) <= readback._SHARED_LIMIT
    readings = [OpReading("0F0", 1980, 1980, 1500, CAP, 1.0)]
    first = clock_delivery(readings, shared)
    assert first is not None and clock_delivery(readings, shared) is first
    assert first == clock_delivery(readings)


def test_read_back_stops_on_a_gpu_that_cannot_tell(tmp_path: Path):
    clock = VirtualClock()
    gpu = _h100(tmp_path, clock, 300.0)
    gpu.inject_error("clock_event_reasons", DeviceNotSupportedError("no reasons here"))
    agent = RankAgent(
        _top_clock_plan(), gpu, 0, watchdog=False, handle_signals=False, clock=clock
    ).start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hold warned: nothing was read
        _run(agent, gpu, 2)
    agent.close()
    assert all(r.clock_delivery is None for r in agent.records.iterations)


@pytest.mark.parametrize("how", ["enabled=False", "refused"])
def test_an_observe_only_agent_reports_ops_the_driver_holds_below_the_plan(
    tmp_path: Path, how: str
):
    """Observe-only, no clock is applied: the driver's own clock is read back against the
    plan's. Under a 300 W cap an H100 cannot run the plan's 1980 MHz (held, power cap, warned
    once); uncapped, the driver runs it (delivered); a plan below the driver's clock is
    neither held nor at the plan."""
    from tests.runtime.plans import tiny_plan

    clock = VirtualClock()
    low = tiny_plan(
        1200,
        stage_ops=(
            tuple(
                f"{a.kind.value}{a.microbatch_index}"
                for a in build_schedule("1f1b", 1, 4).rank_actions[0]
            ),
        ),
    )
    for cap_w, plan in ((300.0, _top_clock_plan()), (None, _top_clock_plan()), (None, low)):
        gpu = _h100(tmp_path / str(len(str(plan))), clock, cap_w)
        if how == "refused":  # a container without CAP_SYS_ADMIN: every lock refused
            gpu.inject_error("set_locked_clock", DevicePermissionError("NO_PERMISSION"), 99)
        agent = RankAgent(
            plan,
            gpu,
            0,
            enabled=how != "enabled=False",
            watchdog=False,
            handle_signals=False,
            clock=clock,
        ).start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run(agent, gpu, 2)
        agent.close()
        assert gpu.locked_clock_mhz() is None  # observe-only: nothing was ever set
        held_warnings = [w for w in caught if issubclass(w.category, ClockHeldWarning)]
        deliveries = [r.clock_delivery for r in agent.records.iterations]
        assert all(d is not None and d.ops_read == 8 for d in deliveries)
        if cap_w is not None:
            assert len(held_warnings) == 1, [str(w.message) for w in caught]
            assert "power cap" in str(held_warnings[0].message)
            assert all(
                len(d.held) == 8
                and d.share_at_plan == 0.0  # type: ignore[union-attr]
                and all(h.reasons == ("sw_power_cap",) for h in d.held)  # type: ignore[union-attr]
                for d in deliveries
            )
        elif plan is low:  # the driver ran above the plan: not held, not at the plan
            assert not held_warnings
            assert all(not d.held and d.share_at_plan == 0.0 for d in deliveries)  # type: ignore[union-attr]
        else:
            assert not held_warnings
            assert all(not d.held and d.share_at_plan == 1.0 for d in deliveries)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------
# Drift and the summary


def _stats(i: int, time_s: float, energy_j: float, **kw: object) -> IterationStats:
    return IterationStats(
        iteration=i,
        phase="run",
        point_index=0,
        time_s=time_s,
        energy_j=energy_j,
        compute_time_s=time_s,
        pipeline_energy_j=energy_j,
        predicted_time_s=1.0,
        predicted_energy_j=100.0,
        **kw,  # type: ignore[arg-type]
    )


def test_energy_is_judged_over_counter_periods_not_per_short_iteration(caplog):
    """A 27 ms iteration on an H100 (counter published every 100 ms) reads 0 J or a whole
    70 J step: per iteration every one is far off its prediction, though the run is right on
    average. Energy is judged over 20 counter periods, so only a real drift is said."""
    monitor = DriftMonitor(0, reprofile=True, counter_period_s=0.1)
    steps = [70.0 if i % 4 == 3 else 0.0 for i in range(200)]  # 17.5 J mean
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.session"):
        for i, energy_j in enumerate(steps):
            stats = _stats(i, 0.027, energy_j)
            assert not monitor.update(
                dataclasses.replace(stats, predicted_time_s=0.027, predicted_energy_j=17.5)
            )
        assert not caplog.records
        drifted = [70.0 if i % 3 == 2 else 0.0 for i in range(200)]  # 23.3 J: +33 %
        said = [
            monitor.update(
                dataclasses.replace(
                    _stats(200 + i, 0.027, e), predicted_time_s=0.027, predicted_energy_j=17.5
                )
            )
            for i, e in enumerate(drifted)
        ]
    assert said.count(True) == 1  # the profile is stale: re-profile, once
    (record,) = caplog.records
    assert "energy +" in record.message and "stale profile" in record.message
    # Without the window (each iteration alone) the steady run already drifts.
    alone = DriftMonitor(0, reprofile=True)
    assert any(
        alone.update(
            dataclasses.replace(
                _stats(i, 0.027, e), predicted_time_s=0.027, predicted_energy_j=17.5
            )
        )
        for i, e in enumerate(steps)
    )


def test_a_drift_that_goes_on_keeps_nothing_once_said():
    """A run that stays off its plan for a million iterations must not keep each of them:
    once the drift is said, the monitor holds no more than its patience of iterations."""
    monitor = DriftMonitor(1, reprofile=False)
    for i in range(200):
        monitor.update(_stats(i, 1.3, 120.0))
    assert len(monitor._streak) <= PATIENCE
    # Every iteration beyond the tolerance, their mean within it: never said, never kept.
    swinging = DriftMonitor(1, reprofile=False)
    for i in range(200):
        assert not swinging.update(_stats(i, 1.07 if i % 2 else 0.93, 100.0))
    assert len(swinging._streak) <= PATIENCE


def test_drift_is_said_once_after_a_few_iterations_with_its_cause(caplog):
    monitor = DriftMonitor(0, reprofile=True)
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.session"):
        assert not monitor.update(_stats(0, 1.01, 101.0))  # within tolerance
        assert not monitor.update(_stats(1, 1.3, 120.0))
        assert not monitor.update(_stats(2, 1.3, 120.0))
        assert monitor.update(_stats(3, 1.3, 120.0))  # the profile is stale: re-profile
        assert not monitor.update(_stats(4, 1.3, 120.0))  # said once
        monitor.reset()  # the re-planned profile is deployed
        assert not any(monitor.update(_stats(i, 1.3, 120.0)) for i in range(5, 9))  # once
    record, again = caplog.records
    assert "profiling again" not in again.message
    assert "iterations 1-3" in record.message and "stale profile" in record.message
    assert "profiling again" in record.message
    held = DriftMonitor(1, reprofile=True)  # not rank 0: silent, but the same verdict
    for i in range(3):
        verdict = held.update(
            _stats(i, 2.0, 90.0, pipeline_held_ops=8, held_reasons=("sw_power_cap",))
        )
    assert verdict is False  # held clocks: profiling again would not help


def test_drift_cause_names_held_clocks_overruns_or_a_stale_profile():
    assert drift_cause([_stats(0, 1.0, 100.0), _stats(1, 1.02, 99.0)]) is None
    held = drift_cause([_stats(0, 2.0, 90.0, pipeline_held_ops=3, held_reasons=("sw_power_cap",))])
    assert held is not None and "held below the plan (power cap) in 1 of 1" in held
    overrun = drift_cause([_stats(0, 1.2, 100.0, host_overruns=5)])
    assert overrun is not None and "5 host overruns in emulation" in overrun
    # Overruns alone, figures on the prediction: emulation kept the host's lateness off them.
    assert drift_cause([_stats(0, 1.01, 100.5, host_overruns=5)]) is None
    stale = drift_cause([_stats(0, 0.5, 30.0)])
    assert stale is not None and "time -50.0% and energy -70.0%" in stale


def test_a_pipeline_waiting_for_a_straggler_is_not_profiled_again(caplog):
    """A data-parallel peer 1.3x slower holds this pipeline's iterations 30 % over its plan
    while its own ops run as planned: the drift is said with that cause, and an online-profiled
    session does not profile every op again (it did: no op drifted, so all were swept)."""
    monitor = DriftMonitor(0, reprofile=True)
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.session"):
        said = [
            monitor.update(_stats(i, 1.3, 120.0, pipeline_compute_time_s=1.01)) for i in range(5)
        ]
    assert said == [False] * 5
    (record,) = caplog.records
    assert "22.3% of the time came after the pipeline's last op" in record.message
    assert "profiling again" not in record.message
    # Its own ops off the plan as well: the profile is stale, whatever the wait.
    stale = DriftMonitor(0, reprofile=True)
    assert [stale.update(_stats(i, 1.3, 120.0, pipeline_compute_time_s=1.2)) for i in range(3)][-1]


def test_the_ranks_agree_on_the_pipelines_own_time():
    from perseus.runtime.drift import agree_iteration
    from perseus.runtime.session_types import EndedIteration

    ended = EndedIteration(4, (0.0, 0), None, None, False, 0, None)
    # rank 1 of 3, alone in this process: its window is 1.5 s, its last op ends at 1.2 s
    stats = agree_iteration(ended, (0.25, 1.45, 1.75), 10.0, None, 0, (1, 3, None))
    assert (stats.time_s, stats.compute_time_s) == (1.5, 1.2)
    assert stats.pipeline_compute_time_s == 1.2


def test_the_summary_says_when_its_figures_do_not_measure_the_plan():
    from tests.runtime.plans import tiny_plan

    frontier = tiny_plan()  # one point: 1 s and 100 J predicted, as _stats predicts
    clean = summarize([_stats(i, 1.0, 100.0) for i in range(3)], frontier)
    assert clean is not None and clean.caveat is None and "measure" not in str(clean)
    held = summarize(
        [
            _stats(i, 1.0, 100.0, pipeline_held_ops=2, held_reasons=("sw_power_cap",))
            for i in range(3)
        ],
        frontier,
    )
    assert held is not None and held.caveat is not None
    assert str(held).endswith(held.caveat) and "do not measure the plan" in held.caveat
    assert "power cap" in held.caveat


# ------------------------------------------------------------------------------------------
# Emulation: host overruns per iteration; the metrics export


def test_host_overruns_are_counted_per_iteration(tmp_path: Path):
    import time

    from perseus.runtime.session import RankSession, SessionOptions

    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path, set_latency_s=0.0
    )
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point(job.allmax())])
    schedule = build_schedule("1f1b", 2, 4)
    op_s = max(gpu.op_cost(0, k)[0] for k in (Kind.F, Kind.B))
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(watchdog=False, handle_signals=False),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with session:
            for slow in (False, True, False):
                with session.iteration():
                    for action in schedule.rank_actions[0]:
                        with session.op(action):
                            if slow:
                                time.sleep(op_s * 3)  # the host outlasts the simulated op
    counts = [s.host_overruns for s in session.history]
    assert counts[1] >= len(schedule.rank_actions[0]) - 1  # the slow host's iteration
    assert sum(counts) == session.emulation_overruns  # each counted once, in its iteration


def test_metrics_export_the_clocks_delivered():
    held = (HeldOp("0F0", 1410, 960, ("sw_power_cap",)),)
    stats = _stats(
        0,
        1.0,
        100.0,
        clock_share_at_plan=0.25,
        held_ops=held,
        pipeline_held_ops=3,
        held_reasons=("sw_power_cap",),
        host_overruns=2,
    )
    record = iteration_metrics(stats, rank=0, gpu="sim", frontier=None)
    assert record.clock_share_at_plan == 0.25 and record.pipeline_held_ops == 3
    assert record.host_overruns == 2
    assert json.loads(json.dumps(record.as_dict()))["held_ops"] == [
        {
            "name": "0F0",
            "planned_mhz": 1410,
            "applied_mhz": 960,
            "reasons": ["sw_power_cap"],
            "planned_mem_mhz": None,
            "applied_mem_mhz": None,
        }
    ]
    row = dict(zip(CSV_FIELDS, _csv_row(record), strict=True))
    assert row["held_ops"] == "0F0:1410>960:sw_power_cap" and row["host_overruns"] == 2


def test_a_plan_from_an_online_profile_that_drifts_is_profiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The cached online profile no longer describes the GPU (it slowed down by half): after a
    few iterations off the prediction, with every clock delivered, the session says so once
    and profiles again, instead of running on."""
    import os

    from perseus.io import write_profile_csv
    from perseus.runtime.planning import OnlineProfile
    from perseus.runtime.session import RankSession, SessionOptions

    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.2)  # ops of tens of ms
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    cache = cache_dir / "profile.csv"
    write_profile_csv(profile, cache)
    os.chmod(cache, 0o600)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path / "sim", set_latency_s=0.0
    )
    schedule = build_schedule("1f1b", 1, 4)
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache),
        options=SessionOptions(watchdog=False, handle_signals=False),
    )
    sweeps: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with session:
            assert not session.profiling  # planned from the cache
            monkeypatch.setattr(session, "_start_sweep", lambda options: sweeps.append(1))
            # About the profile, not the host: a loaded machine's host overruns (a cause of
            # their own, which profiling again would not fix) are not counted here.
            emulator = session._run
            assert emulator is not None
            monkeypatch.setattr(emulator, "take_overruns", lambda: 0)
            session.gpu.set_slowdown(1.5)
            for _ in range(5):
                with session.iteration():
                    for action in schedule.rank_actions[0]:
                        with session.op(action):
                            pass
    assert sweeps == [1]  # once, after three iterations off
    assert session.summary is not None and session.summary.caveat is not None
    assert "stale profile" in session.summary.caveat


@pytest.mark.parametrize("new_name", [True, False])
def test_an_nvml_gpu_is_read_back_by_the_worker(tmp_path: Path, new_name: bool):
    """On NVML the worker reads ``nvmlDeviceGetClockInfo`` (SM) and the clock event reasons
    (``...EventReasons``, or ``...ThrottleReasons`` on older drivers) inside the op."""

    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU

    # At activity 0.96 the h100 preset draws 1256 W at 1980 MHz: its 700 W cap holds 1575 MHz.
    device = FakeDevice.from_preset(
        "GPU-h100", "h100", has_event_reasons_name=new_name, activity=0.96
    )
    nvml = FakeNvml(devices=[device])
    gpu = NvmlGPU("GPU-h100", nvml_module=nvml, privileged=True, lock_dir=tmp_path).open()

    ctl = host_timed_worker(gpu, 1980)
    device.busy = True  # the lock is taken; under load the power cap holds the clock down
    job = run_one_op(ctl, 0.05)
    gpu.close()
    assert (job.report.asked_mhz, job.report.read_mhz, job.report.read_reasons) == (1980, 1575, 0x4)
    names = nvml.names()
    assert "nvmlDeviceGetClockInfo" in names
    reasons = "nvmlDeviceGetCurrentClocks" + ("EventReasons" if new_name else "ThrottleReasons")
    assert reasons in names
    delivery = clock_delivery(
        [
            OpReading(
                "F0", 1980, job.report.asked_mhz, job.report.read_mhz, job.report.read_reasons, 1.0
            )
        ]
    )
    assert delivery is not None and delivery.held[0].reasons == ("sw_power_cap",)


def test_a_clock_read_in_the_gap_before_the_op_is_not_taken_for_the_ops(tmp_path: Path):
    """The device idles after an op's start event until its input arrives. A clock read there
    (the lock's, no cap yet) with the reasons read once the op runs (the cap set) looked like
    a delivered clock: the reasons are read on both sides of the clock, and such a reading is
    taken again inside the op."""

    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU

    device = FakeDevice("GPU-h100", graphics_clocks=tuple(range(1980, 344, -15)))
    gpu = NvmlGPU("GPU-h100", nvml_module=FakeNvml(devices=[device]), privileged=True,
                  lock_dir=tmp_path).open()  # fmt: skip
    running = [False]  # the op starts running right after the first clock read

    def clock_mhz() -> int:
        was, running[0] = running[0], True
        return 1575 if was else 1980

    gpu.current_clock_mhz = clock_mhz  # type: ignore[method-assign]
    gpu.clock_event_reasons = lambda: CAP if running[0] else IDLE  # type: ignore[method-assign]

    job = run_one_op(host_timed_worker(gpu, 1980), 0.2)
    gpu.close()
    assert (job.report.read_mhz, job.report.read_reasons) == (1575, CAP)


def host_timed_worker(gpu: Any, freq_mhz: int, mem_freq_mhz: int | None = None) -> Any:
    """A started clock worker whose device events are CUDA-like events on the host's clock,
    with ``freq_mhz`` (and ``mem_freq_mhz``) applied."""
    import time

    from perseus.runtime.agent.controller import FrequencyController
    from tests.runtime.test_clock_timing import _Event

    class Timeline:
        def timeline_now_s(self) -> float:
            return time.perf_counter()

        def record_event(self) -> _Event:
            return _Event(time.perf_counter())

    ctl = FrequencyController(gpu, events=Timeline(), stamp_ops=False)  # type: ignore[arg-type]
    ctl.start()
    ctl.apply_now(freq_mhz, mem_freq_mhz)
    assert ctl.flush(timeout_s=2.0)
    return ctl


def run_one_op(ctl: Any, op_s: float, mem_next_mhz: int | None = None) -> Any:
    """One op of ``op_s`` starting now, handled by the worker, which is then closed; its
    boundary (``.report``: what was read back)."""
    import time

    from perseus.runtime.agent.boundary import Boundary, OpRequest
    from tests.runtime.test_clock_timing import _Event

    now = time.perf_counter()
    request = OpRequest(_Event(now), None, None, mem_next_mhz=mem_next_mhz)  # type: ignore[arg-type]
    job = Boundary(request, end=_Event(now + op_s))  # type: ignore[arg-type]
    ctl.post(job)
    assert ctl.flush(timeout_s=2.0)
    ctl.close()
    return job


def test_an_energy_drift_with_the_time_on_the_plan_is_not_put_on_a_wait(caplog):
    """Time on the prediction (+1 %), energy 20 % over it: only the energy drifted, and the
    profile is stale. The ops ran 4.5 % fast and the optimizer step took the rest (5.4 % of
    the time after the last op): the drift was put on a wait ("the ops themselves ran as
    planned") and an online-profiled session never profiled again."""
    runs = [_stats(i, 1.01, 120.0, pipeline_compute_time_s=0.955) for i in range(3)]
    assert waited_share(runs) is None  # the time is not off: nothing to put on a wait
    cause = drift_cause(runs)
    assert cause is not None and "stale profile" in cause and "last op" not in cause
    monitor = DriftMonitor(0, reprofile=True)
    with caplog.at_level(logging.WARNING, logger="perseus.runtime.session"):
        assert [monitor.update(s) for s in runs][-1]  # every op profiled again (energy only)
    (record,) = caplog.records
    assert "profiling again" in record.message
