"""The frequency controller: latest request wins, unchanged skipped, errors surfaced."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import pytest

from perseus.device.base import ObserveOnlyWarning
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceLostError
from perseus.io import load_profile
from perseus.runtime.agent.clock_setter import DeviceLock
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.gpu_probe import reset_clocks

_SET = "nvmlDeviceSetGpuLockedClocks"


def _gated_gpu(tmp_path: Path) -> tuple[NvmlGPU, FakeNvml, threading.Event]:
    """An NVML GPU (fake) whose set calls wait, once recorded, until the gate is set: a
    test holds a call in flight so that requests pile up behind it."""
    gate = threading.Event()
    nvml = FakeNvml(devices=[FakeDevice("GPU-gated")], gates={_SET: gate})
    return NvmlGPU("GPU-gated", nvml_module=nvml, privileged=True, lock_dir=tmp_path), nvml, gate


def _sets(nvml: FakeNvml) -> list[int]:
    return [args[2] for name, args in nvml.calls if name == _SET]


def _entered(nvml: FakeNvml) -> bool:
    """Wait (up to 5 s) until a set call is in flight."""
    deadline = time.monotonic() + 5.0
    while _SET not in nvml.names():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_latest_request_wins(tmp_path: Path) -> None:
    gpu, nvml, gate = _gated_gpu(tmp_path)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1410)
    assert _entered(nvml)
    for f in (900, 1095, 900, 1095):  # piles up while the first call blocks
        ctl.request(f)
    gate.set()
    assert ctl.flush()
    assert _sets(nvml) == [1410, 1095]
    assert ctl.stats().skipped_stale == 3
    ctl.close()


def test_unchanged_requests_are_skipped(tmp_path: Path) -> None:
    gpu, nvml, gate = _gated_gpu(tmp_path)
    gate.set()
    ctl = FrequencyController(gpu)
    ctl.start()
    for _ in range(10):
        ctl.request(1095)
    ctl.flush()
    ctl.request(1095)
    ctl.flush()
    assert _sets(nvml) == [1095]
    assert ctl.setter.applied_mhz == 1095
    stats = ctl.stats()
    assert stats.applied == 1 and stats.median_delay_s >= 0
    ctl.close()


def test_transient_error_is_retried_not_raised(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    gpu.inject_error("set_locked_clock", DeviceLostError("TIMEOUT"), times=2)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1095)
    assert ctl.flush(timeout_s=5)  # no exception: the third try succeeded
    assert gpu.locked_clock_mhz() == 1095 and not ctl.observe_only
    ctl.close()


def test_persistent_error_degrades_to_observe_only_with_one_warning(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    gpu.inject_error("set_locked_clock", DeviceLostError("GPU_IS_LOST"), times=10)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1095)
    with pytest.warns(ObserveOnlyWarning, match="kept failing"):
        ctl.flush(timeout_s=5)
    assert ctl.observe_only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.request(900)  # silently ignored from now on
        ctl.flush()
    ctl.close()


def test_unexpected_backend_exception_degrades_too(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    gpu.inject_error("set_locked_clock", ZeroDivisionError("bug"), times=10)  # type: ignore[arg-type]
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1095)
    with pytest.warns(ObserveOnlyWarning, match="ZeroDivisionError"):
        ctl.flush(timeout_s=5)
    ctl.close()


@pytest.mark.filterwarnings("ignore::perseus.runtime.agent.readback.ClockHeldWarning")
def test_an_op_whose_handling_raises_leaves_the_worker_running_observe_only(
    tmp_path: Path,
) -> None:
    """A clock read-back raising something other than a DeviceError (a backend's bug) killed
    the worker: every boundary posted after it queued for good (9 per iteration here, one per
    op and mark) and each iteration's end waited out a 1 s flush. Now that op is dropped, the
    controller goes observe-only with one warning and the worker goes on."""
    from perseus.runtime.agent.rank_agent import RankAgent
    from perseus.schedule import build_schedule
    from tests.runtime.plans import tiny_plan

    actions = build_schedule("1f1b", 1, 4).rank_actions[0]
    plan = tiny_plan(
        1980, stage_ops=(tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions),)
    )
    gpu = SimulatedGPU.from_preset(
        "h100", state_dir=tmp_path, set_latency_s=0.0, publish_interval_s=0.0
    )
    agent = RankAgent(plan, gpu, 0, watchdog=False, handle_signals=False).start()
    ctl = agent.controller
    assert ctl is not None and ctl.threaded
    gpu.inject_error("current_clock_mhz", RuntimeError("boom"))  # type: ignore[arg-type]
    with pytest.warns(ObserveOnlyWarning, match="clock worker failed.*RuntimeError"):
        for _ in range(3):
            agent.step_begin()
            for a in actions:
                with agent.op(a.kind, a.microbatch_index):
                    gpu.launch(a.stage_index, a.kind)
                    agent.mark_op_end()
            assert agent.step_end().time_s > 0
            assert not ctl._jobs  # nothing left queued
    assert ctl.observe_only and ctl._thread is not None and ctl._thread.is_alive()
    agent.close()


def test_close_nowait_stops_the_worker_without_taking_the_lock(tmp_path: Path) -> None:
    ctl = FrequencyController(_gated_gpu(tmp_path)[0])
    ctl.start()
    worker = ctl._thread
    with ctl._cond:  # as if a signal interrupted the main thread inside request()
        ctl.close_nowait()
    assert worker is not None
    worker.join(2.0)
    assert not worker.is_alive()


def test_the_exit_reset_waits_for_a_set_call_in_flight(tmp_path: Path) -> None:
    gpu, nvml, gate = _gated_gpu(tmp_path)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1410)
    assert _entered(nvml)  # the worker holds the device lock in its set call
    ctl.close_nowait()
    reset = threading.Thread(target=reset_clocks, args=(gpu, ctl))
    reset.start()
    reset.join(0.2)
    assert reset.is_alive() and "nvmlDeviceResetGpuLockedClocks" not in nvml.names()
    gate.set()
    reset.join(5.0)
    assert nvml.names()[-2:] == [_SET, "nvmlDeviceResetGpuLockedClocks"]
    assert gpu.locked_clock_mhz() is None


class _CountingLock:
    def __init__(self) -> None:
        self.tries = 0

    def acquire(self, timeout: float = -1) -> bool:
        self.tries += 1
        return False


@pytest.mark.parametrize("from_main", [True, False])
def test_the_exit_reset_never_waits_for_the_main_thread(from_main: bool) -> None:
    """A signal that interrupts the main thread inside its device-lock window (an emulated
    op's launch) runs the reset there or on the signal watcher thread; neither may wait for
    the main thread, which cannot let go until the handler returns."""
    lock, counting = DeviceLock(), _CountingLock()
    lock._lock = counting  # type: ignore[assignment]
    lock.holder = threading.main_thread().ident  # the main thread is inside its window
    got: list[bool] = []
    if from_main:
        got.append(lock.acquire_for_reset(timeout_s=60.0))
    else:
        watcher = threading.Thread(target=lambda: got.append(lock.acquire_for_reset(60.0)))
        watcher.start()
        watcher.join(5.0)
    assert got == [False] and counting.tries == 0


def test_close_drops_pending_and_stops_thread(tmp_path: Path) -> None:
    gpu, nvml, gate = _gated_gpu(tmp_path)
    ctl = FrequencyController(gpu)
    ctl.start()
    worker = ctl._thread
    ctl.request(1410)
    assert _entered(nvml)
    ctl.request(900)

    def release_once_closing() -> None:  # let the blocked driver call return only after close()
        while not ctl._closed:
            time.sleep(0.001)
        gate.set()

    threading.Thread(target=release_once_closing).start()
    ctl.close(timeout_s=5.0)
    assert _sets(nvml) == [1410]
    assert worker is not None and not worker.is_alive()


def test_on_a_virtual_clock_the_controller_works_inline_and_in_order(tmp_path: Path) -> None:
    """No worker thread: a request is applied on the caller's thread, its set latency moves
    the virtual clock (not the wall clock), and a posted boundary is handled by flush() at
    the op's predicted end, to the microsecond the same in every run. Its waits on the
    simulator's events take one step each to the moment they wait for, not one per poll."""
    from perseus.device.clock import VirtualClock
    from perseus.runtime.agent.boundary import Boundary, OpRequest
    from perseus.schedule import Kind

    def run() -> tuple[float, float, float]:
        clock = VirtualClock(1000.0)
        gpu = SimulatedGPU.from_profile(
            load_profile("a100"),
            blocking_power_w=83.64,
            state_dir=tmp_path / str(len(list(tmp_path.iterdir()))),
            publish_interval_s=0.0,
            set_latency_s=0.005,
            clock=clock,
        )
        ctl = FrequencyController(gpu, events=gpu, clock=clock)
        ctl.start()
        assert not ctl.threaded and ctl._thread is None
        t0 = time.perf_counter()
        ctl.request(1410)
        assert gpu.locked_clock_mhz() == 1410  # applied before request() returned
        assert time.perf_counter() - t0 < 0.5 and clock.now() > 1000.0  # latency is virtual
        t_f, _ = gpu.op_cost(0, Kind.F)
        start = gpu.record_event()
        gpu.launch(0, Kind.F)
        job = Boundary(OpRequest(start, 1005, t_f), end=gpu.record_event())
        ctl.post(job)
        assert job.report.issue_s is None  # nothing runs until someone waits
        sleeps = clock.sleeps
        assert ctl.flush()
        report = job.report
        # The op's start, its clock read mid-way, the aim, the set call, its end.
        assert clock.sleeps - sleeps <= 5, "the controller polled the virtual clock"
        assert report.issue_s is not None and report.return_s is not None
        ctl.close()
        return report.issue_s - start.device_time_s(), report.return_s - start.device_time_s(), t_f

    issue, landed, t_f = run()
    # Issued ahead of the op's end by the learnt latency; lands near the end (one draw of
    # the lognormal latency later: within its p99, 12 ms).
    assert 0.002 < t_f - issue < 0.012
    assert abs(landed - t_f) < 0.012
    assert (issue, landed) == run()[:2]  # deterministic
