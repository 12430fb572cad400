"""RankSession, the engine-neutral session: one process, no process group, a simulated GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError, PlanError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile, PlanFile
from perseus.runtime.session import IterationStats, RankSession, SessionOptions, SessionState
from perseus.schedule import Kind, build_schedule

BLOCKING_W = 83.64

pytestmark = pytest.mark.filterwarnings("ignore::perseus.runtime.emulation.EmulationOverrunWarning")


@pytest.fixture
def profile():  # type: ignore[no-untyped-def]
    return scale_profile(take_stages(load_profile("a100"), 2), 0.02)


@pytest.fixture
def gpu(tmp_path: Path, profile) -> SimulatedGPU:  # type: ignore[no-untyped-def]
    # Virtual time: the device's ops and the host's waits on one clock that only moves when
    # slept on, so every time asserted below is exact whatever the machine's load.
    return SimulatedGPU.from_profile(
        profile,
        blocking_power_w=BLOCKING_W,
        state_dir=tmp_path,
        set_latency_s=0.0,
        clock=VirtualClock(),
    )


def _session(gpu, profile, checked=False, **kwargs):  # type: ignore[no-untyped-def]
    schedule = build_schedule("1f1b", 2, 4)
    options = SessionOptions(
        blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False, **kwargs
    )
    # A plan without the solver (fast): all-max, and every op at 1095 MHz.
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point(job.allmax()), job.point([1095] * job.graph.num_nodes)])
    # With the profile the plan was made for (checked): allmax_plan() works.
    source = PlanFile(plan, profile) if checked else plan
    return RankSession(schedule, 0, gpu=gpu, plan=source, options=options)


def _iteration(session: RankSession) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank]:
            with session.op(action):
                pass


def test_session_runs_iterations_and_records_predicted_and_measured(gpu, profile):
    with _session(gpu, profile) as session:
        assert session.frontier is not None and session.agent is not None
        for _ in range(3):
            _iteration(session)
        assert session.agent.wait_for_clock()
        assert gpu.locked_clock_mhz() is not None  # the agent set clocks
    assert gpu.locked_clock_mhz() is None  # and close() reset them
    assert len(session.history) == 3
    stats = session.history[-1]
    assert isinstance(stats, IterationStats)
    assert stats.phase == "run" and stats.point_index == 0
    assert stats.predicted_time_s == session.frontier.points[0].time_s
    assert stats.time_s > 0 and stats.energy_j >= 0


def test_failed_iteration_leaves_the_session_usable(gpu, profile):
    with _session(gpu, profile) as session:
        _iteration(session)
        actions = session.schedule.rank_actions[0]
        with pytest.raises(RuntimeError, match="boom"), session.iteration():
            with session.op(actions[0]):
                pass
            raise RuntimeError("boom")
        _iteration(session)  # no "step_begin() called twice"
    assert len(session.history) == 2


def test_two_engine_steps_in_one_iteration_are_refused_with_a_clear_message(gpu, profile):
    with _session(gpu, profile) as session:
        actions = session.schedule.rank_actions[0]
        with pytest.raises(PlanError, match="one engine step"), session.iteration():
            for action in actions + actions:  # gradient accumulation: two steps
                with session.op(action):
                    pass
        _iteration(session)


def test_ops_outside_an_iteration_run_untouched(gpu, profile):
    with _session(gpu, profile) as session:
        action = session.schedule.rank_actions[0][0]
        with session.op(action):  # e.g. an evaluation pass between iterations
            pass
        _iteration(session)
    assert len(session.history) == 1


def test_bad_arguments_are_config_errors(gpu, profile):
    schedule = build_schedule("1f1b", 2, 4)
    with pytest.raises(ConfigError, match="plan= takes a plan source"):
        RankSession(schedule, 0, gpu=gpu, plan=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="out of range"):
        RankSession(
            schedule, 5, gpu=gpu, plan=profile, options=SessionOptions(blocking_power_w=BLOCKING_W)
        )
    session = _session(gpu, profile)
    with pytest.raises(PlanError, match="out of range"):
        _session(gpu, profile, point_index=7).start()
    with pytest.raises(ConfigError, match="before start"), session.iteration():
        pass


@pytest.mark.filterwarnings("ignore::perseus.runtime.emulation.EmulationOverrunWarning")
def test_online_profiling_runs_through_the_agent_and_deploys_a_plan(tmp_path):
    """One rank, emulated: the sweep's clocks go through the agent and controller, op times
    come from the simulated GPU's events, op energy from its counter (published every 100 ms,
    scaled like the ops), and the measured profile matches the device's."""
    truth = scale_profile(take_stages(load_profile("a100"), 1), 0.1)
    gpu = SimulatedGPU.from_profile(
        truth,
        blocking_power_w=BLOCKING_W,
        state_dir=tmp_path,
        set_latency_s=0.0,
        publish_interval_s=0.1 * 0.1,
        clock=VirtualClock(),  # virtual time: the counter sampler reads as the clock's timer
    )
    schedule = build_schedule("1f1b", 1, 4)
    cache = tmp_path / "profile.csv"
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=OnlineProfile(cache=cache),
        options=SessionOptions(blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False),
    )
    with session:
        assert session.profiling and session.frontier is None
        agent = session.agent  # emulation runs the real agent -> controller -> device path
        assert agent is not None and agent.device_timed and not agent.observe_only
        assert agent.clock is gpu.clock  # the sweep's counter reads are paced on it
        while session.profiling:
            _iteration(session)
            assert len(session.history) < 400  # steps repeat until 20 counter windows
        assert session.frontier is not None and cache.exists()
        _iteration(session)
    assert session.history[0].phase == "profile" and session.history[-1].phase == "run"
    profiled = session.profiled
    assert profiled is not None
    energy_err = []
    for (stage, kind), op in profiled.ops.items():
        for o in op.options:
            ref = truth.op(stage, kind).at(o.freq_mhz)
            assert o.time_s == pytest.approx(ref.time_s, rel=0.05)
            energy_err.append(abs(o.energy_j / ref.energy_j - 1))
    # Energy is fitted to 10 ms counter windows (100 ms scaled), on virtual time: no host stall
    # moves a window, so every row is within 0.5 % (0.22 % at worst), identical run to run.
    assert sorted(energy_err)[len(energy_err) // 2] < 0.002 and max(energy_err) < 0.005


def test_safety_is_on_by_default():
    import inspect

    from perseus.runtime.pipeline import PerseusPipeline

    for cls in (RankSession, PerseusPipeline):
        assert inspect.signature(cls).parameters["options"].default is None, cls
    assert SessionOptions().watchdog is True and SessionOptions().handle_signals is True


def test_a_real_gpus_counter_is_never_read_on_the_training_thread(
    profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML counter reads cost ~3 ms (p99 ~25 ms on an H100): the worker reads the counter as
    the device passes each boundary (the first start, after an evaluation pass, each end);
    the session and the agent share the iteration-end reading."""
    import threading

    from tests.runtime.test_agent import _cuda_like_events, counting_gpu

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    gpu, readers = counting_gpu()
    session = _session(gpu, profile, events=_cuda_like_events())
    with session:
        assert session.agent is not None and session.agent.device_timed
        for i in range(3):
            _iteration(session)
            if i == 1:  # an evaluation pass: the next iteration marks a fresh start
                with session.op(session.schedule.rank_actions[0][0]):
                    pass
    main = threading.current_thread().name
    assert readers.count(main) == 0
    # The first start, the fresh one after evaluation, and the agent's start and end stamps.
    assert len(readers) == 2 + 2 * 3
    assert all(s.energy_j > 0 for s in session.history)


def _deferred_run(profile, gate, wait_for_figures: bool):  # type: ignore[no-untyped-def]
    """Three iterations on a counting NVML GPU with CUDA-like events; per iteration, what the
    training thread saw at its end: (history length, iterations the hook got, counter reads
    on this thread, device still short of the end)."""
    import threading

    from tests.runtime.test_agent import _cuda_like_events, counting_gpu

    gpu, readers = counting_gpu()
    hooked: list[int] = []
    seen = []
    main = threading.current_thread().name
    session = _session(gpu, profile, events=_cuda_like_events(), wait_for_figures=wait_for_figures)
    with session:
        session.add_boundary_hook(lambda stats: hooked.append(stats.iteration))
        for _ in range(3):
            _iteration(session)
            seen.append(
                (len(session.history), list(hooked), readers.count(main), not gate.is_set())
            )
            gate.set()  # the device passes everything recorded so far
    assert readers.count(main) == 0
    return session.history, seen, hooked


def test_a_real_gpus_iteration_end_never_waits_and_its_figures_come_one_iteration_later(
    profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At an iteration's end the training thread neither synchronizes the device nor reads
    the counter: it marks the end and goes on while the device is still short of it (events
    incomplete); the worker reads the counter as the device passes it, and the figures reach
    the history and the hooks at the next end (the last at close()), equal to those read at
    once with ``wait_for_figures=True``."""
    import threading

    from tests.runtime.test_agent import _HostEvent

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    main = threading.current_thread().name
    syncs: list[str] = []
    gate = threading.Event()  # set: the device has passed every event recorded so far
    monkeypatch.setattr(_HostEvent, "query", lambda self: gate.is_set())
    monkeypatch.setattr(
        _HostEvent, "synchronize", lambda self: syncs.append(threading.current_thread().name)
    )
    guard = threading.Timer(60.0, gate.set)  # a wait on the training thread cannot hang
    guard.start()
    try:
        history, seen, hooked = _deferred_run(profile, gate, wait_for_figures=False)
    finally:
        guard.cancel()
    assert syncs.count(main) == 0
    # The first end returned with the device short of it; each end delivers the one before.
    assert seen == [(0, [], 0, True), (1, [0], 0, False), (2, [0, 1], 0, False)]
    assert [s.iteration for s in history] == hooked == [0, 1, 2]  # the last one at close()
    gate.set()
    at_once, seen_at_once, _ = _deferred_run(profile, gate, wait_for_figures=True)
    assert [n for n, *_ in seen_at_once] == [1, 2, 3]
    assert [s.energy_j for s in history] == [s.energy_j for s in at_once]
    assert all(s.energy_j > 0 and s.time_s > 0 for s in history)


def test_a_hooks_plan_on_a_real_gpu_runs_from_the_next_iteration_to_start(
    profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iteration 0's figures reach the hook at iteration 1's end: the plan it returns runs
    from iteration 2 on (with ``wait_for_figures=True``, from iteration 1)."""
    from tests.runtime.test_agent import _cuda_like_events, counting_gpu

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    for wait, first in ((False, 2), (True, 1)):
        session = _session(
            counting_gpu()[0], profile, events=_cuda_like_events(), wait_for_figures=wait
        )
        with session:
            frontier = session.frontier
            session.add_boundary_hook(lambda s, f=frontier: (f, 1) if s.iteration == 0 else None)
            for _ in range(4):
                _iteration(session)
        assert [s.point_index for s in session.history] == [0] * first + [1] * (4 - first)


def test_a_hook_returning_the_running_plan_every_iteration_deploys_nothing(gpu, profile):
    """An adaptive StragglerRuntime returns its decision every iteration, mostly the plan
    running already: that is no new plan. Each re-deploy restarted the summary's stretch (1
    iteration summarised of 6) and the drift watch, and swapped the agent's plan."""
    with _session(gpu, profile) as session:
        agent = session.agent
        assert agent is not None
        running = agent._rank_plan
        session.add_boundary_hook(lambda stats: (session.frontier, session.point_index))
        for _ in range(6):
            _iteration(session)
        assert agent._rank_plan is running
    assert session.summary is not None and session.summary.iterations == 5  # less the first


def test_a_hooks_frontier_is_compared_with_the_schedule_once(
    gpu, profile, monkeypatch: pytest.MonkeyPatch
):
    """A hook returning its frontier every iteration: its stage ops (every rank's actions:
    131,072 for 1F1B 64 x 1024) are compared with the schedule's once, not each iteration;
    a point out of range is still refused."""
    from perseus.plan import Frontier

    reads = []
    ops = Frontier.rank_actions
    monkeypatch.setattr(
        Frontier, "rank_actions", property(lambda f: reads.append(1) or ops.__get__(f))
    )
    point = [1]
    with _session(gpu, profile) as session:
        frontier = session.frontier
        session.add_boundary_hook(lambda stats: (frontier, point[0]))
        for _ in range(2):
            _iteration(session)
        first = len(reads)
        for _ in range(4):
            _iteration(session)
        assert len(reads) == first
        point[0] = 2
        with pytest.raises(PlanError, match="point 2 is out of range"):
            _iteration(session)
    assert [s.point_index for s in session.history[:3]] == [0, 1, 1]


def test_without_a_device_timeline_the_session_times_on_its_clock(
    profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU without device events (NVML without CUDA) is timed on the host, through the
    session's clock seam (``SessionOptions(clock=...)``): on a virtual clock, exactly."""
    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    nvml = FakeNvml(devices=[FakeDevice("GPU-host")])
    gpu = NvmlGPU("GPU-host", nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    clock = VirtualClock()
    with _session(gpu, profile, clock=clock) as session:
        assert session.agent is not None and session.agent.events is None
        for _ in range(2):
            with session.iteration():
                for action in session.schedule.rank_actions[0]:
                    with session.op(action):
                        clock.sleep(0.01)
    assert [s.time_s for s in session.history] == pytest.approx([0.08, 0.08])


def test_a_failed_counter_read_entering_an_iteration_leaves_the_session_usable(
    profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's counter read as an iteration begins fails (host timing, NVML): the error
    propagates from ``with session.iteration():`` and the next iteration runs."""
    from perseus.device.fake_nvml import FakeDevice, FakeNvml
    from perseus.device.nvml import NvmlGPU
    from perseus.errors import DeviceError

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    nvml = FakeNvml(devices=[FakeDevice("GPU-flaky")])
    gpu = NvmlGPU("GPU-flaky", nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    with _session(gpu, profile, clock=VirtualClock()) as session:
        _iteration(session)
        nvml.fail("nvmlDeviceGetTotalEnergyConsumption", nvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(DeviceError), session.iteration():
            pytest.fail("the iteration's body ran")
        assert session.state is SessionState.IDLE
        _iteration(session)
    assert [s.iteration for s in session.history] == [0, 1]


def test_a_hook_that_removes_itself_leaves_the_next_hook_its_stats(gpu, profile):
    seen: list[tuple[str, int]] = []

    def once(stats: IterationStats) -> None:
        seen.append(("once", stats.iteration))
        session.remove_boundary_hook(once)

    with _session(gpu, profile) as session:
        session.add_boundary_hook(once)
        session.add_boundary_hook(lambda stats: seen.append(("every", stats.iteration)))
        for _ in range(2):
            _iteration(session)
    assert seen == [("once", 0), ("every", 0), ("every", 1)]


def test_a_failed_gpu_reset_at_close_keeps_the_runs_summary(gpu, profile):
    from perseus.errors import DeviceError

    session = _session(gpu, profile).start()
    for _ in range(2):
        _iteration(session)
    placed = session.gpu
    assert isinstance(placed, SimulatedGPU)
    placed.inject_error("reset_locked_clock", DeviceError("reset failed"))
    with pytest.raises(DeviceError, match="reset failed"):
        session.close()
    assert session.state is SessionState.CLOSED
    assert session.summary is not None


def test_session_options_are_checked_when_built():
    with pytest.raises(ConfigError, match="blocking_power_w must be >= 0"):
        SessionOptions(blocking_power_w=-1.0)
    with pytest.raises(ConfigError, match="point_index must be >= 0"):
        SessionOptions(point_index=-1)


# ------------------------------------------------------------------------------------------
# The lifecycle: new -> idle -> in iteration -> idle -> closed, each transition


def test_lifecycle_states_and_every_transition(gpu, profile):
    from perseus.runtime.session import SessionState

    session = _session(gpu, profile)
    assert session.state is SessionState.NEW
    with pytest.raises(ConfigError, match="before start"), session.iteration():
        pass
    assert session.start() is session and session.state is SessionState.IDLE
    assert session.start() is session  # idempotent while open
    with session.iteration():
        assert session.state is SessionState.IN_ITERATION and session.in_iteration
        with pytest.raises(ConfigError, match="inside another one"), session.iteration():
            pass
        for action in session.schedule.rank_actions[0]:
            with session.op(action):
                pass
    assert session.state is SessionState.IDLE and len(session.history) == 1
    session.close()
    assert session.state is SessionState.CLOSED
    session.close()  # idempotent
    with pytest.raises(ConfigError, match="after close"), session.iteration():
        pass
    with pytest.raises(ConfigError, match="after close"):
        session.start()


def test_close_inside_an_iteration_discards_it(gpu, profile):
    session = _session(gpu, profile).start()
    _iteration(session)
    with session.iteration():
        with session.op(session.schedule.rank_actions[0][0]):
            pass
        session.close()
    assert len(session.history) == 1
    assert gpu.locked_clock_mhz() is None


def test_evaluation_between_iterations_runs_untouched_and_is_not_counted(gpu, profile):
    """An evaluation pass (forward actions outside `with session.iteration():`) after the
    first iteration runs untouched: no plan-order error, no op on the device, and the next
    iteration's window starts after it."""
    with _session(gpu, profile) as session:
        _iteration(session)
        forwards = [a for a in session.schedule.rank_actions[0] if a.kind is Kind.F]
        ops_before = len(session.agent.records.ops)  # type: ignore[union-attr]
        for action in forwards:  # eval: forward only, between iterations
            with session.op(action):
                gpu.clock.sleep(0.01)
        assert len(session.agent.records.ops) == ops_before  # type: ignore[union-attr]
        _iteration(session)
        _iteration(session)
    assert len(session.history) == 3
    # The evaluation's time is not in the second iteration (a fresh start after it): on
    # virtual time it takes exactly as long as the third, back-to-back one.
    assert session.history[1].time_s == pytest.approx(session.history[2].time_s, rel=1e-9)


def test_an_iteration_with_fewer_actions_than_one_step_is_refused_and_discarded(gpu, profile):
    with _session(gpu, profile) as session:
        actions = session.schedule.rank_actions[0]
        refused = pytest.raises(PlanError, match=r"ran 1 of the 8 actions of one engine step")
        with refused, session.iteration(), session.op(actions[0]):  # e.g. forward-only inside
            pass
        _iteration(session)  # usable
    assert len(session.history) == 1


def test_history_compares_pipeline_with_pipeline(gpu, profile):
    with _session(gpu, profile) as session:
        for _ in range(3):
            _iteration(session)
    for stats in session.history:
        # One process: the pipeline's energy is this rank's (a sum over one rank).
        assert stats.pipeline_energy_j == pytest.approx(stats.energy_j)
        assert stats.predicted_energy_j == session.frontier.points[0].energy_j  # type: ignore[union-attr]
    assert session.summary is not None
    assert "predicted" in str(session.summary)


# ------------------------------------------------------------------------------------------
# Emulation that cannot mislead


def test_a_simulated_gpu_means_emulation(gpu, profile):
    """A simulated GPU is always emulated: ops run on the simulated stream, so the iteration
    takes the simulated time."""
    with _session(gpu, profile) as session:
        assert session.emulate
        for _ in range(3):
            _iteration(session)
    stats = session.history[-1]
    assert stats.predicted_time_s is not None
    # Rank 0 alone: its compute is its ops' simulated time (the other rank's work is not run).
    own_s = sum(gpu.op_cost(a.stage_index, a.kind)[0] for a in session.schedule.rank_actions[0])
    assert stats.compute_time_s >= own_s * 0.99


def test_two_emulated_jobs_at_once_do_not_collide(profile, monkeypatch: pytest.MonkeyPatch):
    """Two jobs on one machine, each with the README's SimulatedGPU.from_profile(...) (index
    0, default state directory): each gets its own job directory, neither is busy."""
    monkeypatch.delenv("PERSEUS_SIM_DIR", raising=False)
    jobs = [
        _session(SimulatedGPU.from_profile(profile, blocking_power_w=BLOCKING_W), profile)
        for _ in range(2)
    ]
    for session in jobs:
        session.start()
    try:
        assert jobs[0].gpu.state_dir != jobs[1].gpu.state_dir
        for _ in range(2):
            for session in jobs:
                _iteration(session)
    finally:
        for session in jobs:
            session.close()
    assert [len(s.history) for s in jobs] == [2, 2]


def test_zero_bubble_runs_on_a_simulated_gpu_from_a_profile_without_weight_rows(profile):
    """ZB-H1 on the README's simulated GPU (its profile has no 'weight' rows): W ops are
    priced as the planner splits the backward, so nothing crashes mid-step."""
    assert not profile.has_weight
    schedule = build_schedule("zb", 2, 4)
    job = make_job(profile, "zb", 2, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point(job.allmax())])
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=BLOCKING_W, set_latency_s=0.0)
    session = RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False),
    )
    with session:
        for _ in range(2):
            _iteration(session)
        b_s = session.gpu.op_cost(0, Kind.B)[0]
        w_s = session.gpu.op_cost(0, Kind.W)[0]
    full_s = profile.op(0, Kind.B).options[0].time_s
    assert b_s == pytest.approx(full_s / 2) and w_s == pytest.approx(full_s / 2)
    assert len(session.history) == 2


def test_the_summary_covers_the_last_deployed_plan_only(gpu, profile):
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point([1095] * job.graph.num_nodes)])
    """An all-max phase then a plan: the summary at close is the plan's iterations (the first,
    which applies the new clocks, left out), even when both are point 0 of their frontiers."""
    with _session(gpu, profile, checked=True) as session:
        session.deploy(session.allmax_plan(), 0)
        for _ in range(2):
            _iteration(session)
        session.deploy(plan, 0)
        for _ in range(3):
            _iteration(session)
    summary = session.summary
    assert summary is not None
    assert summary.iterations == 2 and summary.point_index == 0
    assert summary.predicted_energy_j == plan.points[0].energy_j


def test_a_long_run_keeps_a_bounded_history_and_summarises_what_it_kept(gpu, profile):
    """Millions of iterations must not keep millions of figures: the history keeps the
    latest ``history_kept`` (at most twice that between cuts), and the summary counts the
    iterations it covers."""
    with _session(gpu, profile, history_kept=3) as session:
        for _ in range(10):
            _iteration(session)
    assert 3 <= len(session.history) < 6
    assert [s.iteration for s in session.history] == list(range(10 - len(session.history), 10))
    summary = session.summary
    assert summary is not None and summary.iterations == len(session.history) - 1
    with pytest.raises(ConfigError, match="history_kept"):
        SessionOptions(history_kept=0)


def test_blocking_power_comes_from_the_device_when_not_given(tmp_path: Path, profile):
    """Without ``blocking_power_w`` the session asks the device: a simulated GPU declares its
    own; a GPU whose name no preset knows is refused with a message naming the parameter."""
    schedule = build_schedule("1f1b", 2, 4)
    options = SessionOptions(watchdog=False, handle_signals=False)
    declared = SimulatedGPU.from_profile(profile, blocking_power_w=71.5, state_dir=tmp_path)
    session = RankSession(schedule, 0, gpu=declared, plan=profile, options=options)
    assert session.blocking_power_w == 71.5
    session.close()

    class Unknown:
        name = "Some Accelerator X"

    with pytest.raises(ConfigError, match="blocking_power_w") as e:
        RankSession(schedule, 0, gpu=Unknown(), plan=profile, options=options)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


def test_an_emulated_job_leaves_no_files_behind(tmp_path: Path):
    """The job's directory (its simulated GPUs' state and lock files, the shared timeline) is
    removed when the process exits, after the agent's exit reset."""
    import os
    import subprocess
    import sys

    script = """
from perseus.device.clock import RealClock, VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule

profile = scale_profile(take_stages(load_profile("a100"), 1), 0.02)
job = make_job(profile, "1f1b", 1, 4, blocking_power_w=83.64)
plan = job.frontier([job.point(job.allmax())])
gpu = SimulatedGPU.from_profile(profile, blocking_power_w=83.64, set_latency_s=0.0)
session = RankSession(build_schedule("1f1b", 1, 4), 0, gpu=gpu, plan=plan).start()
for _ in range(2):
    with session.iteration():
        for action in session.schedule.rank_actions[0]:
            with session.op(action):
                pass
print(session.gpu.state_dir)
"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert job_dir.parent == tmp_path and job_dir.name.startswith("perseus-job-")
    assert not job_dir.exists(), sorted(p.name for p in job_dir.iterdir())


def test_on_a_virtual_clock_a_mixed_clock_plan_times_the_same_in_every_run(tmp_path, profile):
    """A simulated GPU on a virtual clock lends its clock to the session's agent: the clock
    worker runs inline, not on a thread racing the training thread in real time, so a plan
    that changes clocks between ops times the same in every run (it once varied by a few %)."""
    runs = []
    for k in range(2):
        (tmp_path / str(k)).mkdir()
        gpu = SimulatedGPU.from_profile(
            profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path / str(k),
            set_latency_s=0.0, clock=VirtualClock(),
        )  # fmt: skip
        job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
        freqs = [1410 if i % 2 else 1095 for i in range(job.graph.num_nodes)]
        options = SessionOptions(blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False)
        plan = job.frontier([job.point(freqs)])
        with RankSession(build_schedule("1f1b", 2, 4), 0, gpu=gpu, plan=plan, options=options) as s:
            assert s.agent is not None and s.agent.controller is not None
            assert not s.agent.controller.threaded
            for _ in range(6):
                _iteration(s)
        runs.append([it.time_s for it in s.history])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("where", ["timeline", "dag"])
def test_an_emulated_job_that_fails_to_start_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A failure before the exit cleanup is registered (the timeline file refused: a full
    disk; the schedule's graph) removed nothing: an empty ``perseus-job-*`` directory (or one
    holding the timeline) stayed in ``$TMPDIR`` per try. What was made goes with the error."""
    import errno
    import tempfile

    from perseus.device.simulated import SimulatedGPU
    from perseus.io import load_profile
    from perseus.runtime import emulation
    from perseus.runtime.emulation import scale_profile, start_emulation, take_stages
    from perseus.schedule import build_schedule

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if where == "timeline":
        monkeypatch.setattr(emulation.VirtualTimeline, "create", refused)
    else:
        monkeypatch.setattr(emulation, "build_dag", refused)
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.02)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=83.64, set_latency_s=0.0)
    with pytest.raises(OSError, match="No space left"):
        start_emulation(gpu, build_schedule("1f1b", 1, 4), 0, None)
    assert list(tmp_path.iterdir()) == []


def test_a_plan_object_for_another_job_is_named_plan_object(gpu, profile):  # type: ignore[no-untyped-def]
    """A Frontier object checked against another job's profile began its PlanError with 200
    characters of the object's repr ("schema_version=3 job=JobSpec(...")."""
    job = make_job(profile, "1f1b", 2, 8, blocking_power_w=BLOCKING_W)
    plan = job.frontier([job.point(job.allmax())])  # 8 microbatches, the session runs 4
    options = SessionOptions(blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False)
    schedule = build_schedule("1f1b", 2, 4)
    with pytest.raises(PlanError, match=r"^plan \(object\): "):
        RankSession(schedule, 0, gpu=gpu, plan=PlanFile(plan, profile), options=options).start()
