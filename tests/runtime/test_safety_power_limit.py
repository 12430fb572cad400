"""A rank lowers the power limit before the agent opens its GPU, then is SIGKILLed: the limit
goes back to the GPU's *default* (never to the lowered limit found at open), through the
watchdog or, when the watchdog was killed too, through the next owner. The rank, its watchdog
and the next owner share simulated GPUs (their state outlives a process, like a driver's); the
next owner of an NVML GPU restores NVML's default limit through the NVML it was given."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.simulated import SimulatedGPU
from perseus.runtime.safety.guard import GpuClaim

REPO = Path(__file__).resolve().parents[2]

_RANK = textwrap.dedent(
    """
    import sys, time
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.safety.guard import GpuClaim

    # What a recurring job does in each rank before the agent opens the GPU.
    SimulatedGPU.from_preset("a100", state_dir=sys.argv[1], set_latency_s=0.0).set_power_limit_w(250)
    gpu = SimulatedGPU.from_preset("a100", state_dir=sys.argv[1], set_latency_s=0.0)
    claim = GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None).acquire()
    gpu.set_locked_clock(900)
    print("ready", claim.watchdog.pid, flush=True)
    time.sleep(60)
    """
)


def _gpus(tmp_path: Path) -> tuple[SimulatedGPU, SimulatedGPU]:
    """The rank's GPU (index 0) and another one, locked by someone else (index 1)."""
    gpu, other = (
        SimulatedGPU.from_preset("a100", index=i, state_dir=tmp_path / "sim", set_latency_s=0.0)
        for i in (0, 1)
    )
    other.set_locked_clock(1200)
    return gpu, other


def _default(gpu: SimulatedGPU) -> bool:
    return gpu.power_limit_w() == gpu.power_limit_range_w()[1] == 400.0


def _kill_rank(tmp_path: Path, *, kill_watchdog: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(tmp_path / "sim")], stdout=subprocess.PIPE, env=env
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


def test_watchdog_restores_the_default_limit_not_the_lowered_one(tmp_path: Path) -> None:
    gpu, other = _gpus(tmp_path)
    _kill_rank(tmp_path, kill_watchdog=False)
    deadline = time.monotonic() + 10.0
    while gpu.locked_clock_mhz() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu.locked_clock_mhz() is None and _default(gpu)  # one reset: clocks and limit
    assert other.locked_clock_mhz() == 1200 and _default(other)


def test_next_owner_restores_the_default_limit_when_the_watchdog_died_too(
    tmp_path: Path,
) -> None:
    gpu, other = _gpus(tmp_path)
    _kill_rank(tmp_path, kill_watchdog=True)
    assert gpu.locked_clock_mhz() == 900 and gpu.power_limit_w() == 250.0  # orphaned
    claim = GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire()
    try:
        assert claim.ownership.reset_stale_pid is not None
        assert gpu.locked_clock_mhz() is None and _default(gpu)
        assert other.locked_clock_mhz() == 1200 and _default(other)
    finally:
        claim.release()


def test_next_owner_of_an_nvml_gpu_restores_nvmls_default_limit(tmp_path: Path) -> None:
    """What a killed rank and watchdog leave on an NVML GPU (a lowered limit, a lock and a dead
    owner's record): the next owner resets the GPU in hand through the NVML it was given, to
    ``nvmlDeviceGetPowerManagementDefaultLimit``, never to the limit it found at open."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    nvml = FakeNvml(
        devices=[
            FakeDevice(uuid, power_limit_mw=250_000, locked=(900, 900)),
            FakeDevice("GPU-other", locked=(1200, 1200)),
        ]
    )
    gpu = NvmlGPU(uuid, nvml_module=nvml, privileged=True, lock_dir=tmp_path).open()
    gpu.owner_lock_path().write_text(f"{dead.pid}\n", encoding="ascii")
    claim = GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire()
    try:
        assert claim.ownership.reset_stale_pid == dead.pid
        device, other = nvml.devices
        assert device.locked is None and device.power_limit_mw == 400_000
        assert other.locked == (1200, 1200) and other.power_limit_mw == 400_000
    finally:
        claim.release()
        gpu.close()
