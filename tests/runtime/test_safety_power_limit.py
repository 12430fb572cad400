"""A rank lowers the power limit before the agent opens its GPU, then is SIGKILLed: the limit
goes back to NVML's *default* (never to the lowered limit found at open), through the watchdog
or, when the watchdog was killed too, through the next owner. The fake NVML is shared across
the rank, its watchdog and the next owner (:mod:`perseus.device.shared_fake_nvml`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus.device import shared_fake_nvml as shared_pynvml
from perseus.device.fake_nvml import FakeDevice
from perseus.device.nvml import NvmlGPU
from perseus.runtime.safety.guard import GpuClaim

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-8888-7777-6666-555555555555"

_RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.device import shared_fake_nvml as nvml
    from perseus.device.nvml import NvmlGPU
    from perseus.runtime.safety.guard import GpuClaim

    uuid, locks = sys.argv[1], Path(sys.argv[2])
    # What a recurring job does in each rank before the agent opens the GPU.
    nvml.nvmlInit()
    nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByUUID(uuid), 250_000)
    nvml.nvmlShutdown()
    gpu = NvmlGPU(uuid, nvml_module=nvml, privileged=True, lock_dir=locks).open()
    claim = GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None).acquire()
    gpu.set_locked_clock(900)
    print("ready", claim.watchdog.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    state = tmp_path / "nvml.json"
    shared_pynvml.write_devices(state, [FakeDevice(UUID), FakeDevice(OTHER, locked=(1200, 1200))])
    monkeypatch.setenv(shared_pynvml.STATE_ENV, str(state))
    yield state


def _device(state: Path, uuid: str) -> Any:
    return next(d for d in shared_pynvml.read_devices(state) if d.uuid == uuid)


def _kill_rank(tmp_path: Path, *, kill_watchdog: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _RANK, UUID, str(tmp_path / "locks")],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        assert line[:1] == ["ready"], line
        if kill_watchdog:
            os.kill(int(line[1]), signal.SIGKILL)
            time.sleep(0.2)  # dead before its owner: it never sees the pipe close
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_watchdog_restores_the_default_limit_not_the_lowered_one(
    shared: Path, tmp_path: Path
) -> None:
    _kill_rank(tmp_path, kill_watchdog=False)
    deadline = time.monotonic() + 10.0
    while _device(shared, UUID).locked is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the limit is set right after the clocks
    gpu = _device(shared, UUID)
    assert gpu.locked is None
    assert gpu.power_limit_mw == gpu.default_power_limit_mw == 400_000
    other = _device(shared, OTHER)
    assert other.locked == (1200, 1200) and other.power_limit_mw == 400_000


def test_next_owner_restores_the_default_limit_when_the_watchdog_died_too(
    shared: Path, tmp_path: Path
) -> None:
    _kill_rank(tmp_path, kill_watchdog=True)
    orphaned = _device(shared, UUID)
    assert orphaned.locked == (900, 900) and orphaned.power_limit_mw == 250_000
    gpu = NvmlGPU(UUID, nvml_module=shared_pynvml, privileged=True, lock_dir=tmp_path / "locks")
    gpu.open()
    claim = GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire()
    try:
        assert claim.ownership.reset_stale_pid is not None
        reset = _device(shared, UUID)
        assert reset.locked is None and reset.power_limit_mw == 400_000
        other = _device(shared, OTHER)
        assert other.locked == (1200, 1200) and other.power_limit_mw == 400_000
    finally:
        claim.release()
        gpu.close()
