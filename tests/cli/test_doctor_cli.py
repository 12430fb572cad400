"""``perseus doctor`` with the recording fake of pynvml, and with no NVML at all."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from perseus.cli import _doctor_checks, _doctor_cuda
from perseus.cli.main import main
from perseus.device import fake_nvml
from perseus.device import nvml as nvml_backend
from perseus.device.clock import VirtualClock
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlUnavailableError
from perseus.device.presets import get_preset

UUID = "GPU-11111111-2222-3333-4444-555555555555"
STEP_MJ = 1700
PERIOD_S = 0.02


def _counter(t: float) -> int:
    return 1_000_000 + math.floor(t / PERIOD_S) * STEP_MJ


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvml:
    nvml = FakeNvml(devices=[FakeDevice(UUID, energy_fn=_counter)])
    monkeypatch.setattr(nvml_backend, "import_nvml", lambda: nvml)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("PERSEUS_NO_CLOCK_CHANGES", raising=False)
    return nvml


def _privileged(monkeypatch: pytest.MonkeyPatch, allowed: bool) -> None:
    why = "running as root" if allowed else "not root and no CAP_SYS_ADMIN"
    monkeypatch.setattr(nvml_backend, "probe_privilege", lambda: (allowed, why))
    monkeypatch.setattr(_doctor_checks, "probe_privilege", lambda: (allowed, why))


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    rc = main(["doctor", "--json", "--energy-window-s", "0.3", "--power-window-s", "0.3", *args])
    return rc, json.loads(capsys.readouterr().out)


def _checks(report: dict) -> dict[str, dict]:
    (gpu,) = report["gpus"]
    return {c["name"]: c for c in gpu["checks"]}


def test_no_nvml_says_so_in_one_line_and_checks_the_simulator(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> None:
        raise NvmlUnavailableError("nvidia-ml-py is not installed")

    monkeypatch.setattr(nvml_backend, "import_nvml", missing)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("no NVIDIA GPU usable here (nvidia-ml-py is not installed)")
    assert "[ok] simulated path" in out[1]
    assert out[-1].startswith("verdict: perseus cannot change real GPU clocks")
    rc, report = _doctor(capsys)
    assert rc == 1 and report["simulated"]["status"] == "ok" and report["usable"] is False


@pytest.mark.parametrize("built", [True, False])
def test_doctor_says_whether_the_solver_kernels_were_built_at_install(
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    built: bool,
) -> None:
    from perseus.solver import aot

    monkeypatch.setattr(aot, "native_module", lambda: object() if built else None)
    quick = [
        "--no-cuda",
        "--no-clock-changes",
        "--energy-window-s",
        "0.3",
        "--power-window-s",
        "0.3",
    ]
    assert main(["doctor", *quick]) in (0, 1)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "solver kernels" in x)
    assert line.startswith("  [ok] solver kernels: built at install" if built else "  [warn]")
    assert built or "fix: install again" in out
    _, report = _doctor(capsys, "--no-cuda", "--no-clock-changes")
    assert report["solver_kernels"]["status"] == ("ok" if built else "warn")


def test_observe_only_never_calls_set_or_reset(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    rc, report = _doctor(capsys, "--no-clock-changes", "--no-cuda")
    assert fake.control_calls() == []
    assert rc == 0, report["verdict"]
    assert report["mode"] == "observe-only"
    assert report["nvml"]["driver"] == "550.54.15" and report["nvml"]["cuda_driver"] == "12.4"
    checks = _checks(report)
    gpu = checks["gpu"]["data"]
    assert (gpu["name"], gpu["uuid"], gpu["architecture"]) == (
        "NVIDIA A100-SXM4-80GB",
        UUID,
        "Ampere",
    )
    assert checks["supported clocks"]["data"]["count"] == 81
    assert checks["clock locking"]["status"] == "skip"
    assert "privileges would allow a try" in checks["clock locking"]["summary"]
    assert checks["set latency"]["status"] == "skip"
    energy = checks["energy counter"]["data"]
    assert energy["smallest_step_mj"] == STEP_MJ
    assert energy["median_interval_ms"] == pytest.approx(PERIOD_S * 1e3, rel=0.3)
    assert checks["power"]["data"]["power_limit_w"] == 400.0


def test_privileged_measures_set_latency_and_resets(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    rc, report = _doctor(capsys, "--no-cuda")
    assert rc == 0, report["verdict"]
    latency = _checks(report)["set latency"]
    assert latency["status"] == "ok"
    assert latency["data"]["samples"] == 6 and latency["data"]["applied_ms"] is not None
    names = fake.names()
    assert names.count("nvmlDeviceSetGpuLockedClocks") == 7  # 1 lock read back, 6 timed
    assert (
        names[names.index("nvmlDeviceSetGpuLockedClocks") :].count("nvmlDeviceResetGpuLockedClocks")
        >= 1
    )
    assert fake.devices[0].locked is None  # never left locked


def test_unprivileged_says_how_to_allow_it(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, False)
    assert main(["doctor", "--no-cuda", "--energy-window-s", "0.2", "--power-window-s", "0.2"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] clock locking: not allowed: not root and no CAP_SYS_ADMIN" in out
    assert "CAP_SYS_ADMIN" in out and "--cap-add SYS_ADMIN" in out and "zeusd" in out
    assert "nvidia-smi -acp UNRESTRICTED" in out  # application clocks are root-only here
    assert "[skip] set latency" in out
    assert fake.control_calls() == []


def test_failing_probe_is_unavailable_not_a_crash(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    fake.fail("nvmlDeviceGetArchitecture", FakeNvml.NVML_ERROR_UNKNOWN, times=2)
    fake.devices[0].instant_power_mw = None
    fake.fail("nvmlDeviceGetPowerUsage", FakeNvml.NVML_ERROR_GPU_IS_LOST)
    rc, report = _doctor(capsys, "--no-clock-changes", "--no-cuda")
    checks = report["gpus"][0]["checks"]
    # The first architecture failure stops the open; the GPU is reported, not a traceback.
    assert checks[0]["status"] == "unavailable" and "unavailable:" in checks[0]["summary"]
    assert rc == 1
    # Once open works, a failing power read only marks that probe.
    fake.failures.clear()
    fake.fail("nvmlDeviceGetPowerUsage", FakeNvml.NVML_ERROR_GPU_IS_LOST)
    rc, report = _doctor(capsys, "--no-clock-changes", "--no-cuda")
    power = _checks(report)["power"]
    assert power["status"] == "unavailable" and "stopped answering" in power["summary"]
    assert rc == 0


def test_cuda_check_without_cuda_is_reported(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    _privileged(monkeypatch, True)
    rc, report = _doctor(capsys, "--no-clock-changes")
    cuda = _checks(report)["cuda check"]
    assert cuda["status"] == "fail" and "no CUDA device" in cuda["summary"]
    assert rc == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--energy-window-s", "0"],
        ["--clocks", "0"],
        ["--gpu", "-1"],
        ["--bogus"],
        ["--energy-window-s", "soon"],
    ],
)
def test_bad_flags_exit_2(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(["doctor", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    assert fake.calls == []


class _WaitingSampler(_doctor_cuda._Sampler):
    """The doctor's sampler, able to wait until it has read the clock during the marked op."""

    current: _WaitingSampler | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._before = 0
        _WaitingSampler.current = self

    def mark(self, op: str | None) -> None:
        self._before = len(self.samples.get(op, [])) if op is not None else 0
        super().mark(op)

    def wait_for_sample(self, timeout_s: float = 60.0) -> None:
        op, deadline = self._op, time.monotonic() + timeout_s
        while op is not None and len(self.samples.get(op, [])) <= self._before:
            assert time.monotonic() < deadline, f"the sampler read no clock during {op}"
            time.sleep(0.0005)


class _FakeEvent:
    """``torch.cuda.Event`` on the host clock (this machine has no CUDA)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream: object = None) -> None:
        import time

        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        # A real op runs for milliseconds, long enough for the sampler to read the clock; the
        # small block on a busy host may finish between two reads, so wait for one.
        if _WaitingSampler.current is not None:
            _WaitingSampler.current.wait_for_sample()

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda as seen by the doctor's CUDA check, backed by the CPU and a small block."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "fake CUDA device")
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: SimpleNamespace(uuid=UUID.removeprefix("GPU-")),
    )
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_doctor_cuda, "_Sampler", _WaitingSampler)
    monkeypatch.setattr(_WaitingSampler, "current", None)

    def small_block(torch_module, device):
        block = torch.nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, batch_first=True
        )
        return block, torch.randn(2, 16, 32)

    monkeypatch.setattr(_doctor_cuda, "_transformer", small_block)


def test_cuda_check_runs_ops_through_the_agent_at_each_clock(
    fake: FakeNvml,
    fake_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _privileged(monkeypatch, True)
    rc, report = _doctor(capsys, "--clocks", "3", "--iterations", "2")
    cuda = _checks(report)["cuda check"]
    assert cuda["status"] == "ok", cuda
    assert rc == 0
    rows = cuda["data"]["rows"]
    assert [r["requested_mhz"] for r in rows] == [1410, 1050, 705]
    for row in rows:
        for op in ("F", "B"):
            # The fake GPU runs at its lock: the sampler read back the agent's clock.
            assert row[op]["samples"] >= 1
            assert row[op]["sm_clock_mhz_median"] == row["requested_mhz"]
            assert row[op]["time_ms_median"] > 0
    assert any(row[op]["samples"] for row in rows for op in ("F", "B"))
    set_calls = [args[1] for name, args in fake.calls if name == "nvmlDeviceSetGpuLockedClocks"]
    assert {1410, 1050, 705} <= set(set_calls)
    assert fake.devices[0].locked is None
    assert cuda["data"]["power_cap_pulls_clock_down"] is False


def test_cuda_check_observe_only_runs_at_the_current_clock(
    fake: FakeNvml,
    fake_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _privileged(monkeypatch, True)
    fake.devices[0].sm_clock_mhz = 1275
    rc, report = _doctor(capsys, "--no-clock-changes", "--iterations", "2")
    cuda = _checks(report)["cuda check"]
    assert cuda["status"] == "ok", cuda
    (row,) = cuda["data"]["rows"]
    assert row["requested_mhz"] is None
    assert fake.control_calls() == []
    assert rc == 0


def test_cuda_check_sees_a_power_cap_pull_the_clock_down(
    fake: FakeNvml,
    fake_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _privileged(monkeypatch, True)
    device = fake.devices[0]
    # Busy, with the a100 preset's power model, whose 400 W cap holds it at 1200 MHz at u 1.15.
    device.busy, device.power, device.activity = True, get_preset("a100").power, 1.15
    rc, report = _doctor(capsys, "--clocks", "2", "--iterations", "4")
    cuda = _checks(report)["cuda check"]
    assert cuda["data"]["power_cap_pulls_clock_down"] is True, cuda
    assert "pulled the clock below the lock" in cuda["summary"]
    top = cuda["data"]["rows"][0]
    assert top["requested_mhz"] == 1410
    sampled = [top[op] for op in ("F", "B") if top[op]["samples"]]
    assert sampled and all(s["sm_clock_mhz_median"] == 1200 for s in sampled)
    assert all("sw_power_cap" in s["clock_event_reasons"] for s in sampled)
    assert device.locked is None and rc == 0


def test_environment_request_holds_without_the_flag(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    monkeypatch.setenv("PERSEUS_NO_CLOCK_CHANGES", "1")
    rc, report = _doctor(capsys, "--no-cuda")
    assert report["mode"] == "observe-only" and fake.control_calls() == []
    assert rc == 0


class _VirtualGpu:
    """An energy counter on a virtual clock: ``idle_w`` until spinning starts, then
    ``blocked_w``; published every 100 ms like NVML's."""

    name = "NVIDIA A100-SXM4-80GB"

    def __init__(self, idle_w: float, blocked_w: float) -> None:
        self.clock = VirtualClock()
        self.idle_w, self.blocked_w = idle_w, blocked_w
        self.spin_from: float | None = None
        self.drained = False

    def _energy_j(self, t: float) -> float:
        if self.spin_from is None or t <= self.spin_from:
            return self.idle_w * t
        return self.idle_w * self.spin_from + self.blocked_w * (t - self.spin_from)

    def energy_mj(self) -> int:
        published = math.floor(self.clock.now() / 0.1) * 0.1
        return int(1000 * self._energy_j(published))

    def spin(self, _gpu: object) -> tuple:
        def busy() -> None:
            if self.spin_from is None:
                self.spin_from = self.clock.now()

        def drain() -> None:
            self.drained = True

        return busy, drain


def test_blocking_power_arithmetic_on_a_virtual_counter() -> None:
    from perseus.cli._doctor_power import check_blocking_power

    gpu = _VirtualGpu(idle_w=61.5, blocked_w=86.0)
    check = check_blocking_power(gpu, 3.0, spin=gpu.spin, clock=gpu.clock)  # type: ignore[arg-type]
    assert check.status == "ok", check
    assert check.data["idle_w"] == pytest.approx(61.5, rel=1e-3)
    assert check.data["blocked_w"] == pytest.approx(86.0, rel=1e-3)
    assert check.data["table_w"] == 83.64 and gpu.drained
    assert "plan with blocking_power_w=86.0" in check.summary
    # Far from the table's figure: a warning that says to pass the measured value.
    far = _VirtualGpu(idle_w=60.0, blocked_w=150.0)
    check = check_blocking_power(far, 3.0, spin=far.spin, clock=far.clock)  # type: ignore[arg-type]
    assert check.status == "warn" and "pass the measured value" in check.summary


def test_blocking_power_needs_two_publishes() -> None:
    from perseus.cli._doctor_power import measure_power_w
    from perseus.errors import DeviceError

    gpu = _VirtualGpu(idle_w=60.0, blocked_w=80.0)
    with pytest.raises(DeviceError, match="changed 1 times"):
        measure_power_w(gpu.energy_mj, 0.15, clock=gpu.clock, poll_s=0.01)


def test_doctor_on_a_fake_gpu_reports_idle_power(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    _, report = _doctor(capsys, "--no-clock-changes", "--no-cuda")
    blocking = _checks(report)["blocking power"]
    # The fake counter steps 1700 mJ every 20 ms: 85 W, read off real time (generous bounds).
    assert blocking["status"] == "skip" and 60 < blocking["data"]["idle_w"] < 110
    assert blocking["data"]["table_w"] == 83.64
    assert fake.control_calls() == []


def test_no_gpu_says_blocking_power_needs_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> None:
        raise NvmlUnavailableError("nvidia-ml-py is not installed")

    monkeypatch.setattr(nvml_backend, "import_nvml", missing)
    assert main(["doctor"]) == 1
    assert "[skip] blocking power: needs an NVIDIA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("no_changes", [False, True])
def test_doctor_reports_lockable_memory_clocks_on_a_gddr_board(
    fake: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_changes: bool,
) -> None:
    fake.devices[0].name = "NVIDIA A40"
    fake.devices[0].memory_clocks = (7251, 5001, 810, 405)
    _privileged(monkeypatch, True)
    flags = ["--no-clock-changes"] if no_changes else []
    _, report = _doctor(capsys, *flags, "--no-cuda")
    checks = _checks(report)
    clocks, locking = checks["supported clocks"], checks["memory clock locking"]
    assert clocks["data"]["memory_clocks_mhz"] == [7251, 5001, 810, 405]
    if no_changes:
        assert "not lockable: clock changes disabled" in clocks["summary"]
        assert locking["status"] == "skip"
        assert fake.control_calls() == []
    else:
        assert clocks["data"]["memory_clock_locking"] == "possible"
        assert "memory 7251/5001/810/405 MHz, lock tried below" in clocks["summary"]
        assert locking["status"] == "ok" and locking["data"]["tried_mhz"] == 5001
        assert ("nvmlDeviceSetMemoryLockedClocks", (fake.devices[0], 5001, 5001)) in fake.calls
    assert fake.devices[0].mem_locked is None  # the probe resets what it locked


def test_doctor_skips_the_memory_lock_on_hbm(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    _, report = _doctor(capsys, "--no-cuda")
    locking = _checks(report)["memory clock locking"]
    assert locking["status"] == "skip" and "one memory clock (1593 MHz)" in locking["summary"]
    assert "nvmlDeviceSetMemoryLockedClocks" not in fake.names()


def test_every_set_call_refused_means_cannot_change_clocks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Root in a container without CAP_SYS_ADMIN: the privilege probe says yes, NVML says no.
    The verdict comes from the refused lock, never "[ok] clock locking"."""
    nvml = fake_nvml.h100(UUID, refuse_control=True)
    monkeypatch.setattr(nvml_backend, "import_nvml", lambda: nvml)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("PERSEUS_NO_CLOCK_CHANGES", raising=False)
    _privileged(monkeypatch, True)
    args = ["doctor", "--no-cuda", "--energy-window-s", "0.3", "--power-window-s", "0.3"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "[ok] clock locking" not in out
    assert "[FAIL] clock locking: lock refused:" in out and "Insufficient Permissions" in out
    assert "--cap-add SYS_ADMIN" in out and "CAP_SYS_ADMIN" in out
    # Root already: the fix names the missing capability, never "run the job as root".
    assert "run the job as root" not in out and "looks privileged" in out
    verdict = out.splitlines()[-1]
    assert verdict.startswith("verdict: perseus cannot change clocks here")
    assert "nvmlDeviceSetGpuLockedClocks failed: Insufficient Permissions" in verdict
    # The HBM3 board is never asked for a memory lock, nor called lockable.
    assert "lockable" not in out.replace("not lockable", "")
    assert "nvmlDeviceSetMemoryLockedClocks" not in nvml.names()
    assert "[skip] set latency" in out


def test_a_lock_that_does_not_move_the_clock_is_no_evidence(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _privileged(monkeypatch, True)
    fake.devices[0].thermal_limit_mhz = 300  # whatever is locked, the clock stays at 300 MHz
    rc, report = _doctor(capsys, "--no-cuda")
    control = _checks(report)["clock locking"]
    assert control["status"] == "fail" and "read back 300 MHz" in control["summary"]
    assert rc == 1 and fake.devices[0].locked is None


def test_hbm_board_listing_several_memory_clocks_is_never_asked(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.devices[0].name = "NVIDIA H100 80GB HBM3"
    fake.devices[0].memory_clocks = (2619, 1593)
    _privileged(monkeypatch, True)
    _, report = _doctor(capsys, "--no-cuda")
    checks = _checks(report)
    assert "not lockable" in checks["supported clocks"]["summary"]
    assert "HBM" in checks["supported clocks"]["summary"]
    assert checks["memory clock locking"]["status"] == "skip"
    assert "nvmlDeviceSetMemoryLockedClocks" not in fake.names()


def test_cuda_check_fails_when_the_clock_is_not_the_one_asked(
    fake: FakeNvml,
    fake_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The lock check passes, then something (another process, a policy) undoes every lock
    the agent sets: the kernel runs at 1410 MHz whatever was asked, with no reason set."""
    _privileged(monkeypatch, True)
    original = fake.nvmlDeviceSetGpuLockedClocks
    calls = {"n": 0}

    def undone(handle: FakeDevice, low: int, high: int) -> None:
        calls["n"] += 1
        original(handle, low, high)
        if calls["n"] > 1:  # the doctor's own read-back lock works; the agent's do not
            handle.locked, handle.sm_clock_mhz = None, 1410

    monkeypatch.setattr(fake, "nvmlDeviceSetGpuLockedClocks", undone)
    rc, report = _doctor(capsys, "--clocks", "3", "--iterations", "3")
    cuda = _checks(report)["cuda check"]
    assert cuda["status"] == "fail", cuda
    assert "asked 1050 MHz" in cuda["summary"] and "ran at 1410 MHz" in cuda["summary"]
    assert rc == 1


def test_cuda_check_says_whether_the_power_cap_binds_at_the_top_clock(
    fake: FakeNvml,
    fake_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _privileged(monkeypatch, True)
    _, report = _doctor(capsys, "--clocks", "2", "--iterations", "3")
    cuda = _checks(report)["cuda check"]
    assert cuda["data"]["power_cap_binds_at_top_clock"] is False
    assert "the power cap does not bind at the top clock" in cuda["summary"]
    device = fake.devices[0]
    device.busy, device.power, device.activity = True, get_preset("a100").power, 1.15
    _, report = _doctor(capsys, "--clocks", "2", "--iterations", "3")
    cuda = _checks(report)["cuda check"]
    assert cuda["status"] == "ok" and cuda["data"]["power_cap_binds_at_top_clock"] is True
    assert "the power cap binds at the top clock" in cuda["summary"]


_KILLED_WHILE_LOCKED = """
import os, signal, sys
from perseus.cli import _doctor_checks
from perseus.cli.main import main
from perseus.device import nvml as nvml_backend
from perseus.device.fake_nvml import FakeDevice, FakeNvml

log = open(sys.argv[1], "a", buffering=1)
# Its default action, as under a terminal: a parent run under nohup passes SIGHUP ignored,
# and an ignored signal stays ignored.
signal.signal(int(sys.argv[2]), signal.SIG_DFL)


class Nvml(FakeNvml):
    def nvmlDeviceSetGpuLockedClocks(self, handle, low, high):
        super().nvmlDeviceSetGpuLockedClocks(handle, low, high)
        log.write("locked\\n")
        os.kill(os.getpid(), int(sys.argv[2]))  # killed while the clock is locked

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        super().nvmlDeviceResetGpuLockedClocks(handle)
        log.write("reset\\n")


nvml = Nvml(devices=[FakeDevice("{uuid}", energy_fn=lambda t: 1_000_000 + int(t * 1e5))])
nvml_backend.import_nvml = lambda: nvml
for module in (nvml_backend, _doctor_checks):
    module.probe_privilege = lambda: (True, "running as root")
main(["doctor", "--no-cuda", "--energy-window-s", "0.1", "--power-window-s", "0.1"])
log.write("finished\\n")
"""


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_a_clock_is_locked_resets_it_then_ends_the_process(
    tmp_path: Path, signum: str
) -> None:
    """The clock-lock checks lock the clock directly (no agent, no claim, no watchdog): a
    SIGTERM or SIGHUP there (`timeout`, a closed terminal) left the GPU locked. Now the lock
    is reset, then the process ends by the signal as before."""
    import os
    import signal
    import subprocess
    import sys

    sig = getattr(signal, signum)
    log = tmp_path / "calls.log"
    script = _KILLED_WHILE_LOCKED.replace("{uuid}", UUID)
    env = {**os.environ, "PERSEUS_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("PERSEUS_NO_CLOCK_CHANGES", None)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(log), str(int(sig))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -sig, proc.stderr
    assert log.read_text().splitlines() == ["locked", "reset"]


def test_a_gpu_a_running_process_owns_is_not_locked_or_reset(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training run's agent owns its GPU and sets the clocks op by op: doctor locked and
    reset them anyway (and the memory clock, which a plan may set once), under the running
    job. Now the lock checks are skipped, naming the owner; the read-only checks still run.
    The memory clock check and the verdict say so (they said locking was not allowed, and
    that perseus could change clocks here)."""
    import os

    from perseus.device.nvml import NvmlGPU
    from perseus.device.ownership import acquire_owner_lock, release_owner_lock

    _privileged(monkeypatch, True)
    fake.devices[0].name = "NVIDIA A40"  # memory clocks a plan may lock
    fake.devices[0].memory_clocks = (7251, 5001, 810, 405)
    path = NvmlGPU(UUID, nvml_module=fake).owner_lock_path()
    held = acquire_owner_lock(path)  # this process stands for the running job
    assert held.fd is not None
    try:
        rc, report = _doctor(capsys, "--no-cuda")
    finally:
        release_owner_lock(held.fd, path)
    names = fake.names()
    assert not [n for n in names if ("Set" in n and "Clocks" in n) or "Reset" in n]
    checks = _checks(report)
    assert checks["clock locking"]["status"] == "skip"
    assert "owns this GPU" in checks["clock locking"]["summary"]
    assert checks["set latency"]["status"] == "skip"
    assert checks["energy counter"]["status"] == "ok"
    assert rc == 0, report["verdict"]
    # What is true: not tried because of the owner (locking is allowed here), nothing said of
    # clock changes working.
    memory = checks["memory clock locking"]
    assert memory["summary"] == "not tried (the GPU is owned by a running process)", memory
    assert checks["set latency"]["summary"] == "skipped (the GPU is owned by a running process)"
    assert "change clocks" not in report["verdict"]
    assert report["verdict"].startswith("perseus can run here; clock changes not tried")
    assert f"GPU 0: pid {os.getpid()} owns this GPU" in report["verdict"]
