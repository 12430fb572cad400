"""GPU ownership locks: one owner per GPU, a dead owner's lock reset by the next owner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.device import ownership
from perseus.device.ownership import (
    GpuOwnership,
    acquire_owner_lock,
    infer_reset_spec,
    read_owner_pid,
    release_owner_lock,
    reset_if_orphaned,
)
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceBusyError
from perseus.io.process_identity import format_record, parse_record, this_process

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leave_stale_lock(gpu: SimulatedGPU, freq_mhz: int = 1095) -> int:
    """What an owner killed together with its watchdog leaves: a lock and its pid."""
    gpu.set_locked_clock(freq_mhz)
    pid = _dead_pid()
    gpu.owner_lock_path().write_text(f"{pid}\n", encoding="ascii")
    return pid


def test_module_loads_alone_without_perseus() -> None:
    """The watchdog loads ownership.py by path under ``python -I``, and the reset loads its
    siblings beside it: stdlib only (an installed perseus may be another version, or none)."""
    path = REPO / "perseus" / "device" / "ownership.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('o', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "m._identity(); [m._sibling(n) for n in ('private_dir', 'sim_state', 'clock')]\n"
        "print(','.join(k for k in sys.modules if k.startswith(('perseus', 'torch', 'pynvml',"
        " 'numpy'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == ""


def test_watchdog_reset_imports_no_perseus(tmp_path: Path) -> None:
    """The watchdog's reset of a dead owner's GPU, loaded as the watchdog loads it, where
    ``import perseus`` fails: it reads the record and resets with the modules beside it."""
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    dead = _leave_stale_lock(gpu)
    spec = {**gpu.watchdog_spec(), "lock_path": str(gpu.owner_lock_path())}
    path = REPO / "perseus" / "device" / "ownership.py"
    code = (
        "import importlib.util, json, sys\n"
        "sys.modules['perseus'] = None  # every import of perseus fails\n"
        f"spec = importlib.util.spec_from_file_location('_perseus_ownership', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m\n"
        "spec.loader.exec_module(m)\n"
        "print(m.reset_if_orphaned(json.loads(sys.argv[1]), int(sys.argv[2])))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, json.dumps(spec), str(dead)],
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "True"), proc.stderr
    assert gpu.locked_clock_mhz() is None


def test_clean_release_leaves_no_pid(tmp_path: Path) -> None:
    path = tmp_path / "GPU-x.owner"
    fd, owner, stale = acquire_owner_lock(path)
    assert fd is not None and owner is None and stale is None
    assert read_owner_pid(path) is not None
    release_owner_lock(fd, path)
    assert read_owner_pid(path) is None
    fd, _, stale = acquire_owner_lock(path)
    assert fd is not None and stale is None
    release_owner_lock(fd, path)


def test_next_owner_resets_a_dead_owners_simulated_lock(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    dead = _leave_stale_lock(gpu)
    assert gpu.locked_clock_mhz() == 1095
    owner = GpuOwnership(gpu.uuid, gpu.owner_lock_path())
    owner.acquire()
    try:
        assert gpu.locked_clock_mhz() is None
        assert owner.reset_stale_pid == dead
    finally:
        owner.release()
    # A clean release is not reset again by the owner after it.
    gpu.set_locked_clock(1200)
    again = GpuOwnership(gpu.uuid, gpu.owner_lock_path())
    again.acquire()
    assert gpu.locked_clock_mhz() == 1200 and again.reset_stale_pid is None
    again.release()


def test_sim_reset_clears_the_power_limit_when_present(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    _leave_stale_lock(gpu)
    gpu._update(lambda state: state.__setitem__("power_limit_w", 250.0))
    owner = GpuOwnership(gpu.uuid, gpu.owner_lock_path())
    owner.acquire()
    owner.release()
    state = gpu._state()
    assert state["locked_mhz"] is None and state["power_limit_w"] is None


def test_next_owner_uses_the_given_reset(tmp_path: Path) -> None:
    path = tmp_path / "GPU-real.owner"
    path.write_text(f"{_dead_pid()}\n", encoding="ascii")
    calls: list[str] = []
    owner = GpuOwnership("GPU-real", path, reset=lambda: calls.append("reset"))
    owner.acquire()
    owner.release()
    assert calls == ["reset"]


def test_failed_stale_reset_warns_and_still_owns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "GPU-real.owner"
    path.write_text(f"{_dead_pid()}\n", encoding="ascii")

    def broken() -> None:
        raise RuntimeError("driver said no")

    owner = GpuOwnership("GPU-real", path, reset=broken)
    owner.acquire()
    assert owner.held and owner.reset_stale_pid is None
    owner.release()
    assert "driver said no" in caplog.text


def test_inferred_spec(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    gpu.locked_clock_mhz()  # creates the state file
    assert infer_reset_spec(gpu.uuid, gpu.owner_lock_path())["backend"] == "sim"
    assert infer_reset_spec("GPU-real", tmp_path / "GPU-real.owner") == {
        "backend": "nvml",
        "uuid": "GPU-real",
    }


def test_owner_pid_query_does_not_erase_a_stale_record(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    dead = _leave_stale_lock(gpu)
    assert GpuOwnership.owner_pid(gpu.owner_lock_path()) is None
    assert read_owner_pid(gpu.owner_lock_path()) == dead  # still there for the next owner


def test_watchdog_reset_leaves_a_new_live_owner_alone(tmp_path: Path) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    owner = GpuOwnership(gpu.uuid, gpu.owner_lock_path())
    owner.acquire()
    gpu.set_locked_clock(1095)
    spec = {**gpu.watchdog_spec(), "lock_path": str(gpu.owner_lock_path())}
    assert reset_if_orphaned(spec, owner_pid=_dead_pid()) is False
    assert gpu.locked_clock_mhz() == 1095
    owner.release()
    # Once free, the dead owner's watchdog resets (and clears the record).
    gpu.owner_lock_path().write_text("12345\n", encoding="ascii")
    assert reset_if_orphaned(spec, owner_pid=12345) is True
    assert gpu.locked_clock_mhz() is None and read_owner_pid(gpu.owner_lock_path()) is None


def test_busy_owner_is_named(tmp_path: Path) -> None:
    path = tmp_path / "GPU-x.owner"
    first = GpuOwnership("GPU-x", path)
    first.acquire()
    with pytest.raises(DeviceBusyError, match="another agent in this process"):
        GpuOwnership("GPU-x", path).acquire(wait_s=0.05)
    first.release()


def test_a_lock_held_without_a_record_is_waited_for_on_the_given_clock(tmp_path: Path) -> None:
    """A lock held by no recorded process (a watchdog resetting) is waited for up to
    ``wait_s``, then named busy; one freed meanwhile is taken (virtual time: no real wait)."""
    from perseus.device.clock import VirtualClock

    path = tmp_path / "GPU-x.owner"
    fd, _, _ = acquire_owner_lock(path, record=False)
    assert fd is not None
    clock = VirtualClock()
    with pytest.raises(DeviceBusyError, match="owned by another process"):
        GpuOwnership("GPU-x", path).acquire(wait_s=2.0, clock=clock)
    assert 2.0 <= clock.now() < 2.1
    start = clock.now()
    stop = clock.call_every(0.5, lambda: release_owner_lock(fd, path))
    owner = GpuOwnership("GPU-x", path)
    owner.acquire(clock=clock)
    stop()
    assert owner.held and clock.now() - start == pytest.approx(0.5, abs=0.02)
    owner.release()


def test_nvml_reset_restores_the_default_limit_not_a_recorded_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from perseus.device.fake_nvml import FakeDevice, FakeNvml

    fake = FakeNvml(devices=[FakeDevice("GPU-real", power_limit_mw=250_000, locked=(900, 900))])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # A spec naming the lowered limit (what was found at open) still restores the default.
    done = ownership.reset_from_spec(
        {"backend": "nvml", "uuid": "GPU-real", "power_limit_mw": 250_000}
    )
    device = fake.devices[0]
    assert device.locked is None and device.power_limit_mw == 400_000
    assert done == {"power_limit_w": (250.0, 400.0)}
    assert fake.initialized == 0
    # At the default already: the limit is not set again.
    fake.calls.clear()
    assert ownership.reset_from_spec({"backend": "nvml", "uuid": "GPU-real"}) == {}
    assert "nvmlDeviceSetPowerManagementLimit" not in fake.names()


def test_nvml_reset_restores_the_limit_even_when_the_clock_reset_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog's reset: a clock reset the driver refuses (retried, then given up) must
    not leave a recurring job's lowered power limit on the GPU."""
    from perseus.device.fake_nvml import FakeDevice, FakeNvml

    fake = FakeNvml(devices=[FakeDevice("GPU-real", power_limit_mw=250_000, locked=(900, 900))])
    fake.fail("nvmlDeviceResetGpuLockedClocks", fake.NVML_ERROR_NOT_SUPPORTED)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(fake.NVMLError):
        ownership.reset_from_spec({"backend": "nvml", "uuid": "GPU-real"})
    assert fake.devices[0].power_limit_mw == 400_000 and fake.initialized == 0


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown GPU backend"):
        ownership.reset_from_spec(json.loads('{"backend": "tpu", "uuid": "x"}'))


def test_forged_lock_contents_reset_only_the_gpu_in_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead pid plus a spec naming another GPU (and a simulated state dir with ``../``): the
    new owner resets its own GPU and nothing the file names."""
    from perseus.device.fake_nvml import FakeDevice, FakeNvml

    path = tmp_path / "GPU-real.owner"
    forged = [
        {"backend": "nvml", "uuid": "GPU-other", "power_limit_mw": 100_000},
        {"backend": "sim", "state_dir": str(tmp_path / "x" / ".." / ".." / "out"), "uuid": "../e"},
    ]
    fake = FakeNvml(
        devices=[
            FakeDevice("GPU-real", power_limit_mw=250_000, locked=(900, 900)),
            FakeDevice("GPU-other", locked=(1200, 1200)),
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for spec in forged:
        path.write_text(f"{_dead_pid()}\n{json.dumps(spec)}\n", encoding="ascii")
        calls: list[str] = []
        owner = GpuOwnership("GPU-real", path, reset=lambda c=calls: c.append("own reset"))
        owner.acquire()
        owner.release()
        assert calls == ["own reset"]
        assert owner.reset_stale_pid is not None
    assert fake.control_calls() == []  # GPU-other untouched: still locked, default limit
    assert fake.devices[1].locked == (1200, 1200) and fake.devices[1].power_limit_mw == 400_000
    assert not (tmp_path.parent / "out").exists()


def test_lock_file_holds_only_the_owners_record(tmp_path: Path) -> None:
    """pid, boot and start time, PID namespace: one line, nothing a reader would trust."""
    from perseus.runtime.safety.guard import Watchdog

    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    owner = GpuOwnership(gpu.uuid, gpu.owner_lock_path(), spec=gpu.watchdog_spec())
    owner.acquire()
    watchdog = Watchdog(gpu.watchdog_spec(), gpu.owner_lock_path())
    watchdog.start()
    try:
        assert gpu.owner_lock_path().read_bytes() == format_record(this_process())
        assert parse_record(gpu.owner_lock_path().read_bytes()) == this_process()
    finally:
        watchdog.stop()
        owner.release()


@pytest.mark.parametrize("clock", ["perf_counter", "time", "virtual"])
def test_a_reset_from_another_process_keeps_the_simulated_gpus_clock(
    tmp_path: Path, clock: str
) -> None:
    """The watchdog resets a simulated GPU on the clock it runs on: a GPU on perf_counter (the
    examples') or a virtual clock must not have its energy integral jump to the wall clock."""
    from perseus.device.clock import RealClock, VirtualClock, WallClock

    clocks = {"perf_counter": RealClock(), "time": WallClock(), "virtual": VirtualClock(100.0)}
    gpu = SimulatedGPU.from_preset(
        "a100", state_dir=tmp_path, set_latency_s=0.0, clock=clocks[clock]
    )
    gpu.set_locked_clock(1095)
    before_j = gpu.energy_mj() / 1000.0
    ownership.reset_from_spec(gpu.watchdog_spec())  # what the watchdog process runs
    assert gpu.locked_clock_mhz() is None
    # At most a second of idle power more (the read happens moments later).
    assert gpu.energy_mj() / 1000.0 - before_j < gpu.blocking_power_w * 1.0


def test_a_signal_while_taking_a_dead_owners_lock_keeps_the_record_that_a_reset_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new owner replaces the dead owner's pid by its own; a SIGTERM or Ctrl-C arriving
    in the middle (here: the write fails) must not leave an empty file, which would tell the
    next owner that nothing is due while the GPU is still at the dead owner's clock."""
    path = tmp_path / "GPU-x.owner"
    dead = _dead_pid()
    path.write_text(f"{dead}\n", encoding="ascii")

    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(ownership.os, "pwrite", interrupted)
    with pytest.raises(KeyboardInterrupt):
        acquire_owner_lock(path)
    monkeypatch.undo()
    assert read_owner_pid(path) == dead
    fd, _, stale = acquire_owner_lock(path)
    assert fd is not None and stale == dead
    assert path.read_bytes() == format_record(this_process())  # nothing of the old pid
    release_owner_lock(fd, path)
