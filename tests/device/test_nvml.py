"""The NVML backend against a recording fake of ``pynvml``: call sequences and error mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.base import ObserveOnlyWarning
from perseus.device.clock import VirtualClock
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import (
    NvmlGPU,
    NvmlUnavailableError,
    call_nvml,
    list_nvml_gpus,
    probe_privilege,
)
from perseus.device.nvml_calls import NvmlConstants, clock_event_names
from perseus.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotSupportedError,
    DevicePermissionError,
)
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.rank_agent import RankAgent
from tests.runtime.plans import tiny_plan

UUID = "GPU-11111111-2222-3333-4444-555555555555"

STARTUP = [
    "nvmlInit",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetSupportedGraphicsClocks",
    "nvmlDeviceGetPersistenceMode",
]


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(devices=[FakeDevice(UUID), FakeDevice("GPU-other", name="NVIDIA A40")])


def _gpu(nvml: FakeNvml, tmp_path: Path, **kwargs: object) -> NvmlGPU:
    return NvmlGPU(UUID, nvml_module=nvml, privileged=True, lock_dir=tmp_path, **kwargs)


def test_constants_match_real_pynvml() -> None:
    """The one table of NVML constants (the backend's, and the fake's as its attributes)."""
    pynvml = pytest.importorskip("pynvml")
    names = [name for name in dir(NvmlConstants) if name.startswith("NVML_")]
    assert names and all(getattr(FakeNvml, name) == getattr(NvmlConstants, name) for name in names)
    for name in names:
        assert getattr(NvmlConstants, name) == getattr(pynvml, name), name


def test_constructor_does_no_io(nvml: FakeNvml, tmp_path: Path) -> None:
    _gpu(nvml, tmp_path)
    assert nvml.calls == []


def test_startup_sequence_and_clock_list(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    assert nvml.names() == STARTUP
    # The graphics clocks are asked for at the highest memory clock.
    assert nvml.calls[STARTUP.index("nvmlDeviceGetSupportedGraphicsClocks")][1][1] == 1593
    assert gpu.supported_clocks_mhz()[:2] == (1410, 1395)
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.persistence_mode is True
    assert gpu.observe_only_reason is None
    gpu.close()


def test_per_op_and_shutdown_sequence(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    nvml.calls.clear()
    assert gpu.set_locked_clock(1100) == 1095  # snapped to the driver's list
    assert gpu.locked_clock_mhz() == 1095
    assert gpu.energy_mj() == 1_000_000
    assert gpu.power_w() == pytest.approx(84.0)  # the instant field, GPU scope
    assert gpu.current_clock_mhz() == 1095
    gpu.close()
    handle = nvml.devices[0]
    assert nvml.calls == [
        ("nvmlDeviceSetGpuLockedClocks", (handle, 1095, 1095)),
        ("nvmlDeviceGetTotalEnergyConsumption", (handle,)),
        ("nvmlDeviceGetFieldValues", (handle, ((186, 0),))),
        ("nvmlDeviceGetClockInfo", (handle, 1)),
        ("nvmlDeviceResetGpuLockedClocks", (handle,)),
        ("nvmlShutdown", ()),
    ]
    assert nvml.initialized == 0


def test_agent_drives_nvml_in_order(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path)
    plan = tiny_plan(freq_mhz=1100)
    with RankAgent(plan, gpu, rank=0, watchdog=False, handle_signals=False) as agent:
        assert nvml.names() == STARTUP
        nvml.calls.clear()
        agent.step_begin()
        for name in plan.stage_ops[0]:
            with agent.op(name[0], int(name[1:])):
                pass
        agent.wait_for_clock()
        agent.step_end()
        sets = [args for name, args in nvml.calls if name == "nvmlDeviceSetGpuLockedClocks"]
        # Every op has the same clock: set once, unchanged requests skipped.
        assert [a[1:] for a in sets] == [(1095, 1095)]
        nvml.calls.clear()
    assert nvml.names() == ["nvmlDeviceResetGpuLockedClocks"]
    gpu.close()
    assert nvml.names()[-1] == "nvmlShutdown"


def test_open_by_index_reads_uuid(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = NvmlGPU(index=1, nvml_module=nvml, privileged=True, lock_dir=tmp_path)
    assert gpu.uuid == "GPU-other"
    assert nvml.names()[1:3] == ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"]
    assert gpu.owner_lock_path() == tmp_path / "GPU-other.owner"
    gpu.close()


def test_list_gpus(nvml: FakeNvml) -> None:
    gpus = list_nvml_gpus(nvml)
    assert [g.uuid for g in gpus] == [UUID, "GPU-other"]
    for g in gpus:
        g.close()
    assert nvml.initialized == 0


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (FakeNvml.NVML_ERROR_NO_PERMISSION, DevicePermissionError),
        (FakeNvml.NVML_ERROR_NOT_SUPPORTED, DeviceNotSupportedError),
        (FakeNvml.NVML_ERROR_GPU_IS_LOST, DeviceLostError),
        (FakeNvml.NVML_ERROR_UNKNOWN, DeviceLostError),
        (FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND, NvmlUnavailableError),
        (FakeNvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlUnavailableError),
        (FakeNvml.NVML_ERROR_TIMEOUT, DeviceError),
    ],
)
def test_error_codes_map_to_perseus_errors(
    nvml: FakeNvml, code: int, error: type[DeviceError]
) -> None:
    nvml.fail("nvmlDeviceGetCount", code, times=3)  # a TIMEOUT is retried twice first
    with pytest.raises(error) as info:
        call_nvml(nvml, "nvmlDeviceGetCount", what="gpu0")
    assert isinstance(info.value.__cause__, FakeNvml.NVMLError)
    assert f"NVML error {code}" in str(info.value)


def test_no_library_at_init(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.fail("nvmlInit", FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlUnavailableError, match="no usable NVIDIA driver"):
        _gpu(nvml, tmp_path).open()


def test_failed_open_shuts_nvml_down(nvml: FakeNvml, tmp_path: Path) -> None:
    with pytest.raises(DeviceError):
        NvmlGPU("GPU-missing", nvml_module=nvml, privileged=True).open()
    assert nvml.names()[-1] == "nvmlShutdown"
    assert nvml.initialized == 0


def test_mig_is_refused_unless_allowed(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.devices[0].mig_mode = 1
    with pytest.raises(DeviceNotSupportedError, match="MIG"):
        _gpu(nvml, tmp_path).open()
    gpu = _gpu(nvml, tmp_path, allow_mig=True).open()
    gpu.close()


def test_mig_query_not_supported_is_fine(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.devices[0].supports_mig_query = False
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.observe_only_reason is None
    gpu.close()


def test_pre_volta_is_observe_only(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.devices[0].architecture = 4
    gpu = _gpu(nvml, tmp_path).open()
    assert "older than Volta" in (gpu.observe_only_reason or "")
    with pytest.raises(DevicePermissionError):
        gpu.set_locked_clock(1095)
    assert "nvmlDeviceSetGpuLockedClocks" not in nvml.names()
    gpu.close()


def test_unprivileged_agent_is_observe_only_with_one_warning(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    gpu = NvmlGPU(UUID, nvml_module=nvml, privileged=False, lock_dir=tmp_path)
    plan = tiny_plan(freq_mhz=1095, points=2)
    agent = RankAgent(plan, gpu, rank=0, watchdog=False, handle_signals=False)
    with pytest.warns(ObserveOnlyWarning, match="marked unprivileged") as caught:
        agent.start()
        agent.step_begin()
        agent.wait_for_clock()
        for name in plan.stage_ops[0]:
            with agent.op(name[0], int(name[1:])):
                pass
    assert len(caught) == 1
    assert not gpu.owner_lock_path().exists()  # nothing to own when clocks cannot change
    with agent:
        record = agent.step_end()
        assert agent.observe_only
        assert record.num_ops == 4
        agent.swap_plan(plan, point_index=1)
        agent.step_begin()  # no more warnings, no NVML set calls
        for name in plan.stage_ops[0]:
            with agent.op(name[0], int(name[1:])):
                pass
        agent.step_end()
    assert "nvmlDeviceSetGpuLockedClocks" not in nvml.names()
    assert "nvmlDeviceResetGpuLockedClocks" not in nvml.names()
    gpu.close()


def test_no_permission_from_driver_turns_controller_observe_only(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    nvml.fail("nvmlDeviceSetGpuLockedClocks", FakeNvml.NVML_ERROR_NO_PERMISSION)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1095)
    with pytest.warns(ObserveOnlyWarning):
        ctl.flush()
    assert ctl.observe_only
    ctl.request(1200)  # ignored from now on
    ctl.flush()
    ctl.close()
    assert nvml.names().count("nvmlDeviceSetGpuLockedClocks") == 1
    gpu.close()


def test_not_supported_set_disables_locking(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    nvml.fail("nvmlDeviceSetGpuLockedClocks", FakeNvml.NVML_ERROR_NOT_SUPPORTED)
    ctl = FrequencyController(gpu)
    ctl.start()
    ctl.request(1095)
    with pytest.warns(ObserveOnlyWarning, match="NOT_SUPPORTED|not supported|error 3"):
        ctl.flush()
    assert ctl.observe_only
    ctl.close()
    gpu.close()


@pytest.mark.parametrize(
    "code", [FakeNvml.NVML_ERROR_INVALID_ARGUMENT, FakeNvml.NVML_ERROR_FREQ_NOT_SUPPORTED]
)
def test_invalid_clock_is_resnapped_once(nvml: FakeNvml, tmp_path: Path, code: int) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    nvml.devices[0].graphics_clocks = (1400, 1100, 800)  # the driver's list changed
    nvml.fail("nvmlDeviceSetGpuLockedClocks", code)
    nvml.calls.clear()
    assert gpu.set_locked_clock(1095) == 1100
    assert nvml.names() == [
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceGetSupportedMemoryClocks",
        "nvmlDeviceGetSupportedGraphicsClocks",
        "nvmlDeviceSetGpuLockedClocks",
    ]
    nvml.fail("nvmlDeviceSetGpuLockedClocks", code, times=2)
    with pytest.raises(DeviceError, match="giving up"):
        gpu.set_locked_clock(800)
    gpu.close()


def test_lost_gpu_surfaces_on_next_agent_call(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path)
    plan = tiny_plan(freq_mhz=1095)
    nvml.fail("nvmlDeviceSetGpuLockedClocks", FakeNvml.NVML_ERROR_GPU_IS_LOST, times=10)
    agent = RankAgent(plan, gpu, rank=0, watchdog=False, handle_signals=False).start()
    agent.step_begin()  # posts the first op's clock; the worker hits GPU_IS_LOST every time
    # A persistent device error degrades to observe-only with one warning (issue 14), rather
    # than killing training.
    with pytest.warns(ObserveOnlyWarning, match="GPU_IS_LOST|lost|kept failing"):
        agent.wait_for_clock()
    assert agent.observe_only
    agent.close()
    gpu.close()


def test_energy_read_on_lost_gpu_raises(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    nvml.fail("nvmlDeviceGetTotalEnergyConsumption", FakeNvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(DeviceLostError, match="stopped answering"):
        gpu.energy_mj()
    gpu.close()


def test_privilege_probe_reads_cap_sys_admin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t0000000000200000\n")  # bit 21
    assert probe_privilege(str(status)) == (True, "CAP_SYS_ADMIN")
    status.write_text("Name:\tpython\nCapEff:\t0000000000000000\n")
    ok, why = probe_privilege(str(status))
    assert not ok and "CAP_SYS_ADMIN" in why
    monkeypatch.setenv("ZEUSD_SOCK_PATH", "/run/zeusd.sock")
    assert "zeusd" in probe_privilege(str(status))[1]
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert probe_privilege(str(status)) == (True, "running as root")


def test_cuda_device_mapping(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"1,{UUID}")
    assert NvmlGPU.for_cuda_device(0, nvml_module=nvml)._index == 1
    assert NvmlGPU.for_cuda_device(1, nvml_module=nvml)._uuid == UUID
    with pytest.raises(DeviceError, match="not visible"):
        NvmlGPU.for_cuda_device(2, nvml_module=nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert NvmlGPU.for_cuda_device(3, nvml_module=nvml)._index == 3


# ---------------------------------------------------------------------------------------------
# Robustness (notes §6) and observe-only on request


def test_transient_timeout_is_retried(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.clock = clock = VirtualClock()  # the back-off sleeps on the library's clock
    gpu = _gpu(nvml, tmp_path).open()
    nvml.fail("nvmlDeviceSetGpuLockedClocks", FakeNvml.NVML_ERROR_TIMEOUT, times=2)
    assert gpu.set_locked_clock(1095) == 1095
    assert nvml.names().count("nvmlDeviceSetGpuLockedClocks") == 3
    assert clock.now() == pytest.approx(0.01 + 0.05)  # 10 ms, then 50 ms
    gpu.close()


def test_persistent_timeout_is_a_device_error(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.clock = VirtualClock()
    gpu = _gpu(nvml, tmp_path).open()
    nvml.fail("nvmlDeviceSetGpuLockedClocks", FakeNvml.NVML_ERROR_TIMEOUT, times=3)
    with pytest.raises(DeviceError, match="after 3 tries") as info:
        gpu.set_locked_clock(1095)
    assert type(info.value) is DeviceError  # not lost, not permission: the controller degrades
    gpu.close()


def test_clock_event_reasons_fall_back_to_the_older_name(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.devices[0].clock_event_reasons = 0x4 | 0x1
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.clock_event_reasons() == 0x5
    assert clock_event_names(0x5) == ("gpu_idle", "sw_power_cap")
    nvml.devices[0].has_event_reasons_name = False
    nvml.calls.clear()
    assert gpu.clock_event_reasons() == 0x5
    assert nvml.names() == [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
    gpu.close()


def test_instant_power_falls_back_to_power_usage(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.devices[0].instant_power_mw = None
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.power_w() == pytest.approx(83.64)
    nvml.calls.clear()
    assert gpu.power_w() == pytest.approx(83.64)
    assert nvml.names() == ["nvmlDeviceGetPowerUsage"]  # the field is not asked for again
    gpu.close()


def test_watchdog_spec_names_the_gpu_not_the_limit_at_open(nvml: FakeNvml, tmp_path: Path) -> None:
    # A limit lowered before open must not become the "restored" limit: every reset targets
    # NVML's default, so the spec carries no limit at all.
    nvml.devices[0].power_limit_mw = 250_000
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.watchdog_spec() == {"backend": "nvml", "uuid": UUID}
    gpu.close()


def test_observe_only_gpu_never_calls_set_or_reset(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = NvmlGPU(UUID, nvml_module=nvml, privileged=True, lock_dir=tmp_path, control=False)
    plan = tiny_plan(freq_mhz=1100)
    with pytest.warns(ObserveOnlyWarning, match="clock changes disabled"):
        agent = RankAgent(plan, gpu, rank=0).start()  # watchdog and signals on (defaults)
    for _ in range(2):
        agent.step_begin()
        for name in plan.stage_ops[0]:
            with agent.op(name[0], int(name[1:])):
                pass
        agent.step_end()
    agent.close()
    with pytest.raises(DevicePermissionError):
        gpu.set_locked_clock(1095)
    with pytest.raises(DevicePermissionError):
        gpu.reset_locked_clock()
    # Even a direct call through the GPU's NVML view is refused before reaching the driver.
    with pytest.raises(DevicePermissionError):
        call_nvml(gpu._api, "nvmlDeviceSetPowerManagementLimit", nvml.devices[0], 1)
    gpu.close()
    assert nvml.control_calls() == []
    assert "nvmlDeviceGetTotalEnergyConsumption" in nvml.names()  # still measured
    assert not any(tmp_path.iterdir())  # no ownership lock was taken


def test_environment_requests_observe_only(
    nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSEUS_NO_CLOCK_CHANGES", "1")
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.control is False and gpu.observe_only_reason is not None
    gpu.close()
    assert nvml.control_calls() == []


@pytest.mark.parametrize("read", ["energy_mj", "current_clock_mhz", "supported_clocks_mhz"])
def test_a_first_read_opens_the_device(nvml: FakeNvml, tmp_path: Path, read: str) -> None:
    gpu = _gpu(nvml, tmp_path)
    assert not gpu.is_open
    getattr(gpu, read)()  # no open() first: the read opens it, as the agent's first read does
    assert gpu.is_open
    gpu.close()
