"""How a RankSession's run ends: an error marking an iteration's end, a plan deployed outside
the session's life, an iteration cut short (one simulated GPU, one process, virtual time)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError, DeviceError, PlanError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.engines.torch_hooks import instrument_stages
from perseus.runtime.session import RankSession, SessionOptions, SessionState
from perseus.schedule import build_schedule
from tests.runtime._engines import Recorder

BLOCKING_W = 83.64

pytestmark = pytest.mark.filterwarnings("ignore::perseus.runtime.emulation.EmulationOverrunWarning")


@pytest.fixture
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedGPU:
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    return SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path, set_latency_s=0.0,
        clock=VirtualClock(),
    )  # fmt: skip


def _plan() -> Frontier:
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    return job.frontier([job.point(job.allmax()), job.point([1095] * job.graph.num_nodes)])


def _session(gpu: SimulatedGPU) -> RankSession:
    plan = _plan()
    options = SessionOptions(blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False)
    return RankSession(build_schedule("1f1b", 2, 4), 0, gpu=gpu, plan=plan, options=options)


def _iteration(session: RankSession, actions: int | None = None) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank][:actions]:
            with session.op(action):
                pass


def _perseus_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("perseus")]


@pytest.mark.parametrize("error", [DeviceError("end mark failed"), KeyboardInterrupt()])
def test_an_error_marking_an_iterations_end_leaves_the_session_usable(
    gpu: SimulatedGPU, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """A device error (or a signal) at the end mark: that iteration is discarded, the next one
    runs (it was refused as nested forever: the session stayed in the failed iteration)."""
    with _session(gpu) as session:
        _iteration(session)

        def failing_close(agent: RankAgent) -> None:
            agent.step_abort()
            raise error

        with monkeypatch.context() as m:
            m.setattr(RankAgent, "step_close", failing_close)
            with pytest.raises(type(error)):
                _iteration(session)
        assert session.state is SessionState.IDLE
        _iteration(session)
    assert [s.iteration for s in session.history] == [0, 1]
    assert gpu.locked_clock_mhz() is None


def test_deploy_outside_an_open_session_is_refused_and_starts_nothing(gpu: SimulatedGPU) -> None:
    """deploy() before start() or after close() started an agent that nothing closed: its clock
    thread ran on, the GPU stayed owned (a later session on it: DeviceBusyError)."""
    session = _session(gpu)
    with pytest.raises(ConfigError, match=r"deploy\(\) before start\(\)"):
        session.deploy(_plan(), 1)
    assert session.agent is None
    with session:
        _iteration(session)
    with pytest.raises(ConfigError, match=r"deploy\(\) after close\(\)"):
        session.deploy(_plan(), 1)
    assert session.agent is None and _perseus_threads() == []
    with _session(gpu) as again:  # the GPU is free
        _iteration(again)


def test_an_iteration_cut_short_shows_the_ranks_grid_in_the_errors_detail(
    gpu: SimulatedGPU,
) -> None:
    with _session(gpu) as session:
        with pytest.raises(PlanError) as info:
            _iteration(session, actions=3)
        error = info.value
        assert "\n" not in error.message and "ran 3 of the 8 actions" in error.message
        assert "Step 03  0F2!" in error.detail and "iteration end!" in error.detail
        _iteration(session)
    assert [s.iteration for s in session.history] == [0]


def test_the_agents_own_short_iteration_error_keeps_its_grid_in_the_detail(
    gpu: SimulatedGPU,
) -> None:
    session = _session(gpu)
    assert session.frontier is None
    with session:
        agent = session.agent
        assert agent is not None
        agent.step_begin()
        with agent.op(session.schedule.rank_actions[0][0]):
            pass
        with pytest.raises(PlanError) as info:
            agent.step_close()
        error = info.value
        assert "\n" not in error.message and "ended after 1 of 8" in error.message
        assert "Step 01  0F1!" in error.detail and "step_end()!" in error.detail


def test_a_run_shorter_than_the_energy_counter_needs_says_its_energy_is_not_measured(
    gpu: SimulatedGPU,
) -> None:
    """Three 11 ms iterations on a 100 ms counter read 0 J: the summary claimed a 100 %
    saving, put down to another GPU or a stale profile."""
    with _session(gpu) as session:
        for _ in range(3):
            _iteration(session)
    summary = session.summary
    assert summary is not None and summary.measured_energy_j == 0.0
    assert summary.caveat is not None and "the energy is not measured" in summary.caveat
    assert "energy -100" not in summary.caveat and "run longer" in summary.caveat


class _Stage:
    """A pipeline stage's compute methods (what instrument_stages wraps)."""

    stage_index = 0

    def forward_one_chunk(self, chunk_id: int) -> None: ...

    def backward_one_chunk(self, chunk_id: int, full_backward: bool = True) -> None: ...

    def backward_weight_one_chunk(self, chunk_id: int) -> None: ...


def test_a_second_session_on_the_same_stages_is_refused_and_the_first_keeps_its_hooks() -> None:
    """A second PerseusPipeline on an open one's torch schedule (its start failing: the GPU
    is owned) undid the first's wrappers with its own: the first's next iteration ran 0 of its
    actions, a PlanError blaming the training loop."""
    stage, first = _Stage(), Recorder()
    undo = instrument_stages([stage], first)
    with pytest.raises(ConfigError, match="stage 0 is already instrumented by another open"):
        instrument_stages([stage], Recorder())
    stage.forward_one_chunk(0)
    assert first.events == [("enter", "0F0"), ("exit", "0F0")]
    undo()
    instrument_stages([stage], Recorder())()  # free again once the first let go
