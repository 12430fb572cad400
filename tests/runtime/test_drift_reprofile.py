"""Profiling again after a drift: only the ops whose measured times left the profile are swept
again; the other rows are kept as they were, and the re-plan is made from the merged profile."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.io import load_profile, write_profile_csv
from perseus.profile.model import Profile, build_profile
from perseus.runtime.agent.records import OpRecord
from perseus.runtime.drift import ops_to_profile
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.profiling.pair_sweep import PairSweep
from perseus.runtime.profiling.sweep import ClockSweep
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Kind, build_schedule
from tests.runtime._engines import run_ranks

BLOCKING_W = 83.64


def _profile(stale_stage: int | None = None) -> Profile:
    """A100 stages 0-1 at a fifth of their time, every 4th clock; ``stale_stage``'s rows 30 %
    faster and cheaper than the GPU runs them (a profile gone stale for that stage only)."""
    base = scale_profile(take_stages(load_profile("a100"), 2), 0.2)
    rows = []
    for (stage, kind), op in base.ops.items():
        f = 0.7 if stage == stale_stage else 1.0
        for i, o in enumerate(op.options):
            if i % 4 == 0:
                rows.append((stage, kind, o.freq_mhz, o.time_s * f, o.energy_j * f))
    return build_profile(rows, source="truth")


def _iterate(session: RankSession) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank]:
            with session.op(action):
                pass


def _stale_session(tmp_path: Path, **options: Any) -> RankSession:
    """A one-GPU session (stages 0 and 1) planned from a cache whose stage 1 is stale: the
    first iterations drift and profile it again."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    cache = cache_dir / "profile.csv"
    write_profile_csv(_profile(stale_stage=1), cache)
    os.chmod(cache, 0o600)
    gpu = SimulatedGPU.from_profile(
        _profile(),
        blocking_power_w=BLOCKING_W,
        state_dir=tmp_path / "sim",
        set_latency_s=0.0,
        publish_interval_s=0.01,
    )
    return RankSession(
        build_schedule("interleaved", 2, 2, virtual_stages=2),
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache, patience=1),
        options=SessionOptions(watchdog=False, handle_signals=False, **options),
    )


@contextlib.contextmanager
def _opened(session: RankSession) -> Iterator[RankSession]:
    """``with session``, its warnings silenced and its host overruns not counted: a drift is
    the profile's alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with session:
            session._run.take_overruns = lambda: 0  # type: ignore[method-assign]
            yield session


def _until_profiled_again(session: RankSession) -> None:
    while not any(h.phase == "profile" for h in session.history) or session.profiling:
        _iterate(session)
        assert len(session.history) < 400


def test_a_drift_on_one_stage_profiles_that_stage_again_and_keeps_the_others_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _profile()
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    cache = cache_dir / "profile.csv"
    stale_profile = _profile(stale_stage=1)
    write_profile_csv(stale_profile, cache)
    os.chmod(cache, 0o600)
    before = cache.read_text().splitlines()
    gpu = SimulatedGPU.from_profile(
        truth,
        blocking_power_w=BLOCKING_W,
        state_dir=tmp_path / "sim",
        set_latency_s=0.0,
        publish_interval_s=0.01,
    )
    schedule = build_schedule("interleaved", 2, 2, virtual_stages=2)  # stages 0 and 1, one GPU
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache, patience=1),
        options=SessionOptions(watchdog=False, handle_signals=False),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with session:
            assert not session.profiling  # planned from the (stale) cache
            monkeypatch.setattr(session._run, "take_overruns", lambda: 0)  # about the profile
            while session.profiling or all(h.phase == "run" for h in session.history):
                _iterate(session)
                assert len(session.history) < 400
            profiled = session.profiled
            _iterate(session)  # the re-plan runs
    phases = [h.phase for h in session.history]
    assert phases[:3] == ["run"] * 3 and "profile" in phases  # drifted, then profiled again
    # Only stage 1 was swept again; stage 0's rows are the cached ones, byte for byte.
    assert set(session.clocks_profiled) == {(1, Kind.F), (1, Kind.B)}
    after = cache.read_text().splitlines()
    assert any(r.startswith("0,") for r in before)
    assert [r for r in after if r.startswith("0,")] == [r for r in before if r.startswith("0,")]
    assert [r for r in after if r.startswith("1,")] != [r for r in before if r.startswith("1,")]
    # The re-plan uses the new rows: measured, not the stale ones.
    assert profiled is not None and session.job is not None
    assert session.job.profile == profiled
    assert all(profiled.op(0, k) == stale_profile.op(0, k) for k in (Kind.F, Kind.B))
    for kind in (Kind.F, Kind.B):
        for o in profiled.op(1, kind).options:
            assert o.time_s == pytest.approx(truth.op(1, kind).at(o.freq_mhz).time_s, rel=0.03)
    stale, replanned = session.history[0], session.history[-1]
    assert replanned.phase == "run" and replanned.predicted_time_s and stale.predicted_time_s
    assert replanned.predicted_time_s > 1.1 * stale.predicted_time_s  # stage 1 is slower


def test_a_drift_after_clock_control_was_lost_does_not_end_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Set calls kept failing (the controller went observe-only, "instead of killing
    training") with the GPU left above the plan's clocks: the drift that follows does not
    start a sweep, which needs to set clocks and refused with a ConfigError out of the
    iteration; the run goes on, observe-only."""
    from perseus.errors import DeviceError

    truth = _profile()
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    cache = cache_dir / "profile.csv"
    write_profile_csv(truth, cache)
    os.chmod(cache, 0o600)
    gpu = SimulatedGPU.from_profile(
        truth,
        blocking_power_w=BLOCKING_W,
        state_dir=tmp_path / "sim",
        set_latency_s=0.0,
        publish_interval_s=0.01,
    )
    schedule = build_schedule("interleaved", 2, 2, virtual_stages=2)
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache, patience=1),
        options=SessionOptions(watchdog=False, handle_signals=False),
    )
    with _opened(session):
        assert session.frontier is not None and session.agent is not None
        for _ in range(3):
            _iterate(session)  # the fastest point: the GPU locked high
        placed = session.gpu
        assert isinstance(placed, SimulatedGPU)
        placed.inject_error("set_locked_clock", DeviceError("set failed"), times=10)
        session.deploy(session.frontier, len(session.frontier.points) - 1)  # the slowest
        for _ in range(12):
            _iterate(session)
        assert session.agent.observe_only and not session.profiling
    assert "profiling again to re-plan" in caplog.text  # the drift was there
    assert "not profiling again: clock control was lost" in caplog.text
    assert {h.phase for h in session.history} == {"run"}


def test_an_op_not_swept_runs_at_the_steps_clock_and_records_nothing() -> None:
    profiler = ClockSweep([(1, Kind.F)], [1410, 1395, 1380])
    assert profiler.clock_for(0, Kind.F) == profiler.clock_for(1, Kind.F) == 1410
    profiler.record(0, Kind.F, 1.0, 1.0)  # not swept: ignored
    profiler.record(1, Kind.F, 1.0, 1.0)
    profiler.end_iteration()
    assert profiler.clock_for(0, Kind.F) == 1395
    assert [r[:2] for r in profiler.rows()] == [(1, Kind.F)]
    empty = ClockSweep([], [1410, 1395])  # a rank with nothing to profile again
    assert empty.done and empty.clock_for(0, Kind.B) == 1410
    pairs = PairSweep([], [1410, 1395], [1593, 1215], blocking_power_w=BLOCKING_W)
    assert pairs.done and pairs.plan_op_for(0, Kind.B) == ((1410, 1593, 0),)


def _agree_rank(rank: int, world: int, slow: float) -> list[Any]:
    """Rank 1's backward ops measured ``slow`` x their profiled time, the rest on the profile."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    profile = _profile()
    schedule = build_schedule("1f1b", 2, 4)
    records = []
    for it in range(6):  # iterations 0-2 are before the drift (patience 3): not judged
        for i, a in enumerate(schedule.rank_actions[rank]):
            f = 1410 if it >= 3 else 990
            t = profile.op(a.stage_index, a.kind).at(f).time_s
            t *= slow if (it >= 3 and rank == 1 and a.kind is Kind.B) else 1.0
            records.append(OpRecord(it, i, a, f, t * (2.0 if it < 3 else 1.0), 0.0))
    agent = _RecentOnly(rank, 6, records)
    return sorted(ops_to_profile(agent, schedule, profile, None))  # type: ignore[arg-type]


class _RecentOnly:
    """An agent's records that may be read from the end only (:meth:`recent_ops`): reading
    them all (``records``, up to 100,000 built on the training thread) fails."""

    def __init__(self, rank: int, iteration: int, ops: list[OpRecord]) -> None:
        self.rank, self.iteration, self._ops, self.asked = rank, iteration, ops, 0

    @property
    def records(self) -> Any:
        raise AssertionError("read every record kept")

    def recent_ops(self, count: int) -> tuple[OpRecord, ...]:
        self.asked += count
        return tuple(self._ops[-count:])


def test_choosing_the_ops_to_profile_again_reads_only_the_last_iterations_records() -> None:
    """A long run keeps up to 100,000 records; the re-profile reads the last patience + 1
    iterations' (the drift judged on them alone), not all of them."""
    profile = _profile()
    schedule = build_schedule("1f1b", 2, 4)
    actions = schedule.rank_actions[0]
    records = []
    for it in range(1000):
        for i, a in enumerate(actions):
            t = profile.op(a.stage_index, a.kind).at(1410).time_s
            t *= 1.3 if (it >= 997 and a.kind is Kind.F) else (2.0 if it < 997 else 1.0)
            records.append(OpRecord(it, i, a, 1410, t, 0.0))
    agent = _RecentOnly(0, 1000, records)
    assert ops_to_profile(agent, schedule, profile, None) == {(0, Kind.F)}  # type: ignore[arg-type]
    assert agent.asked <= 4 * len(actions)


def test_every_rank_agrees_on_the_ops_that_drifted_or_on_all_when_none_did() -> None:
    drifted = run_ranks(2, _agree_rank, 1.3)
    assert drifted[0] == drifted[1] == [(1, Kind.B)]
    every = sorted((s, k) for s in (0, 1) for k in (Kind.F, Kind.B))
    assert run_ranks(2, _agree_rank, 1.02) == [every, every]  # within the tolerance


def test_a_hooks_plan_at_the_drift_does_not_replace_the_sweeps_clocks(tmp_path: Path) -> None:
    """A boundary hook returning its plan every iteration (a straggler runtime) at the boundary
    where a drift starts the sweep again: every profiling iteration still runs the sweep's
    clocks (before, the first ran the hook's plan while the sweep recorded its op times as
    measured at the clocks it meant to set)."""
    session = _stale_session(tmp_path)
    ran_at_profiling: list[bool] = []
    with _opened(session):
        planned = session.frontier
        assert planned is not None
        session.add_boundary_hook(lambda stats: (planned, 0))  # every iteration, any phase
        while not any(h.phase == "profile" for h in session.history) or session.profiling:
            sweep = session._sweep
            with session.iteration():
                agent = session.agent
                assert agent is not None
                if sweep is not None:  # the clocks the sweep measures next
                    wanted = sweep.sweep_plan().points[0].freqs_mhz
                    ran_at_profiling.append(agent.plan.points[0].freqs_mhz == wanted)
                for action in session.schedule.rank_actions[session.rank]:
                    with session.op(action):
                        pass
            assert len(session.history) < 400
    assert ran_at_profiling and all(ran_at_profiling)


def test_a_straggler_runtime_follows_the_plan_made_from_a_profile_again(tmp_path: Path) -> None:
    """A straggler runtime holds the frontier it was made with: after a drift, the plan made
    from the new profile was undone at the next boundary (the runtime's decision on the old
    frontier deployed again, its predictions the stale ones that drifted). The session now
    hands the hook its new frontier."""
    from perseus.runtime.straggler.switching import StragglerRuntime

    session = _stale_session(tmp_path)
    with _opened(session):
        stale = session.frontier
        assert stale is not None
        straggler = StragglerRuntime(stale, pipeline_index=0, num_pipelines=1)
        session.add_boundary_hook(straggler)
        _until_profiled_again(session)
        replanned = session.frontier
        assert replanned is not None and replanned is not stale
        for _ in range(3):
            _iterate(session)
        agent = session.agent
        assert agent is not None
        assert session.frontier is replanned and agent.plan is replanned
        assert straggler.frontier is replanned
    assert session.history[-1].predicted_time_s == replanned.points[0].time_s


def test_a_power_cap_follows_the_plan_made_from_a_profile_again(tmp_path: Path) -> None:
    """The power hook (``power_store=``) held the frontier it was attached with: the next cap
    after a drift undid the plan made from the new profile (the capped point of the old
    frontier deployed again, its predictions the stale ones). It now decides on the new
    frontier, within the cap."""
    import torch.distributed as dist

    from perseus.runtime.power import set_cap

    store = dist.HashStore()
    session = _stale_session(tmp_path, power_store=store)
    with _opened(session):
        stale = session.frontier
        assert stale is not None and len(stale.points) > 2
        cap_w = stale.points[len(stale.points) // 2].avg_power_w
        set_cap(store, cap_w)
        _until_profiled_again(session)
        replanned = session.frontier
        assert replanned is not None and replanned is not stale
        cap_w = stale.points[-2].avg_power_w  # a lower cap, decided on the new frontier
        set_cap(store, cap_w)
        for _ in range(3):
            _iterate(session)
        agent = session.agent
        assert agent is not None and agent.plan is replanned
        assert replanned.points[agent.point_index].avg_power_w <= cap_w


def test_a_plan_made_again_runs_the_options_point_not_the_index_deployed_before(
    tmp_path: Path,
) -> None:
    """The slowest point deployed (by the user, or a power or straggler hook) before a drift:
    the plan made from the new profile was installed at that index, which on the new
    frontier names another point, or none: here 167 of ~134 points, a PlanError out of the
    training loop at the sweep's end. The new plan starts at the options' point, as the
    first one did."""
    session = _stale_session(tmp_path)
    with _opened(session):
        stale = session.frontier
        assert stale is not None
        session.deploy(stale, len(stale.points) - 1)
        _until_profiled_again(session)
        replanned = session.frontier
        assert replanned is not None and replanned is not stale
        _iterate(session)
    assert session.point_index == 0 and session.history[-1].point_index == 0
    assert session.history[-1].predicted_time_s == replanned.points[0].time_s
