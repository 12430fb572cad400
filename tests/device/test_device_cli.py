"""``perseus device``: info without a driver, with fake NVML, reset and slowdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.simulated import SimulatedGPU
from perseus.runtime.agent.rank_agent import RankAgent
from tests.runtime.plans import tiny_plan

REPO = Path(__file__).resolve().parents[2]


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


_ORPHAN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.safety.guard import GpuClaim

    gpu = SimulatedGPU.from_preset("a40", state_dir=Path(sys.argv[1]), set_latency_s=0.0)
    claim = GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None).acquire()
    gpu.set_power_limit_w(150.0)
    gpu.set_locked_clock(900)
    print("ready", claim.watchdog.pid, flush=True)
    time.sleep(60)
    """
)


def test_info_shows_an_orphaned_gpu_and_reset_restores_clock_and_limit(
    no_driver: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Owner and watchdog both killed: ``device info`` names the dead owner and the lowered
    limit; ``device reset`` removes the lock, restores the default limit and clears the pid."""
    sim = tmp_path / "sim"
    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, str(sim)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        assert line[:1] == ["ready"], line
        os.kill(int(line[1]), signal.SIGKILL)  # the watchdog first: nobody resets
        time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    gpu = SimulatedGPU.from_preset("a40", state_dir=sim, set_latency_s=0.0)
    locked = gpu.locked_clock_mhz()
    default_w = gpu.power_limit_range_w()[1]
    assert locked is not None and gpu.power_limit_w() == 150.0
    capsys.readouterr()
    assert main(["device", "--sim-dir", str(sim), "info"]) == 0
    out = capsys.readouterr().out
    assert f"lock: {locked} MHz; owner: pid {proc.pid} (dead); orphaned: run " in out
    assert "`perseus device reset --sim 0`" in out
    assert f"power limit: 150 W (default {default_w:g} W)" in out
    assert main(["device", "--sim-dir", str(sim), "reset", "--sim", "0"]) == 0
    said = capsys.readouterr().out.strip()
    assert said == (
        f"simulated GPU 0: clock lock {locked} MHz removed; power limit 150 W restored to the "
        f"default {default_w:g} W; dead owner pid {proc.pid}'s record cleared"
    )
    assert gpu.locked_clock_mhz() is None and gpu.power_limit_w() == default_w
    assert main(["device", "--sim-dir", str(sim), "info"]) == 0
    out = capsys.readouterr().out
    assert "lock: none; owner: none" in out
    assert f"power limit: {default_w:g} W (the default)" in out


def test_reset_refuses_a_gpu_a_running_process_owns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp_path, set_latency_s=0.0)
    gpu.set_locked_clock(900)
    hold = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from perseus.device.ownership import GpuOwnership\n"
        "GpuOwnership(sys.argv[1], Path(sys.argv[2])).acquire()\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", hold, gpu.uuid, str(gpu.owner_lock_path())],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"owned by the running process {proc.pid}" in err and "\n" not in err
        assert gpu.locked_clock_mhz() is not None  # left to its owner
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_info_tells_how_to_fix_a_gpu_left_off_its_defaults_without_an_owner(
    no_driver: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A clock lock or a lowered limit with no owner recorded (set by a process that released
    its lock without resetting, or by hand) is what an operator must fix: say how, and where
    the lock lives. A GPU at its defaults just says ``owner: none``."""
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp_path, set_latency_s=0.0)
    gpu.set_locked_clock(900)
    gpu.set_power_limit_w(200.0)
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    out = capsys.readouterr().out
    assert (
        "lock: 900 MHz; owner: none; not at its defaults: run `perseus device reset --sim 0`"
        in (out)
    )
    assert "power limit: 200 W (default 300 W)" in out
    assert f"lock file: {gpu.owner_lock_path()}" in out
    assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 0
    capsys.readouterr()
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    out = capsys.readouterr().out
    assert "lock: none; owner: none\n" in out and "not at its defaults" not in out
    # NVML: clocks cannot be read back, a lowered limit can.
    fake = FakeNvml(devices=[FakeDevice("GPU-aaaa", power_limit_mw=250_000)])
    monkeypatch.setattr("perseus.device.nvml.import_nvml", lambda: fake)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path / "locks"))
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    out = capsys.readouterr().out
    assert "not at its defaults: run `perseus device reset --uuid GPU-aaaa`" in out


@pytest.mark.parametrize(
    ("kind", "why"),
    [("fifo", "is not a regular file"), ("dir", "is a directory"), ("link", "is a symbolic link")],
)
def test_info_says_reset_refuses_a_planted_lock_file(
    no_driver: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    why: str,
) -> None:
    """A FIFO, directory or link planted at a GPU's lock path: ``reset`` refuses it, and
    ``info`` says so (and why) instead of ``owner: none`` and advice to run that reset."""
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp_path / "sim", set_latency_s=0.0)
    gpu.set_locked_clock(900)
    lock = gpu.owner_lock_path()
    lock.unlink(missing_ok=True)
    plant = {"fifo": os.mkfifo, "dir": os.mkdir, "link": lambda p: p.symlink_to(tmp_path)}[kind]
    plant(lock)
    fake = FakeNvml(devices=[FakeDevice("GPU-aaaa", power_limit_mw=250_000)])
    monkeypatch.setattr("perseus.device.nvml.import_nvml", lambda: fake)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path / "locks"))
    nvml_lock = tmp_path / "locks" / "GPU-aaaa.owner"
    (tmp_path / "locks").mkdir(mode=0o700)
    plant(nvml_lock)
    assert main(["device", "--sim-dir", str(tmp_path / "sim"), "info"]) == 0
    out = capsys.readouterr().out
    assert "owner: none" not in out and "not at its defaults" not in out
    for path in (lock, nvml_lock):
        assert f"owner: unknown: lock file refused: {path} {why}; " in out
    assert main(["device", "--sim-dir", str(tmp_path / "sim"), "reset", "--sim", "0"]) == 2
    assert f"{lock} {why}; " in capsys.readouterr().err
