"""A recurring run lowers an NVML GPU's power limit and is SIGKILLed: the limit goes back to
NVML's *default*, through the job's watchdog or, when the watchdog is killed too, through the
GPU's next owner, with ``own_gpu`` and without it (the pipeline composition, where an agent of
the same process owns the GPU). The fake NVML is shared across the run, its watchdog and the
next owner (:mod:`perseus.device.shared_fake_nvml`)."""

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
from perseus.device.process_identity import parse_record, this_process
from perseus.runtime.safety.guard import GpuClaim

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-8888-7777-6666-555555555555"
LOWERED_MW = 250_000
DEFAULT_MW = 400_000

_RUN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.device import shared_fake_nvml as nvml
    from perseus.device.nvml import NvmlGPU
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore
    from perseus.runtime.safety.guard import GpuClaim

    uuid, locks, db, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    gpu = NvmlGPU(uuid, nvml_module=nvml, privileged=True, lock_dir=locks).open()
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


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    state = tmp_path / "nvml.json"
    shared_pynvml.write_devices(state, [FakeDevice(UUID), FakeDevice(OTHER)])
    monkeypatch.setenv(shared_pynvml.STATE_ENV, str(state))
    yield state


def _device(state: Path, uuid: str) -> Any:
    return next(d for d in shared_pynvml.read_devices(state) if d.uuid == uuid)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _kill_run(tmp_path: Path, mode: str, *, kill_watchdogs: bool) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN, UUID, str(tmp_path / "locks"), str(tmp_path / "j.db"), mode],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
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


def _wait_for_default(state: Path) -> Any:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        gpu = _device(state, UUID)
        if gpu.power_limit_mw == DEFAULT_MW and gpu.locked is None:
            return gpu
        time.sleep(0.05)
    return _device(state, UUID)


@pytest.mark.parametrize("mode", ["own", "shared", "agent"])
def test_a_killed_run_ends_at_the_default_limit_through_its_watchdog(
    shared: Path, tmp_path: Path, mode: str
) -> None:
    _kill_run(tmp_path, mode, kill_watchdogs=False)
    gpu = _wait_for_default(shared)
    assert gpu.power_limit_mw == DEFAULT_MW
    assert gpu.locked is None
    assert _device(shared, OTHER).power_limit_mw == DEFAULT_MW


@pytest.mark.parametrize("mode", ["own", "shared", "agent"])
def test_the_next_owner_restores_the_default_limit_when_the_watchdogs_died_too(
    shared: Path, tmp_path: Path, mode: str
) -> None:
    _kill_run(tmp_path, mode, kill_watchdogs=True)
    assert _device(shared, UUID).power_limit_mw == LOWERED_MW  # orphaned
    gpu = NvmlGPU(UUID, nvml_module=shared_pynvml, privileged=True, lock_dir=tmp_path / "locks")
    gpu.open()
    claim = GpuClaim(gpu, watchdog=False, handle_signals=False, on_exit=lambda: None).acquire()
    try:
        assert claim.ownership.reset_stale_pid is not None
        assert _device(shared, UUID).power_limit_mw == DEFAULT_MW
        assert _device(shared, UUID).locked is None
        assert _device(shared, OTHER).power_limit_mw == DEFAULT_MW
    finally:
        claim.release()
        gpu.close()


def test_a_clean_run_leaves_no_reset_due(shared: Path, tmp_path: Path) -> None:
    """Without ``own_gpu`` the record that a reset is due is cleared when the run ends."""
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore

    locks = tmp_path / "locks"
    gpu = NvmlGPU(UUID, nvml_module=shared_pynvml, privileged=True, lock_dir=locks).open()
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
        assert parse_record((locks / f"{UUID}.owner").read_bytes()) == this_process()
    assert (locks / f"{UUID}.owner").read_text() == ""
    assert _device(shared, UUID).power_limit_mw == DEFAULT_MW
    gpu.close()


def test_a_recurring_run_that_finds_an_orphaned_gpu_resets_the_gpu_in_hand(
    shared: Path, tmp_path: Path
) -> None:
    """The next owner is a recurring run (``own_gpu``): it resets the GPU it opened (through
    the fake it was given), not through whatever NVML module a reset spec would infer."""
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore

    _kill_run(tmp_path, "agent", kill_watchdogs=True)
    orphaned = _device(shared, UUID)
    assert orphaned.locked == (900, 900) and orphaned.power_limit_mw == LOWERED_MW
    locks = tmp_path / "locks"
    gpu = NvmlGPU(UUID, nvml_module=shared_pynvml, privileged=True, lock_dir=locks).open()
    job = RecurringJob(
        "j",
        batch_sizes=[32],
        default_batch_size=32,
        store=SQLiteStore(tmp_path / "j.db"),
        gpu=gpu,
        profiler_kwargs={"power_limits_w": [250.0], "warmup_steps": 5},
    )
    with job.run():
        now = _device(shared, UUID)
        assert now.locked is None and now.power_limit_mw == DEFAULT_MW
    gpu.close()


@pytest.mark.parametrize("mode", ["shared", "agent"])
def test_device_reset_refuses_a_live_job_without_the_lock(
    shared: Path,
    mode: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``RecurringJob(own_gpu=False)`` holds no ownership lock (alone, or with an agent of its
    process): ``perseus device reset --uuid`` sees it as the live owner it is, exits 2 and
    leaves its lowered limit; ``device info`` shows it alive."""
    from perseus.cli.main import main

    locks = tmp_path / "locks"
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN, UUID, str(locks), str(tmp_path / "j.db"), mode],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    monkeypatch.setattr("perseus.device.nvml.import_nvml", lambda: shared_pynvml)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(locks))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().strip() == "ready"
        assert main(["device", "reset", "--uuid", UUID]) == 2
        err = capsys.readouterr().err.strip()
        assert f"owned by the running process {proc.pid}" in err and "\n" not in err
        assert _device(shared, UUID).power_limit_mw == LOWERED_MW  # kept
        assert main(["device", "--sim-dir", str(tmp_path / "sim"), "info"]) == 0
        assert f"owner: pid {proc.pid} (alive)" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
