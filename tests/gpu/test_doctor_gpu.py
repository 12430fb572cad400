"""``perseus doctor --no-clock-changes`` and the observe-only NVML backend on a real GPU.

Skipped without an NVIDIA driver. Safe on a GPU whose operator forbids clock changes: every
NVML function that changes a device is replaced by one that records the attempt and raises,
and the tests assert that none was attempted. Run with ``-s`` to see the doctor's report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from perseus.cli.main import main
from perseus.device.nvml import NvmlGPU
from perseus.device.nvml_calls import is_control_function

pytestmark = pytest.mark.gpu


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every nvmlDeviceSet*/Reset* function of the real pynvml refuses and records the call."""
    pynvml = pytest.importorskip("pynvml")
    attempts: list[str] = []
    for name in dir(pynvml):
        if is_control_function(name) and callable(getattr(pynvml, name)):

            def refuse(*_args: object, _name: str = name) -> None:
                attempts.append(_name)
                raise RuntimeError(f"{_name} called under --no-clock-changes")

            monkeypatch.setattr(pynvml, name, refuse)
    monkeypatch.setenv("PERSEUS_NO_CLOCK_CHANGES", "1")
    yield attempts


def test_doctor_observe_only_on_a_real_gpu(
    refused: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["doctor", "--no-clock-changes", "--json", "--energy-window-s", "2"])
    out = capsys.readouterr().out
    report = json.loads(out)
    print(json.dumps(report, indent=1))  # visible with -s
    assert refused == []
    assert rc in (0, 1)
    assert report["mode"] == "observe-only"
    assert isinstance(report["nvml"]["driver"], str)
    assert report["gpus"], report
    checks = {c["name"]: c for c in report["gpus"][0]["checks"]}
    assert checks["gpu"]["data"]["uuid"].startswith(("GPU-", "MIG-"))
    assert checks["supported clocks"]["data"]["count"] > 1
    assert checks["set latency"]["status"] == "skip"
    energy = checks["energy counter"]["data"]
    assert energy["updates"] >= 2 and energy["smallest_step_mj"] > 0
    # Idle and blocked power from the counter, observe-only (no set call: `refused` is empty).
    blocking = checks["blocking power"]
    assert blocking["status"] in ("ok", "warn"), blocking
    assert 0 < blocking["data"]["idle_w"] < 1000 and 0 < blocking["data"]["blocked_w"] < 1000
    cuda = checks["cuda check"]
    assert cuda["status"] == "ok", cuda
    (row,) = cuda["data"]["rows"]  # only the current clock under --no-clock-changes
    for op in ("F", "B"):
        assert row[op]["time_ms_median"] > 0
        assert row[op]["samples"] > 0 and row[op]["sm_clock_mhz_median"] > 0


def test_observe_only_backend_reads_everything(refused: list[str]) -> None:
    with NvmlGPU(index=0, control=False) as gpu:
        assert gpu.observe_only_reason is not None
        first = gpu.energy_mj()
        time.sleep(0.3)
        assert gpu.energy_mj() >= first
        assert gpu.power_w() > 0
        assert gpu.current_clock_mhz() > 0
        assert gpu.clock_event_reasons() >= 0
    assert refused == []
