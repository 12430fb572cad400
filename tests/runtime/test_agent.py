"""The rank agent on a simulated GPU: clocks per op, order checks, records, plan swaps."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from perseus.device.clock import VirtualClock
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.simulated import SimulatedGPU
from perseus.errors import PlanError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.agent import OpOrderError
from perseus.runtime.agent.rank_agent import NullAgent, RankAgent, make_agent
from perseus.schedule import Action, Kind, build_schedule
from tests.runtime.plans import tiny_plan


@pytest.fixture
def gpu(tmp_path: Path) -> SimulatedGPU:
    return SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.0
    )


def _agent(plan, gpu, rank=0, **kwargs):  # type: ignore[no-untyped-def]
    return RankAgent(plan, gpu, rank, watchdog=False, handle_signals=False, **kwargs)


def _run_iteration(agent: RankAgent, ops: tuple[Action, ...]) -> list[int | None]:
    """Run the ops in order; return the GPU's lock seen inside each op."""
    seen = []
    agent.step_begin()
    for a in ops:
        with agent.op(a):
            agent.wait_for_clock()
            seen.append(agent.gpu.locked_clock_mhz())  # type: ignore[union-attr]
    agent.step_end()
    return seen


def test_each_op_runs_at_its_planned_clock(tmp_path: Path) -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", 8, 4, blocking_power_w=83.64)
    flat = job.allmax().copy()
    clocks = [1410, 1095, 990, 1200]
    flat[:] = [clocks[i % 4] for i in range(len(flat))]
    plan = job.frontier([job.point(flat)])
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=83.64, state_dir=tmp_path, set_latency_s=0.0
    )
    rank = 3
    with _agent(plan, gpu, rank=rank) as agent:
        seen = _run_iteration(agent, plan.rank_actions[rank])
        assert seen == list(plan.points[0].freqs_mhz[rank])
        assert agent.planned_clocks_mhz == plan.points[0].freqs_mhz[rank]
    assert gpu.locked_clock_mhz() is None  # reset on close


def test_planned_clocks_are_snapped_to_the_device(gpu: SimulatedGPU) -> None:
    plan = tiny_plan(freq_mhz=1100)
    with _agent(plan, gpu) as agent:
        assert agent.planned_clocks_mhz == (1095,) * 4
        assert _run_iteration(agent, plan.rank_actions[0]) == [1095] * 4


def test_wrong_op_names_expected_and_actual(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    with _agent(plan, gpu) as agent:
        agent.step_begin()
        with agent.op("F", 0):
            pass
        expected = r"expects op 1 .* 'F1' but the training loop ran 'B0'"
        with pytest.raises(PlanError, match=expected), agent.op(Kind.B, 0):
            pass


def test_out_of_order_op_shows_the_rank_op_grid_with_the_failing_step_marked(
    gpu: SimulatedGPU,
) -> None:
    ops = tuple(f"{k}{m}" for m in range(12) for k in "FB")  # a long schedule: 24 ops
    plan = tiny_plan(stage_ops=(ops, ops))
    with _agent(plan, gpu, rank=1) as agent:
        agent.step_begin()
        for a in plan.rank_actions[1][:10]:
            with agent.op(a):
                pass
        with pytest.raises(PlanError) as info, agent.op("B", 6):
            pass
    summary, _, grid = str(info.value).partition("\n")
    assert "expects op 10 of iteration 0 to be 'F5' but the training loop ran 'B6'" in summary
    assert grid.splitlines() == [  # a window of steps around the failing one, marked
        "         Rank 1 planned  ran",
        "...",
        "Step 07  1B3",
        "Step 08  1F4",
        "Step 09  1B4",
        "Step 10  1F5!            1B6!",
        "Step 11  1B5",
        "Step 12  1F6",
        "Step 13  1B6",
        "...",
    ]


def test_wrong_stage_is_caught(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    with _agent(plan, gpu, rank=1) as agent:
        agent.step_begin()
        # rank 1 holds stage 1
        with pytest.raises(PlanError, match="'F0@0'"), agent.op("F", 0, stage_index=0):
            pass


def test_multi_stage_rank_ops(gpu: SimulatedGPU) -> None:
    ops = (("F0@0", "F0@2", "B0@2", "B0@0"), ("F0@1", "F0@3", "B0@3", "B0@1"))
    plan = tiny_plan(stage_ops=ops)
    with _agent(plan, gpu, rank=0) as agent:
        agent.step_begin()
        for stage, kind in ((0, "F"), (2, "F"), (2, "B"), (0, "B")):
            with agent.op(kind, 0, stage_index=stage):
                pass
        agent.step_end()
        agent.step_begin()
        expected = "'F0@0' but the training loop ran 'F0@2'"
        with pytest.raises(PlanError, match=expected), agent.op("F", 0, stage_index=2):
            pass


def test_too_few_and_too_many_ops(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    with _agent(plan, gpu) as agent:
        agent.step_begin()
        with agent.op("F", 0):
            pass
        with pytest.raises(
            PlanError, match="ended after 1 of 4 planned ops; the next planned op was 'F1'"
        ) as info:
            agent.step_end()
        assert "Step 01  0F1!" in str(info.value) and "step_end()!" in str(info.value)
        _run_iteration(agent, plan.rank_actions[0])
        agent.step_begin()
        for a in plan.rank_actions[0]:
            with agent.op(a):
                pass
        with pytest.raises(PlanError, match="only 4 ops") as info, agent.op("F", 2):
            pass
        assert str(info.value).splitlines()[-1] == "Step 04                  0F2!"


def test_op_outside_iteration(gpu: SimulatedGPU) -> None:
    with _agent(tiny_plan(), gpu) as agent:
        with pytest.raises(PlanError, match="step_begin"), agent.op("F", 0):
            pass
        with pytest.raises(PlanError, match="without step_begin"):
            agent.step_end()
        agent.step_begin()
        with pytest.raises(PlanError, match="twice"):
            agent.step_begin()


def test_records_time_and_energy(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, clock=VirtualClock(), set_latency_s=0.0, publish_interval_s=0.0
    )
    plan = tiny_plan()
    with _agent(plan, gpu) as agent:
        assert agent.device_timed
        agent.step_begin()
        agent.wait_for_clock()  # step_begin() applies the first op's clock
        for a in plan.rank_actions[0]:
            with agent.op(a):
                gpu.launch(0, a.kind)  # returns at once: the device runs it later
        record = agent.step_end()
        ops = agent.records.ops
        assert [o.op for o in ops] == list(plan.rank_actions[0])
        assert all(o.freq_mhz == 1095 for o in ops)
        # Op time and energy are the device's, from events, not the host's launch time.
        for o in ops:
            time_s, energy_j = gpu.op_cost(0, o.op.kind)
            assert o.time_s == pytest.approx(time_s, abs=1e-3)  # + the launch gap
            assert o.energy_j == pytest.approx(energy_j, abs=0.05)
        assert record.iteration == 0 and record.num_ops == 4 and record.point_index == 0
        assert record.time_s >= sum(o.time_s for o in ops)
        assert record.energy_j >= sum(o.energy_j for o in ops) - 1e-3
        assert record.energy_j > 0
        assert agent.records.iterations == (record,)
        assert record.planned_time_s == plan.points[0].time_s


def test_recent_ops_are_the_end_of_the_records(gpu: SimulatedGPU) -> None:
    """What the online sweep reads each iteration: the last ops, as ``records`` ends, within
    the cap (oldest dropped)."""
    plan = tiny_plan()
    with _agent(plan, gpu, timing="host", max_op_records=6) as agent:
        assert agent.recent_ops(4) == ()
        for _ in range(3):
            _run_iteration(agent, plan.rank_actions[0])
        ops = agent.records.ops
        assert len(ops) == 6 and [o.iteration for o in ops] == [1, 1, 2, 2, 2, 2]
        for count in (0, 1, 4, 6, 50):
            assert agent.recent_ops(count) == ops[len(ops) - min(count, 6) :]


def test_swap_plan_takes_effect_at_next_iteration(gpu: SimulatedGPU) -> None:
    plan = tiny_plan(freq_mhz=1410, points=3)
    with _agent(plan, gpu) as agent:
        assert _run_iteration(agent, plan.rank_actions[0]) == [1410] * 4
        agent.step_begin()
        agent.swap_plan(plan, point_index=2)  # mid-iteration: the current one is unchanged
        for a in plan.rank_actions[0]:
            with agent.op(a):
                agent.wait_for_clock()
                assert gpu.locked_clock_mhz() == 1410
        agent.step_end()
        assert _run_iteration(agent, plan.rank_actions[0]) == [1380] * 4
        assert agent.records.iterations[-1].point_index == 2


def test_swap_plan_rejects_other_job(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    other = tiny_plan(stage_ops=(("F0", "B0", "F1", "B1"), ("F0", "B0", "F1", "B1")))
    with _agent(plan, gpu) as agent:
        with pytest.raises(PlanError, match="differ"):
            agent.swap_plan(other)
        with pytest.raises(PlanError, match="point_index 5"):
            agent.swap_plan(plan, point_index=5)


def test_bad_rank_and_point() -> None:
    with pytest.raises(PlanError, match="rank 7"):
        RankAgent(tiny_plan(), None, 7)
    with pytest.raises(PlanError, match="point_index 1"):
        RankAgent(tiny_plan(), None, 0, point_index=1)


def test_disabled_agent_measures_without_touching_clocks(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    with RankAgent(plan, gpu, 0, enabled=False) as agent:
        assert agent.observe_only
        _run_iteration(agent, plan.rank_actions[0])
        assert gpu.locked_clock_mhz() is None
        assert len(agent.records.ops) == 4
    # Not the owner: another agent can take the GPU meanwhile.
    assert not gpu.owner_lock_path().exists() or gpu.owner_lock_path().read_text() == ""


def test_agent_without_gpu_still_checks_order() -> None:
    plan = tiny_plan()
    with RankAgent(plan, None, 0) as agent:
        agent.step_begin()
        with pytest.raises(PlanError), agent.op("B", 0):
            pass


def test_null_agent_is_inert() -> None:
    agent = make_agent(tiny_plan(), None, 0)
    assert isinstance(agent, NullAgent)
    with agent:
        agent.step_begin()
        with agent.op("anything", 99):
            pass
        assert agent.step_end() is None
    assert agent.records.ops == ()
    assert isinstance(make_agent(tiny_plan(), object(), 0, enabled=False), NullAgent)  # type: ignore[arg-type]


def test_close_is_idempotent_and_restartable(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    agent = _agent(plan, gpu)
    agent.start()
    _run_iteration(agent, plan.rank_actions[0])
    agent.close()
    agent.close()
    assert gpu.locked_clock_mhz() is None
    agent.start()
    _run_iteration(agent, plan.rank_actions[0])
    assert gpu.locked_clock_mhz() == 1095
    agent.close()


def test_a_close_cut_short_before_its_reset_leaves_the_exit_reset_armed(
    gpu: SimulatedGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT (KeyboardInterrupt) or SIGTERM landing while close() stops the worker: the
    exit hooks, which the signal runs, still reset the GPU and give it up."""
    plan = tiny_plan()
    agent = _agent(plan, gpu).start()
    _run_iteration(agent, plan.rank_actions[0])
    assert agent.wait_for_clock() and gpu.locked_clock_mhz() == 1095
    ctl = agent.controller
    assert ctl is not None

    def interrupted(timeout_s: float = 1.0) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ctl, "close", interrupted)
    with pytest.raises(KeyboardInterrupt):
        agent.close()
    agent._emergency_close()  # what the atexit hook and the SIGTERM/SIGINT handlers run
    assert gpu.locked_clock_mhz() is None
    with _agent(plan, gpu):  # the GPU was given up
        pass


def test_a_restart_after_an_exception_inside_an_iteration_begins_afresh(
    gpu: SimulatedGPU,
) -> None:
    plan = tiny_plan()
    actions = plan.rank_actions[0]
    agent = _agent(plan, gpu)
    with pytest.raises(RuntimeError, match="transient"), agent:
        agent.step_begin()
        with agent.op(actions[0]):
            pass
        raise RuntimeError("transient")
    with agent:  # not "step_begin() called twice"
        assert _run_iteration(agent, actions) == [1095] * 4
    assert [r.iteration for r in agent.records.iterations] == [0]
    assert gpu.locked_clock_mhz() is None


def test_a_device_that_can_record_no_event_is_still_reset_at_close(gpu: SimulatedGPU) -> None:
    """A sticky CUDA error inside an op: every event record raises. Discarding the iteration
    (which ends its open op) must not stop close() from resetting the GPU."""

    class Breaking:
        broken = False

        def record_event(self):  # type: ignore[no-untyped-def]
            if self.broken:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return gpu.record_event()

        def timeline_now_s(self) -> float:
            return gpu.timeline_now_s()

    events = Breaking()
    plan = tiny_plan()
    with (
        pytest.raises(RuntimeError, match="illegal memory access"),
        _agent(plan, gpu, events=events) as agent,
    ):
        agent.step_begin()
        with agent.op(plan.rank_actions[0][0]):
            assert agent.wait_for_clock() and gpu.locked_clock_mhz() == 1095
            events.broken = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert gpu.locked_clock_mhz() is None


def test_exception_in_loop_resets_and_propagates(gpu: SimulatedGPU) -> None:
    plan = tiny_plan()
    with pytest.raises(RuntimeError, match="boom"), _agent(plan, gpu) as agent:
        _run_iteration(agent, plan.rank_actions[0])
        raise RuntimeError("boom")
    assert gpu.locked_clock_mhz() is None


def test_unprivileged_simulated_gpu_warns_once_and_measures(tmp_path: Path) -> None:
    from perseus.device.base import ObserveOnlyWarning

    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0, privileged=False)
    plan = tiny_plan(freq_mhz=1095)
    with _agent(plan, gpu) as agent:
        with pytest.warns(ObserveOnlyWarning, match="NO_PERMISSION") as caught:
            for _ in range(3):
                _run_iteration(agent, plan.rank_actions[0])
        assert len(caught) == 1
        assert agent.observe_only
        assert len(agent.records.iterations) == 3
    assert gpu.locked_clock_mhz() is None


def test_no_clock_is_set_before_the_first_iteration(gpu: SimulatedGPU) -> None:
    """Set-up and evaluation before training run at the GPU's default clock."""
    plan = tiny_plan()
    with _agent(plan, gpu) as agent:
        assert agent.controller is not None and agent.controller.flush()
        assert gpu.locked_clock_mhz() is None
        agent.step_begin()
        assert agent.controller.flush()
        assert gpu.locked_clock_mhz() == agent.planned_clocks_mhz[0]
        for a in plan.rank_actions[0]:
            with agent.op(a):
                pass
        agent.step_end()
    assert gpu.locked_clock_mhz() is None


class _HostEvent:
    """A CUDA-like event: completes at once, carries no counter reading."""

    def __init__(self) -> None:
        import time

        self._t = time.perf_counter()
        self.energy_mj: int | None = None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def device_time_s(self) -> float:
        return self._t


def _cuda_like_events():  # type: ignore[no-untyped-def]
    import time

    from perseus.runtime.agent.events import CudaEventSource

    class HostEvents(CudaEventSource):
        def __init__(self) -> None:  # no CUDA here: events on the host clock
            pass

        def record_event(self) -> _HostEvent:  # type: ignore[override]
            return _HostEvent()

        def recycle(self) -> None:
            pass

        def timeline_now_s(self) -> float:
            return time.perf_counter()

    return HostEvents()


def counting_gpu(lock_dir: Path | None = None) -> tuple[NvmlGPU, list[str]]:
    """An NVML GPU (fake) whose energy counter notes which thread reads it; each read adds
    1 J. Returns the GPU and the readers' thread names, in order."""
    readers: list[str] = []

    def energy_mj(now_s: float) -> int:
        readers.append(threading.current_thread().name)
        return 1000 * len(readers)

    nvml = FakeNvml(devices=[FakeDevice("GPU-counting", energy_fn=energy_mj)])
    return NvmlGPU("GPU-counting", nvml_module=nvml, privileged=True, lock_dir=lock_dir), readers


@pytest.mark.parametrize("inside", ["step_abort", "step_end"])
def test_an_iteration_given_up_inside_an_op_leaves_the_worker_free(
    tmp_path: Path, inside: str
) -> None:
    """step_abort() (or a refused step_end()) inside an op: the op's posted boundary still
    gets its end, so the worker goes on to the next iterations' boundaries instead of waiting
    for it for ever (every later clock change lost, every iteration end waiting on it)."""
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, clock=VirtualClock(), set_latency_s=0.0, publish_interval_s=0.0
    )
    plan = tiny_plan()
    actions = plan.rank_actions[0]
    with _agent(plan, gpu) as agent:
        ctl = agent.controller
        assert ctl is not None and not ctl.threaded  # inline: deterministic
        agent.step_begin()
        with agent.op(actions[0]):
            if inside == "step_abort":
                agent.step_abort()
            else:
                with pytest.raises(PlanError, match="ended after 0 of 4"):
                    agent.step_end()
        assert ctl.flush()
        _run_iteration(agent, actions)
        assert ctl.flush()  # every boundary handled
        assert [r.iteration for r in agent.records.iterations] == [0]


def test_a_failed_counter_read_at_step_begin_leaves_no_iteration_begun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """step_begin() raises DeviceError when the counter cannot be read (host timing): the
    next step_begin() starts the iteration, not "step_begin() called twice"."""
    from perseus.errors import DeviceError

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    nvml = FakeNvml(devices=[FakeDevice("GPU-flaky")])
    gpu = NvmlGPU("GPU-flaky", nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    plan = tiny_plan()
    with _agent(plan, gpu, timing="host", clock=VirtualClock()) as agent:
        _run_iteration(agent, plan.rank_actions[0])
        nvml.fail("nvmlDeviceGetTotalEnergyConsumption", nvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(DeviceError):
            agent.step_begin()
        _run_iteration(agent, plan.rank_actions[0])
        assert [r.iteration for r in agent.records.iterations] == [0, 1]


@pytest.mark.parametrize("control", [True, False])
def test_cuda_events_leave_every_counter_read_to_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, control: bool
) -> None:
    """On NVML a counter read costs ~3 ms (p99 ~25 ms on an H100): the worker reads the
    counter as the device passes the iteration's start and end; the training thread never."""
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    gpu, readers = counting_gpu(tmp_path)
    plan = tiny_plan()
    agent = _agent(plan, gpu, events=_cuda_like_events(), enabled=control)
    iterations = 3
    with agent:
        assert agent.device_timed
        for _ in range(iterations):
            agent.step_begin()
            for a in plan.rank_actions[0]:
                with agent.op(a):
                    pass
            record = agent.step_end()
            assert record.energy_j == pytest.approx(1.0)  # one read between start and end
    main = threading.current_thread().name
    assert readers.count(main) == 0
    assert len(readers) == 2 * iterations


@pytest.mark.parametrize("control", [True, False])
def test_an_iterations_figures_are_worked_out_by_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, control: bool
) -> None:
    """Learning an iteration's op times and clocks (~0.2 ms of Python on an H100's host)
    is the worker's, done as it passes the iteration's end; the training thread only takes
    the figures, and the records are those of every op, in order."""
    from perseus.runtime.agent.timing import DeviceTiming

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    threads: list[str] = []
    figures = DeviceTiming._figures

    def noting(self: DeviceTiming, closed: Any) -> Any:
        threads.append(threading.current_thread().name)
        return figures(self, closed)

    monkeypatch.setattr(DeviceTiming, "_figures", noting)
    gpu, _ = counting_gpu(tmp_path)
    plan = tiny_plan()
    ops = plan.rank_actions[0]
    with _agent(plan, gpu, events=_cuda_like_events(), enabled=control) as agent:
        for _ in range(3):
            agent.step_begin()
            for a in ops:
                with agent.op(a):
                    pass
            agent.step_close()
        records = [agent.finish_iteration() for _ in range(3)]
    assert len(threads) == 3 and threading.current_thread().name not in threads
    assert [r.num_ops for r in records] == [len(ops)] * 3
    assert [(o.iteration, o.op) for o in agent.records.ops] == [
        (i, a) for i in range(3) for a in ops
    ]


def test_a_late_worker_does_not_work_out_an_iterations_figures_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the training thread took an iteration's figures itself (the worker had not run
    its end's callback yet), the worker's late callback leaves them alone: the timing history
    learns each iteration once."""
    from perseus.runtime.agent.controller import FrequencyController
    from perseus.runtime.agent.timing import DeviceTiming

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    late: list[Any] = []
    handle_done = FrequencyController._handle_done

    def deferring(self: FrequencyController, job: Any) -> None:
        then, job.then = job.then, None
        handle_done(self, job)
        if then is not None:
            late.append(then)

    monkeypatch.setattr(FrequencyController, "_handle_done", deferring)
    worked_out: list[int] = []
    figures = DeviceTiming._figures

    def counting(self: DeviceTiming, closed: Any) -> Any:
        worked_out.append(closed.iteration)
        return figures(self, closed)

    monkeypatch.setattr(DeviceTiming, "_figures", counting)
    gpu, _ = counting_gpu(tmp_path)
    plan = tiny_plan()
    with _agent(plan, gpu, events=_cuda_like_events()) as agent:
        for _ in range(2):
            agent.step_begin()
            for a in plan.rank_actions[0]:
                with agent.op(a):
                    pass
            agent.step_close()
        records = [agent.finish_iteration() for _ in range(2)]
        for then in late:  # the worker's callbacks, run after the training thread's reads
            then()
    assert len(late) == 2 and worked_out == [0, 1]
    assert [r.num_ops for r in records] == [len(plan.rank_actions[0])] * 2


def test_an_agent_keeps_its_latest_records_only(gpu: SimulatedGPU) -> None:
    """Per-op and iteration records are capped (a long run stays in bounded memory)."""
    plan = tiny_plan()
    with _agent(plan, gpu, max_op_records=2) as agent:
        for _ in range(5):
            _run_iteration(agent, plan.rank_actions[0])
    records = agent.records
    assert [r.iteration for r in records.iterations] == [3, 4]
    assert len(records.ops) == 2


class _FakeCudaEvent:
    """A ``torch.cuda.Event`` stand-in: notes the stream of its last record."""

    made = 0

    def __init__(self, enable_timing: bool = False) -> None:
        type(self).made += 1
        self.stream: object = None

    def record(self, stream: object) -> None:
        self.stream = stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _FakeCudaEvent) -> float:
        return 1.0


@pytest.mark.parametrize("raw_stream", [True, False])
def test_cuda_events_are_pooled_and_follow_a_stream_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw_stream: bool
) -> None:
    """Two events per op are recorded on the training thread: after two iterations every
    record reuses a pooled event (none is made), and each goes on the stream current then.
    Where torch tells the raw stream cheaply, the stream object is looked up only when it
    changed; elsewhere at every record."""
    torch = pytest.importorskip("torch")
    from perseus.runtime.agent.events import CudaEventSource

    streams = ["main"]
    lookups = []

    def current_stream(device: object = None) -> str:
        lookups.append(streams[-1])
        return streams[-1]

    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    raw = (lambda index: hash(streams[-1])) if raw_stream else None
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", raw, raising=False)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    events = CudaEventSource()
    gpu, _ = counting_gpu(tmp_path)
    plan = tiny_plan()
    made = []
    with _agent(plan, gpu, events=events) as agent:
        for i in range(5):
            if i == 4:
                streams.append("side")  # the training loop switched streams
            agent.step_begin()
            for a in plan.rank_actions[0]:
                with agent.op(a):
                    pass
            last = agent.last_op_end_event
            agent.step_end()
            made.append(_FakeCudaEvent.made)
    assert made[3] == made[2] == made[1]  # steady state: no event made per op
    assert last is not None and last._event.stream == "side"  # type: ignore[attr-defined]
    if raw_stream:  # the reference event's, the first record's, the switch's
        assert lookups == ["main", "main", "side"]
    else:
        assert len(lookups) > 20


# The agent speaks actions: its order errors, op records and held-op reports carry them.


def test_an_order_error_carries_the_planned_and_the_run_action(gpu: SimulatedGPU) -> None:
    with _agent(tiny_plan(), gpu) as agent:
        agent.step_begin()
        with agent.op("F", 0):
            pass
        with pytest.raises(OpOrderError) as wrong, agent.op(Kind.B, 0):
            pass
        assert (wrong.value.planned, wrong.value.ran) == (
            Action(0, Kind.F, 1),
            Action(0, Kind.B, 0),
        )
        assert isinstance(wrong.value, PlanError)  # the CLI maps it as before
        agent.step_abort()
        with pytest.raises(OpOrderError) as outside, agent.op("W", 1, stage_index=1):
            pass
        assert (outside.value.planned, outside.value.ran) == (None, Action(1, Kind.W, 1))
        with pytest.raises(PlanError, match="op kind 'X' is not one of F, B, W"):
            agent.step_begin()
            with agent.op("X", 0):
                pass


def test_op_records_carry_the_action_of_a_multi_stage_rank(gpu: SimulatedGPU) -> None:
    ops = (("F0@0", "F0@2", "B0@2", "B0@0"), ("F0@1", "F0@3", "B0@3", "B0@1"))
    plan = tiny_plan(stage_ops=ops)
    with _agent(plan, gpu) as agent:
        agent.step_begin()
        for a in plan.rank_actions[0]:
            with agent.op(a):
                pass
        agent.step_end()
        agent.step_begin()
        with pytest.raises(OpOrderError) as wrong, agent.op(Action(2, Kind.F, 0)):
            pass
        assert (wrong.value.planned, wrong.value.ran) == (
            Action(0, Kind.F, 0),
            Action(2, Kind.F, 0),
        )
        with pytest.raises(TypeError, match="an Action, or a kind and a microbatch_index"):
            agent.op(Kind.F)
    ran = [o.op for o in agent.records.ops]
    assert ran == [
        Action(0, Kind.F, 0),
        Action(2, Kind.F, 0),
        Action(2, Kind.B, 0),
        Action(0, Kind.B, 0),
    ]


def test_held_ops_carry_their_action(tmp_path: Path) -> None:
    """Under a 300 W cap an H100 locked at 1980 MHz runs every op held: each report names
    the action it held."""
    clock = VirtualClock()
    gpu = SimulatedGPU.from_preset(
        "h100",
        state_dir=tmp_path,
        clock=clock,
        set_latency_s=0.0,
        publish_interval_s=0.0,
        power_cap_w=300.0,
    )
    actions = build_schedule("1f1b", 1, 4).rank_actions[0]
    plan = tiny_plan(1980, stage_ops=(tuple(a.op_name(False) for a in actions),))
    agent = _agent(plan, gpu, clock=clock).start()
    with pytest.warns(RuntimeWarning, match="0F0 planned 1980 MHz"):
        agent.step_begin()
        for a in actions:
            with agent.op(a.kind, a.microbatch_index):
                gpu.launch(a.stage_index, a.kind)
                agent.mark_op_end()
        record = agent.step_end()
    agent.close()
    assert record.clock_delivery is not None
    assert tuple(h.op for h in record.clock_delivery.held) == actions
