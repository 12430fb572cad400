"""Power limit on the device layer: simulated GPU physics, NVML calls, and the reset after a
recurring job's exit, SIGTERM and SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from perseus.device.base import PowerLimitGPU
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.power_model import capped_clock_mhz
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DeviceError, DevicePermissionError
from perseus.recurring.job import RecurringJob
from perseus.recurring.store import SQLiteStore
from perseus.schedule.actions import Kind

REPO = Path(__file__).resolve().parents[2]


def _sim(tmp_path: Path, **kwargs: Any) -> SimulatedGPU:
    return SimulatedGPU.from_preset(
        "a40",
        state_dir=tmp_path / "sim",
        publish_interval_s=0.0,
        set_latency_s=0.0,
        activity=1.0,
        **kwargs,
    )


def test_simulated_range_set_reset_and_shared_state(tmp_path: Path) -> None:
    gpu = _sim(tmp_path)
    assert isinstance(gpu, PowerLimitGPU)
    low, high = gpu.power_limit_range_w()
    assert high == gpu.power_cap_w and low == pytest.approx(0.25 * high)
    assert gpu.power_limit_w() == high
    assert gpu.set_power_limit_w(150.0) == 150.0
    assert _sim(tmp_path).power_limit_w() == 150.0  # outlives the object, like a driver
    gpu.reset_power_limit()
    assert _sim(tmp_path).power_limit_w() == high
    with pytest.raises(DeviceError, match="INVALID_ARGUMENT"):
        gpu.set_power_limit_w(high + 1)
    with pytest.raises(DevicePermissionError, match="NO_PERMISSION"):
        _sim(tmp_path, privileged=False).set_power_limit_w(150.0)


def test_simulated_time_and_power_follow_the_cap_model(tmp_path: Path) -> None:
    gpu = _sim(tmp_path)
    t_free, e_free = gpu.op_cost(0, Kind.F)
    previous_t = t_free
    clocks = gpu.supported_clocks_mhz()
    for limit in (250.0, 200.0, 150.0, 120.0):
        gpu.set_power_limit_w(limit)
        t, e = gpu.op_cost(0, Kind.F)
        f = gpu.effective_clock_mhz(0, Kind.F)
        power = {c: gpu._cost_fn(0, Kind.F, c)[1] / gpu._cost_fn(0, Kind.F, c)[0] for c in clocks}
        # Effective clock = the largest supported clock whose power fits under the cap.
        assert f == capped_clock_mhz(clocks, clocks[0], power, limit)
        assert e / t <= limit + 1e-9
        assert t >= previous_t  # a lower cap never speeds an op up
        previous_t = t
    assert previous_t > t_free
    gpu.reset_power_limit()
    assert gpu.op_cost(0, Kind.F) == (t_free, e_free)


class _PowerNvml(FakeNvml):
    """The fake NVML plus the power-limit functions (milliwatts)."""

    limit_mw = 300_000

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        self._record("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return 100_000, 300_000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._record("nvmlDeviceGetEnforcedPowerLimit", handle)
        return self.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        self._record("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return 300_000

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, milliwatts: int) -> None:
        self._record("nvmlDeviceSetPowerManagementLimit", handle, milliwatts)
        self.limit_mw = milliwatts


def test_nvml_power_limit_calls_errors_and_reset_on_close(tmp_path: Path) -> None:
    nvml = _PowerNvml(devices=[FakeDevice("GPU-1")])
    gpu = NvmlGPU("GPU-1", nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    assert gpu.power_limit_range_w() == (100.0, 300.0)
    assert gpu.set_power_limit_w(212.5) == 212.5
    assert nvml.limit_mw == 212_500 and gpu.power_limit_w() == 212.5
    with pytest.raises(DeviceError, match="outside"):
        gpu.set_power_limit_w(50.0)
    nvml.fail("nvmlDeviceSetPowerManagementLimit", nvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(DevicePermissionError):
        gpu.set_power_limit_w(200.0)
    gpu.close()
    assert nvml.limit_mw == 300_000  # close() resets a limit this object set
    observe = NvmlGPU(
        "GPU-1",
        nvml_module=_PowerNvml(devices=[FakeDevice("GPU-1")]),
        privileged=False,
        lock_dir=tmp_path,
    )
    with pytest.raises(DevicePermissionError, match="power limit"):
        observe.set_power_limit_w(200.0)


def _job(tmp_path: Path, gpu: SimulatedGPU) -> RecurringJob:
    return RecurringJob(
        "job",
        batch_sizes=[32, 64],
        default_batch_size=64,
        store=SQLiteStore(tmp_path / "db"),
        gpu=gpu,
        eta=0.5,
    )


def test_job_resets_the_limit_after_exit_and_after_an_exception(tmp_path: Path) -> None:
    gpu = _sim(tmp_path)
    job = _job(tmp_path, gpu)
    for bs in (32, 64):
        job.store.save_power_limit_w("job", gpu.name, bs, 175.0, {})
    with job.run() as run:
        assert run.power_limit_w == 175.0 and gpu.power_limit_w() == 175.0
        run.end_epoch(reached=True)
    assert gpu.power_limit_w() == gpu.power_limit_range_w()[1]
    assert len(job.store.history("job")) == 1
    with pytest.raises(RuntimeError, match="boom"), job.run() as run:
        assert gpu.power_limit_w() < 300.0
        raise RuntimeError("boom")
    assert gpu.power_limit_w() == gpu.power_limit_range_w()[1]
    assert len(job.store.history("job")) == 1  # the crashed run is abandoned, not counted


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.device.simulated import SimulatedGPU
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore
    tmp = Path(sys.argv[1])
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp / "sim", publish_interval_s=0.0,
                                   set_latency_s=0.0)
    job = RecurringJob("job", batch_sizes=[32, 64], default_batch_size=64,
                       store=SQLiteStore(tmp / "db"), gpu=gpu, eta=0.5)
    with job.run() as run:
        print("ready", run.power_limit_w, flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_limit_is_reset_when_the_job_process_is_killed(tmp_path: Path, sig: int) -> None:
    gpu = _sim(tmp_path)
    SQLiteStore(tmp_path / "db").save_power_limit_w("job", gpu.name, 64, 150.0, {})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.split() == ["ready", "150.0"], line
        assert gpu.power_limit_w() == 150.0
        proc.send_signal(sig)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 10.0
    while gpu.power_limit_w() != gpu.power_limit_range_w()[1] and time.monotonic() < deadline:
        time.sleep(0.05)  # after SIGKILL the watchdog resets it
    assert gpu.power_limit_w() == gpu.power_limit_range_w()[1]


def test_nvml_close_resets_the_power_limit_even_when_the_clock_reset_fails(
    tmp_path: Path,
) -> None:
    nvml = _PowerNvml(devices=[FakeDevice("GPU-1")])
    gpu = NvmlGPU("GPU-1", nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    gpu.set_locked_clock(1200)
    gpu.set_power_limit_w(212.5)
    nvml.fail("nvmlDeviceResetGpuLockedClocks", nvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(DevicePermissionError):
        gpu.close()
    assert nvml.limit_mw == 300_000  # the limit this object set is reset all the same
    assert nvml.names()[-1] == "nvmlShutdown" and nvml.initialized == 0
    gpu.close()  # idempotent: nothing left to reset
    assert nvml.names()[-1] == "nvmlShutdown" and nvml.initialized == 0
