"""``perseus device``: info without a driver, with fake NVML, reset and slowdown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.device.simulated import SimulatedGPU
from perseus.runtime.agent.rank_agent import RankAgent
from tests.fakes.fake_pynvml import FakeDevice, FakeNvml
from tests.runtime.plans import tiny_plan


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def test_info_without_driver_lists_simulated_gpus(
    no_driver: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path, set_latency_s=0.0)
    with RankAgent(tiny_plan(), gpu, 0, watchdog=False, handle_signals=False) as agent:
        agent.step_begin()
        with agent.op("F", 0):
            agent.wait_for_clock()
        assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no NVIDIA driver found; showing simulated GPUs"
    text = "\n".join(out)
    assert gpu.uuid in text
    assert "81 values, 1410-210 MHz, step 15" in text
    assert f"lock: 1095 MHz; owner: pid {os.getpid()}" in text
    assert "h100 (NVIDIA H100 80GB HBM3, estimated)" in text


def test_info_with_empty_state_dir(
    no_driver: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["device", "--sim-dir", str(tmp_path / "none"), "info"]) == 0
    assert "none yet" in capsys.readouterr().out


def test_info_with_nvml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeNvml(devices=[FakeDevice("GPU-aaaa", persistence=0)])
    monkeypatch.setattr("perseus.device.nvml.import_nvml", lambda: fake)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA GPUs (1):" in out
    assert "GPU-aaaa" in out
    assert "persistence mode OFF" in out
    assert "NVML cannot read locks back" in out
    assert fake.initialized == 0


def test_reset_and_slowdown_a_simulated_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = SimulatedGPU.from_preset("a40", index=2, state_dir=tmp_path, set_latency_s=0.0)
    gpu.set_locked_clock(1200)
    assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "2"]) == 0
    assert gpu.locked_clock_mhz() is None
    assert main(["device", "--sim-dir", str(tmp_path), "slowdown", "2", "1.25"]) == 0
    assert gpu.slowdown == 1.25
    assert main(["device", "--sim-dir", str(tmp_path), "slowdown", "2", "0"]) == 2
    assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "7"]) == 2
    assert "no simulated GPU 7" in capsys.readouterr().err
