"""A recurring run lowers a GPU's power limit and is SIGKILLed: the limit goes back to the
GPU's *default*, through the job's watchdog or, when the watchdog is killed too, through the
GPU's next owner, with ``own_gpu`` and without it (the pipeline composition, where an agent of
the same process owns the GPU). The run, its watchdog and the next owner share simulated GPUs
(their state outlives a process, like a driver's); a recurring run that finds an orphaned NVML
GPU resets it through the NVML it was given."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perseus.device.fake_nvml import FakeDevice, FakeNvml
from perseus.device.nvml import NvmlGPU
from perseus.device.simulated import SimulatedGPU
from perseus.io.process_identity import parse_record, this_process
from perseus.recurring.job import RecurringJob
from perseus.recurring.store import SQLiteStore
from perseus.runtime.safety.guard import GpuClaim

REPO = Path(__file__).resolve().parents[2]
LOWERED_W = 250.0
DEFAULT_W = 400.0

_RUN = textwrap.dedent(
    """
    import sys, time
    from perseus.device.simulated import SimulatedGPU
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore
    from perseus.runtime.safety.guard import GpuClaim

    sim, db, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    gpu = SimulatedGPU.from_preset("a100", state_dir=sim, set_latency_s=0.0)
    job = RecurringJob(
        "j", batch_sizes=[32], default_batch_size=32, store=SQLiteStore(db), gpu=gpu,
        own_gpu=mode == "own", heartbeat_interval_s=0.0,
        profiler_kwargs={"power_limits_w": [250.0], "warmup_steps": 1},
    )
    with job.run() as run:
        run.step(32)  # warm-up done: the profiler sets 250 W
        assert gpu.power_limit_w() == 250.0
        if mode == "agent":  # the pipeline composition: an agent of this process owns the GPU
            GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None).acquire()
            gpu.set_locked_clock(900)
        print("ready", flush=True)
        time.sleep(60)
    """
)


def _gpus(tmp_path: Path) -> tuple[SimulatedGPU, SimulatedGPU]:
    """The run's GPU (index 0) and another one (index 1), shared with the run's processes."""
    gpu, other = (
        SimulatedGPU.from_preset("a100", index=i, state_dir=tmp_path / "sim", set_latency_s=0.0)
        for i in (0, 1)
    )
    assert gpu.power_limit_range_w()[1] == DEFAULT_W
    return gpu, other


def _run(tmp_path: Path, mode: str) -> subprocess.Popen[bytes]:
    args = [str(tmp_path / "sim"), str(tmp_path / "j.db"), mode]
    return subprocess.Popen(
        [sys.executable, "-c", _RUN, *args],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _kill_run(tmp_path: Path, mode: str, *, kill_watchdogs: bool) -> None:
    proc = _run(tmp_path, mode)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().strip() == "ready"
        watchdogs = _children(proc.pid)
        assert watchdogs, "the run started no watchdog"
        if kill_watchdogs:  # everything dies at once (a container's cgroup killed)
            for pid in watchdogs:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _wait_for_default(gpu: SimulatedGPU) -> None:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if gpu.power_limit_w() == DEFAULT_W and gpu.locked_clock_mhz() is None:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["own", "shared", "agent"])
def test_a_killed_run_ends_at_the_default_limit_through_its_watchdog(
    tmp_path: Path, mode: str
) -> None:
    gpu, other = _gpus(tmp_path)
    _kill_run(tmp_path, mode, kill_watchdogs=False)
    _wait_for_default(gpu)
    assert gpu.power_limit_w() == DEFAULT_W
    assert gpu.locked_clock_mhz() is None
    assert other.power_limit_w() == DEFAULT_W


@pytest.mark.parametrize("mode", ["own", "shared", "agent"])
def test_the_next_owner_restores_the_default_limit_when_the_watchdogs_died_too(
    tmp_path: Path, mode: str
) -> None:
    gpu, other = _gpus(tmp_path)
    _kill_run(tmp_path, mode, kill_watchdogs=True)
    assert gpu.power_limit_w() == LOWERED_W  # orphaned
    claim = GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire()
    try:
        assert claim.ownership.reset_stale_pid is not None
        assert gpu.power_limit_w() == DEFAULT_W
        assert gpu.locked_clock_mhz() is None
        assert other.power_limit_w() == DEFAULT_W
    finally:
        claim.release()


def test_a_clean_run_leaves_no_reset_due(tmp_path: Path) -> None:
    """Without ``own_gpu`` the record that a reset is due is cleared when the run ends."""
    gpu, _ = _gpus(tmp_path)
    job = RecurringJob(
        "j",
        batch_sizes=[32],
        default_batch_size=32,
        store=SQLiteStore(tmp_path / "j.db"),
        gpu=gpu,
        own_gpu=False,
        profiler_kwargs={"power_limits_w": [250.0], "warmup_steps": 1},
    )
    with job.run() as run:
        run.step(32)
        assert parse_record(gpu.owner_lock_path().read_bytes()) == this_process()
    assert gpu.owner_lock_path().read_text() == ""
    assert gpu.power_limit_w() == DEFAULT_W


def test_ctrl_c_in_the_runs_reset_still_lets_the_gpu_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing in the end-of-run reset skipped the claim's release: the lock stayed
    held, and the next run of a loop that caught the KeyboardInterrupt found the GPU owned."""
    gpu, _ = _gpus(tmp_path)
    job = RecurringJob(
        "j",
        batch_sizes=[32],
        default_batch_size=32,
        store=SQLiteStore(tmp_path / "j.db"),
        gpu=gpu,
        profiler_kwargs={"power_limits_w": [250.0], "warmup_steps": 1},
    )
    reset = gpu.reset_power_limit

    def interrupted() -> None:
        reset()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), job.run() as run:
        run.step(32)
        monkeypatch.setattr(gpu, "reset_power_limit", interrupted)
    monkeypatch.undo()
    GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire().release()


def test_a_recurring_run_that_finds_an_orphaned_gpu_resets_the_gpu_in_hand(
    tmp_path: Path,
) -> None:
    """The next owner is a recurring run (``own_gpu``) on an NVML GPU that a killed run and
    its watchdogs left locked at a lowered limit: it resets the GPU it opened (through the
    NVML it was given, to NVML's default limit), not through whatever NVML module a reset
    spec would infer."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    nvml = FakeNvml(devices=[FakeDevice(uuid, power_limit_mw=250_000, locked=(900, 900))])
    gpu = NvmlGPU(uuid, nvml_module=nvml, privileged=True, lock_dir=tmp_path).open()
    gpu.owner_lock_path().write_text(f"{dead.pid}\n", encoding="ascii")
    job = RecurringJob(
        "j",
        batch_sizes=[32],
        default_batch_size=32,
        store=SQLiteStore(tmp_path / "j.db"),
        gpu=gpu,
        profiler_kwargs={"power_limits_w": [250.0], "warmup_steps": 5},
    )
    with job.run():
        (device,) = nvml.devices
        assert device.locked is None and device.power_limit_mw == 400_000
    gpu.close()


@pytest.mark.parametrize("mode", ["shared", "agent"])
def test_device_reset_refuses_a_live_job_without_the_lock(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``RecurringJob(own_gpu=False)`` holds no ownership lock (alone, or with an agent of its
    process): ``perseus device reset`` sees it as the live owner it is, exits 2 and leaves its
    lowered limit; ``device info`` shows it alive."""
    from perseus.cli.main import main

    gpu, _ = _gpus(tmp_path)
    sim = str(tmp_path / "sim")
    proc = _run(tmp_path, mode)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().strip() == "ready"
        assert main(["device", "--sim-dir", sim, "reset", "--sim", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"owned by the running process {proc.pid}" in err and "\n" not in err
        assert gpu.power_limit_w() == LOWERED_W  # kept
        assert main(["device", "--sim-dir", sim, "info"]) == 0
        assert f"owner: pid {proc.pid} (alive)" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
