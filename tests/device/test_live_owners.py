"""Every composition that changes a GPU is a live owner to ``perseus device reset`` and
``device info``; lock files are read as records (pid, start time, boot, PID namespace), never
trusted beyond that, and odd contents give a correct decision or one line, never a traceback.

An adversarial suite: live owners in each composition (an agent, a recurring job with and
without ``own_gpu``, both in one process, the agent gone first), an owner in another PID
namespace, a reused pid, and lock files an attacker or a crash could leave.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.device.ownership import GpuOwnership, acquire_owner_lock, release_owner_lock
from perseus.device.simulated import SimulatedGPU
from perseus.io.process_identity import (
    ProcessRecord,
    format_record,
    liveness,
    parse_record,
    process_start,
    this_process,
)

REPO = Path(__file__).resolve().parents[2]
LOWERED_W = 150.0

_OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.device.simulated import SimulatedGPU
    from perseus.recurring.job import RecurringJob
    from perseus.recurring.store import SQLiteStore
    from perseus.runtime.safety.guard import GpuClaim

    state, mode = Path(sys.argv[1]), sys.argv[2]
    gpu = SimulatedGPU.from_preset("a40", state_dir=state, set_latency_s=0.0)

    def agent():
        return GpuClaim(gpu, watchdog=True, handle_signals=True, on_exit=lambda: None).acquire()

    if mode == "agent":
        claim = agent()
        gpu.set_power_limit_w(150.0)
        print("ready", flush=True)
        time.sleep(60)
    job = RecurringJob("j", batch_sizes=[32], default_batch_size=32,
                       store=SQLiteStore(state.parent / "jobs.db"), gpu=gpu,
                       own_gpu=mode == "own", heartbeat_interval_s=0.0,
                       profiler_kwargs={"power_limits_w": [150.0], "warmup_steps": 1})
    with job.run() as run:
        run.step(32)  # warm-up done: the profiler sets 150 W
        if mode in ("both", "agent-gone"):
            claim = agent()
            if mode == "agent-gone":  # the agent ends first; the job's run goes on
                claim.release()
        print("ready", flush=True)
        time.sleep(60)
    """
)


@pytest.fixture
def owner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    state = tmp_path / "sim"
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(state), request.param],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if line != "ready":
            proc.kill()
            pytest.fail(proc.communicate()[1].decode()[-3000:])
        yield state, proc.pid
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("owner", ["agent", "own", "shared", "both", "agent-gone"], indirect=True)
def test_reset_refuses_a_live_owner_in_every_composition(
    owner: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    """``own_gpu=False`` holds no lock, and an agent of its process may have come and gone:
    its record still names a live owner, so a reset is refused (exit 2) and the limit kept."""
    state, pid = owner
    gpu = SimulatedGPU.from_preset("a40", state_dir=state, set_latency_s=0.0)
    assert gpu.power_limit_w() == LOWERED_W
    assert main(["device", "--sim-dir", str(state), "info"]) == 0
    assert f"owner: pid {pid} (alive)" in capsys.readouterr().out
    assert main(["device", "--sim-dir", str(state), "reset", "--sim", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"owned by the running process {pid}" in err and "\n" not in err
    assert gpu.power_limit_w() == LOWERED_W  # left to its owner
    # Nor can another process take the GPU over (it would reset it as a dead owner's).
    from perseus.errors import DeviceBusyError

    with pytest.raises(DeviceBusyError, match=f"process {pid}"):
        GpuOwnership(gpu.uuid, gpu.owner_lock_path()).acquire(wait_s=0.0)
    assert gpu.power_limit_w() == LOWERED_W


def _gpu(tmp_path: Path) -> SimulatedGPU:
    gpu = SimulatedGPU.from_preset("a40", state_dir=tmp_path, set_latency_s=0.0)
    gpu.set_power_limit_w(LOWERED_W)
    return gpu


def _free_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_owner_in_another_pid_namespace_is_not_presumed_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A container's job recorded its own pid, which means nothing here: that no process has
    it in this namespace is no proof of death. Refused with the namespace and how to force."""
    gpu = _gpu(tmp_path)
    me = this_process()
    foreign = ProcessRecord(_free_pid(), me.start, "pid:[4026530000]")
    assert foreign.namespace != me.namespace and liveness(foreign) == "unknown"
    gpu.owner_lock_path().write_bytes(format_record(foreign))
    assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another PID namespace (pid:[4026530000]" in err and "--force" in err
    assert "\n" not in err and gpu.power_limit_w() == LOWERED_W
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    assert f"owner: pid {foreign.pid} (alive)" in capsys.readouterr().out
    argv = ["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0", "--force"]
    assert main(argv) == 0
    assert f"dead owner pid {foreign.pid}'s record cleared" in capsys.readouterr().out
    assert gpu.power_limit_w() == 300.0 and gpu.owner_lock_path().read_bytes() == b""


def test_a_reused_pid_or_another_boot_is_a_dead_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recorded pid is alive but started at another time (reused), or the record is from
    before a reboot: the owner is gone, and the GPU is reset as an orphan."""
    parent = os.getppid()
    start = process_start(parent)
    assert start is not None
    boot, ticks = start.rsplit(":", 1)
    me = this_process()
    for record in (
        ProcessRecord(parent, f"{boot}:{int(ticks) + 1}", me.namespace),  # reused pid
        ProcessRecord(parent, f"00000000-0000-0000-0000-000000000000:{ticks}", me.namespace),
    ):
        assert liveness(record) == "gone"
        gpu = _gpu(tmp_path)
        gpu.owner_lock_path().write_bytes(format_record(record))
        assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
        assert f"owner: pid {parent} (dead); orphaned" in capsys.readouterr().out
        assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 0
        assert f"dead owner pid {parent}'s record cleared" in capsys.readouterr().out
        assert gpu.power_limit_w() == 300.0
    # The same pid with its real start time is its live owner.
    assert liveness(ProcessRecord(parent, start, me.namespace)) == "alive"


_ODD = {
    "a megabyte of digits": b"7" * 1_000_000,
    "NUL bytes": b"\x00\x00\x00\n",
    "a NUL after the pid": b"1\x004242\n",
    "Arabic-Indic digits": "١٢٣".encode(),
    "a superscript digit": "²".encode(),
    "a negative pid": b"-1\n",
    "pid 0": b"0\n",
    "not UTF-8": b"\xff\xfe\xfd\n",
    "a forged record": b"1 ../../etc:1 pid:[x]\n",
}


@pytest.mark.parametrize("content", list(_ODD.values()), ids=list(_ODD))
def test_odd_lock_contents_name_no_owner_and_never_raise(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a record: nobody owns the GPU by it (pid 0 or -1 would name a process group, and
    int() takes non-ASCII digits); info, reset and the next owner each decide without a
    traceback, and the next owner writes a clean record over it."""
    assert parse_record(content) is None
    gpu = _gpu(tmp_path)
    gpu.owner_lock_path().write_bytes(content)
    assert main(["device", "--sim-dir", str(tmp_path), "info"]) == 0
    assert "owner: none" in capsys.readouterr().out
    fd, owner_pid, stale = acquire_owner_lock(gpu.owner_lock_path())
    assert fd is not None and owner_pid is None and stale is None
    assert gpu.owner_lock_path().read_bytes() == format_record(this_process())
    release_owner_lock(fd, gpu.owner_lock_path())
    gpu.owner_lock_path().write_bytes(content)
    assert main(["device", "--sim-dir", str(tmp_path), "reset", "--sim", "0"]) == 0
    assert gpu.power_limit_w() == 300.0


@pytest.mark.parametrize("pid", [4194304, 4194305, 9999999999])
def test_a_record_at_or_past_the_largest_pid_is_a_dead_owner(tmp_path: Path, pid: int) -> None:
    """pid_max's ceiling (2**22) and anything past it name no live process: a record of
    one is an owner that left without a clean release, and the next owner resets."""
    assert parse_record(f"{pid}\n".encode()) == ProcessRecord(pid)
    assert liveness(ProcessRecord(pid)) == "gone"
    gpu = _gpu(tmp_path)
    gpu.owner_lock_path().write_bytes(f"{pid}\n".encode())
    fd, _owner, stale = acquire_owner_lock(gpu.owner_lock_path())
    assert fd is not None and stale == pid
    release_owner_lock(fd, gpu.owner_lock_path())


@pytest.mark.parametrize("suffix", [".owner", ".state", ".info.json"])
def test_a_directory_under_a_state_files_name_is_one_line(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An attacker's directory where a lock, state or info file goes: refused with one line
    naming it and the fix, from the library and from the CLI, never an IsADirectoryError."""
    from perseus.errors import ConfigError

    first = SimulatedGPU.from_preset("a40", index=0, state_dir=tmp_path / "a", set_latency_s=0.0)
    planted = tmp_path / "b" / f"{first.uuid}{suffix}"
    planted.mkdir(parents=True)
    planted.parent.chmod(0o700)
    with pytest.raises(ConfigError, match=rf"{planted} is a directory; .*rm -r {planted}"):
        gpu = SimulatedGPU.from_preset("a40", index=0, state_dir=planted.parent, set_latency_s=0.0)
        gpu.set_locked_clock(900)
        GpuOwnership(gpu.uuid, gpu.owner_lock_path()).acquire()
    for argv in (["info"], ["reset", "--sim", "0"]):
        code = main(["device", "--sim-dir", str(planted.parent), *argv])
        err = capsys.readouterr().err.strip()
        assert code in (0, 2) and "Traceback" not in err and "\n" not in err
