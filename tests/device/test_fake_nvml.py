"""The library's fake NVML: recorded calls, refusals, caps over locks, thermal events, counter
publishes and wrap, slow reads, all on virtual time."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from perseus.device import fake_nvml
from perseus.device.clock import VirtualClock
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.nvml_calls import clock_event_names
from perseus.device.simulated import SimulatedGPU
from perseus.errors import DevicePermissionError
from perseus.schedule.actions import Kind

UUID = "GPU-fake"


def test_refuse_control_refuses_every_set_and_reset_and_records_them() -> None:
    nvml = fake_nvml.h100(UUID, refuse_control=True, clock=VirtualClock())
    (device,) = nvml.devices
    for name, args in (
        ("nvmlDeviceSetGpuLockedClocks", (device, 1500, 1500)),
        ("nvmlDeviceResetGpuLockedClocks", (device,)),
        ("nvmlDeviceSetMemoryLockedClocks", (device, 2619, 2619)),
        ("nvmlDeviceSetPowerManagementLimit", (device, 500_000)),
    ):
        with pytest.raises(FakeNvml.NVMLError) as info:
            getattr(nvml, name)(*args)
        assert info.value.value == FakeNvml.NVML_ERROR_NO_PERMISSION
    assert device.locked is None and device.power_limit_mw == 700_000
    assert len(nvml.control_calls()) == 4
    gpu = NvmlGPU(UUID, nvml_module=nvml, privileged=True).open()
    with pytest.raises(DevicePermissionError, match="CAP_SYS_ADMIN"):
        gpu.set_locked_clock(1500)
    gpu.close()


def test_h100_power_cap_overrides_the_lock_under_load() -> None:
    clock = VirtualClock()
    nvml = fake_nvml.h100(UUID, clock=clock)
    (device,) = nvml.devices
    nvml.nvmlDeviceSetGpuLockedClocks(device, 1980, 1980)
    # Idle: the lock is what runs, no cap reason.
    assert nvml.nvmlDeviceGetClockInfo(device, FakeNvml.NVML_CLOCK_SM) == 1980
    nvml.set_busy(device)
    seen = set()
    for _ in range(10):
        clock_mhz = nvml.nvmlDeviceGetClockInfo(device, FakeNvml.NVML_CLOCK_SM)
        reasons = clock_event_names(nvml.nvmlDeviceGetCurrentClocksEventReasons(device))
        assert 1485 <= clock_mhz <= 1740 and "sw_power_cap" in reasons
        assert nvml.nvmlDeviceGetPowerUsage(device) <= 700_000
        seen.add(clock_mhz)
        clock.sleep(0.1)
    assert len(seen) > 1  # the cap-bound clock moves with the load, as measured
    # A lock below the cap-bound clock is delivered; no cap reason then.
    nvml.nvmlDeviceSetGpuLockedClocks(device, 1200, 1200)
    assert nvml.nvmlDeviceGetClockInfo(device, FakeNvml.NVML_CLOCK_SM) == 1200
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(device) & 0x4 == 0


def test_thermal_event_holds_the_clock() -> None:
    nvml = FakeNvml(devices=[FakeDevice(UUID, thermal_limit_mhz=1005)], clock=VirtualClock())
    (device,) = nvml.devices
    nvml.nvmlDeviceSetGpuLockedClocks(device, 1410, 1410)
    assert nvml.nvmlDeviceGetClockInfo(device, FakeNvml.NVML_CLOCK_SM) == 1005
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(device)
    assert "sw_thermal_slowdown" in clock_event_names(reasons)


def test_h100_energy_counter_publishes_every_100_ms_and_reads_take_3_ms() -> None:
    clock = VirtualClock(start_s=10.0)
    nvml = fake_nvml.h100(UUID, clock=clock)
    (device,) = nvml.devices
    first = nvml.nvmlDeviceGetTotalEnergyConsumption(device)
    assert clock.now() == pytest.approx(10.003)  # the read itself took 3 ms of virtual time
    values = [first]
    while clock.now() < 11.0:
        values.append(nvml.nvmlDeviceGetTotalEnergyConsumption(device))
    steps = [b - a for a, b in itertools.pairwise(values) if b != a]
    assert len(steps) in (9, 10)  # 1 s of 3 ms reads sees one change per 100 ms publish
    # 70 W idle: 7 J a publish (the first counts from the first read)
    assert all(step == pytest.approx(70 * 100, abs=2) for step in steps[1:])


def test_energy_counter_wraps() -> None:
    clock = VirtualClock()
    device = FakeDevice(
        UUID, energy_mj=990, energy_from_power=True, power_mw=10_000, energy_wrap_mj=1000
    )
    nvml = FakeNvml(devices=[device], clock=clock)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(device) == 990
    clock.sleep(0.002)  # 10 W for 2 ms: 20 mJ
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(device) == 10


def test_failures_and_slow_reads_are_injected() -> None:
    clock = VirtualClock()
    nvml = FakeNvml(devices=[FakeDevice(UUID)], clock=clock, latency_s={"nvmlDeviceGetName": 0.5})
    nvml.fail("nvmlDeviceGetArchitecture", FakeNvml.NVML_ERROR_GPU_IS_LOST)
    (device,) = nvml.devices
    with pytest.raises(FakeNvml.NVMLError):
        nvml.nvmlDeviceGetArchitecture(device)
    assert nvml.nvmlDeviceGetArchitecture(device) == 7
    assert nvml.nvmlDeviceGetName(device) == "NVIDIA A100-SXM4-80GB" and clock.now() == 0.5
    assert nvml.names() == [
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetName",
    ]


def test_event_reasons_fall_back_to_the_throttle_name() -> None:
    device = FakeDevice(UUID, has_event_reasons_name=False, clock_event_reasons=0x4)
    gpu = NvmlGPU(UUID, nvml_module=FakeNvml(devices=[device]), privileged=True)
    assert gpu.clock_event_reasons() == 0x4
    gpu.close()


def test_nvml_gpu_identity_matches_the_simulated_preset() -> None:
    from perseus.device.presets import get_preset

    gpu = NvmlGPU(UUID, nvml_module=fake_nvml.h100(UUID), privileged=True).open()
    identity = gpu.identity()
    gpu.close()
    assert identity.name == "NVIDIA H100 80GB HBM3" and identity.architecture == "Hopper"
    assert identity.clocks_mhz[0] == 1980 and identity.default_power_limit_w == 700.0
    assert identity.same_gpu(get_preset("h100").identity())
    assert not identity.same_gpu(get_preset("a100").identity())


@pytest.mark.parametrize(("key", "cap_w"), [("h100", 700.0), ("a40", 300.0), ("a40", 200.0)])
def test_a_fake_device_follows_the_simulated_gpus_model(
    tmp_path: Path, key: str, cap_w: float
) -> None:
    """One model: under a cap, a busy fake device of a preset runs the clock a simulated GPU
    of that preset runs an op at, and draws the op's power."""
    sim = SimulatedGPU.from_preset(
        key, state_dir=tmp_path, power_cap_w=cap_w, activity=1.0, set_latency_s=0.0
    )
    clock = VirtualClock()
    nvml = FakeNvml(
        devices=[FakeDevice.from_preset(UUID, key, busy=True, activity=1.0)], clock=clock
    )
    (device,) = nvml.devices
    nvml.nvmlDeviceSetPowerManagementLimit(device, round(cap_w * 1000))
    for lock_mhz in (sim.supported_clocks_mhz()[0], 1200):
        sim.set_locked_clock(lock_mhz)
        nvml.nvmlDeviceSetGpuLockedClocks(device, lock_mhz, lock_mhz)
        clock_mhz = sim.effective_clock_mhz(0, Kind.F)
        assert nvml.nvmlDeviceGetClockInfo(device, FakeNvml.NVML_CLOCK_SM) == clock_mhz
        capped = nvml.nvmlDeviceGetCurrentClocksEventReasons(device) & 0x4 != 0
        assert capped == (clock_mhz < lock_mhz)
        time_s, energy_j = sim.op_cost(0, Kind.F)
        power_mw = nvml.nvmlDeviceGetPowerUsage(device)
        assert power_mw == pytest.approx(energy_j / time_s * 1000, abs=1)
        # The counter integrates that power (published every 100 ms, like the simulator's).
        before_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(device)
        clock.sleep(1.0)
        assert nvml.nvmlDeviceGetTotalEnergyConsumption(device) - before_mj == pytest.approx(
            power_mw, abs=2
        )
