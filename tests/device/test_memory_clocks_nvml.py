"""Memory clocks through NVML (fake): discovered, locked, and reset on every exit path;
observe-only never touches them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from perseus.device import ownership
from perseus.device.base import ObserveOnlyWarning
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.ownership import GpuOwnership, acquire_owner_lock
from perseus.errors import DeviceNotSupportedError, DevicePermissionError
from perseus.runtime.agent.rank_agent import RankAgent
from tests.runtime.plans import tiny_plan

A40 = "GPU-a40"
A40_MEMORY = (7251, 5001, 810, 405)


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(
        devices=[
            FakeDevice(A40, name="NVIDIA A40", memory_clocks=A40_MEMORY),
            FakeDevice("GPU-hbm"),  # an A100: one memory clock
        ]
    )


def _gpu(nvml: FakeNvml, tmp_path: Path, uuid: str = A40, **kwargs: object) -> NvmlGPU:
    return NvmlGPU(uuid, nvml_module=nvml, privileged=True, lock_dir=tmp_path, **kwargs)


def test_discovers_locks_snaps_and_resets_at_close(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    assert gpu.supported_memory_clocks_mhz() == A40_MEMORY
    assert gpu.memory_clock_control() is None
    assert gpu.watchdog_spec()["memory_clocks"] is True
    assert gpu.set_memory_locked_clock(5000) == 5001
    assert nvml.devices[0].mem_locked == (5001, 5001) and gpu.locked_memory_clock_mhz() == 5001
    gpu.close()  # the exit path of a GPU used without an agent
    assert nvml.devices[0].mem_locked is None
    assert nvml.names().count("nvmlDeviceResetMemoryLockedClocks") == 1


def test_hbm_and_old_gpus_say_why_not(nvml: FakeNvml, tmp_path: Path) -> None:
    hbm = _gpu(nvml, tmp_path, "GPU-hbm").open()
    assert "one memory clock" in (hbm.memory_clock_control() or "")
    assert "memory_clocks" not in hbm.watchdog_spec()
    with pytest.raises(DeviceNotSupportedError, match="cannot lock memory clocks"):
        hbm.set_memory_locked_clock(1593)
    hbm.close()
    nvml.devices[0].architecture = 6  # Turing-era board
    old = _gpu(nvml, tmp_path).open()
    assert "older than Ampere" in (old.memory_clock_control() or "")
    old.close()
    assert "nvmlDeviceSetMemoryLockedClocks" not in nvml.names()


@pytest.mark.parametrize("how", ["control", "environment"])
def test_observe_only_never_sets_memory_clocks(
    nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "environment":
        monkeypatch.setenv("PERSEUS_NO_CLOCK_CHANGES", "1")
        gpu = _gpu(nvml, tmp_path).open()
    else:
        gpu = _gpu(nvml, tmp_path, control=False).open()
    assert gpu.memory_clock_control() is not None
    assert "memory_clocks" not in gpu.watchdog_spec()
    with pytest.raises(DevicePermissionError):
        gpu.set_memory_locked_clock(5001)
    with pytest.raises(DevicePermissionError):
        gpu.reset_memory_locked_clock()
    gpu.close()
    assert nvml.control_calls() == []


def _agent(gpu: NvmlGPU) -> RankAgent:
    return RankAgent(tiny_plan(freq_mhz=1095), gpu, rank=0, watchdog=False).start()


@pytest.mark.parametrize("path", ["close", "exit or signal"])
def test_the_agents_teardown_resets_the_memory_lock(
    nvml: FakeNvml, tmp_path: Path, path: str
) -> None:
    gpu = _gpu(nvml, tmp_path)
    agent = _agent(gpu)
    gpu.set_memory_locked_clock(5001)
    if path == "close":
        agent.close()
    else:
        agent._emergency_close()  # what the atexit hook and the SIGTERM/SIGINT handlers run
    assert nvml.devices[0].mem_locked is None and nvml.devices[0].locked is None
    gpu.close()


def test_the_watchdog_reset_includes_memory_clocks(
    nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    gpu.set_memory_locked_clock(5001)
    spec = gpu.watchdog_spec()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    ownership.reset_from_spec(spec)  # what the watchdog process runs when the owner dies
    assert nvml.devices[0].mem_locked is None


def test_the_next_owner_resets_a_dead_owners_memory_lock(
    nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = _gpu(nvml, tmp_path).open()
    gpu.set_memory_locked_clock(810)
    path = tmp_path / "a40.owner"
    fd, _, _ = acquire_owner_lock(path)
    assert fd is not None
    os.close(fd)  # the owner dies without releasing (and its watchdog with it)
    path.write_text(path.read_text().replace(str(os.getpid()), "999999999"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # The next owner resets the GPU it opened itself (its spec), never one read from the file.
    owner = GpuOwnership(A40, path, spec=gpu.watchdog_spec())
    owner.acquire()
    owner.release()
    assert nvml.devices[0].mem_locked is None


def test_observe_only_agent_warns_and_leaves_memory_alone(nvml: FakeNvml, tmp_path: Path) -> None:
    gpu = _gpu(nvml, tmp_path, control=False)
    with pytest.warns(ObserveOnlyWarning):
        agent = _agent(gpu)
    agent.close()
    gpu.close()
    assert nvml.control_calls() == []
