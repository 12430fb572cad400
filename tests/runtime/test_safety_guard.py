"""ExitGuard: one signal chain for every guard of a process, and signals handled while the main
thread is blocked in C."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from perseus.runtime.safety.guard import ExitGuard

REPO = Path(__file__).resolve().parents[2]


def test_guards_closed_in_any_order_leave_the_original_handler() -> None:
    seen: list[str] = []

    def original(signum: int, frame: object) -> None:
        seen.append("original")

    before = signal.signal(signal.SIGUSR1, original)
    try:
        a = ExitGuard(lambda: seen.append("a"), signals=(signal.SIGUSR1,))
        b = ExitGuard(lambda: seen.append("b"), signals=(signal.SIGUSR1,))
        a.install()
        b.install()
        a.uninstall()  # closed first, although installed first
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert seen == ["original"]  # handled, the process goes on: no guard runs
        b.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is original
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert seen == ["original", "original"]
    finally:
        signal.signal(signal.SIGUSR1, before)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("handler", ["returns", "raises", "ignored"])
def test_a_guard_runs_only_when_the_signal_ends_the_process(handler: str) -> None:
    """The handler installed before decides: one that returns (the program's "stop after
    this epoch") or a signal the process ignores leaves the GPU alone; one that raises (the
    process is ending, as with KeyboardInterrupt) runs the guard before the exception
    unwinds. The guard runs once, the exception goes on."""
    seen: list[str] = []

    def previous(signum: int, frame: object) -> None:
        seen.append("previous")
        if handler == "raises":
            raise _Stop

    disposition = signal.SIG_IGN if handler == "ignored" else previous
    before = signal.signal(signal.SIGUSR1, disposition)
    guard = ExitGuard(lambda: seen.append("guard"), signals=(signal.SIGUSR1,))
    try:
        guard.install()
        if handler == "ignored":
            assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN  # nothing installed
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
        except _Stop:
            seen.append("raised")
        expected = {
            "returns": ["previous"],
            "raises": ["previous", "guard", "raised"],
            "ignored": [],
        }[handler]
        assert seen == expected
    finally:
        guard.uninstall()
        signal.signal(signal.SIGUSR1, before)


def test_callback_runs_once_and_its_errors_are_swallowed() -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("reset failed")

    guard = ExitGuard(broken, signals=())
    guard.install()
    guard._run_once()
    guard._run_once()
    guard.uninstall()
    assert calls == [1]


BLOCKED = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    import torch.distributed as dist
    from perseus.runtime.safety.guard import ExitGuard

    marker = sys.argv[1]

    def reset():
        with open(marker, "w") as f:
            f.write(repr(time.time()))

    ExitGuard(reset).install()
    print("blocking", flush=True)
    # A C++ wait that does not return on signals, like a collective whose peer died.
    dist.HashStore().wait(["never"], timedelta(seconds=60))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_is_handled_while_the_main_thread_is_blocked_in_c(tmp_path: Path, sig: int) -> None:
    pytest.importorskip("torch.distributed")
    marker = tmp_path / "reset"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "blocking"
    time.sleep(0.2)
    t0 = time.time()
    proc.send_signal(sig)
    if sig == signal.SIGINT:
        # SIGINT becomes KeyboardInterrupt when the main thread is back in Python: not forced,
        # and the process lives on meanwhile, so its GPU is left alone (the watchdog resets
        # it if the process is killed instead).
        time.sleep(0.5)
        assert proc.poll() is None and not marker.exists()
        proc.kill()
        proc.communicate()
        return
    deadline = time.monotonic() + 1.0
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert marker.exists(), "the reset did not run within 1 s of the signal"
    assert float(marker.read_text()) - t0 < 1.0
    # The default action (terminate) is carried out although the main thread is stuck.
    proc.communicate(timeout=10)
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)


FORKED = textwrap.dedent(
    """
    import os, signal, sys, time, warnings
    warnings.simplefilter("ignore")  # fork() with the watcher thread running (3.12+ warns)
    from perseus.runtime.safety import guard as safety

    parent = safety.ExitGuard(lambda: None)
    parent.install()
    pid = os.fork()
    if pid == 0:
        marker = sys.argv[1]
        child = safety.ExitGuard(lambda: open(marker, "w").close())
        child.install()
        ok = safety._CHAIN._wakeup is not None
        os.kill(os.getpid(), signal.SIGUSR2) if not ok else None
        time.sleep(30)  # SIGTERM'd by the parent test
    else:
        print(pid, flush=True)
        os.waitpid(pid, 0)
    """
)


def test_forked_child_gets_its_own_watcher(tmp_path: Path) -> None:
    marker = tmp_path / "child-reset"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKED, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    time.sleep(0.3)
    os.kill(child, signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert marker.exists(), err


class _Recorded(subprocess.Popen):  # type: ignore[type-arg]
    """Popen that remembers its instances (the watchdog's process, for the tests below)."""

    made: ClassVar[list[subprocess.Popen]] = []  # type: ignore[type-arg]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-overload]
        _Recorded.made.append(self)


@pytest.mark.parametrize("failure", ["no ready line", "interrupted", "poll", "read"])
def test_a_watchdog_that_fails_to_start_leaves_no_process_pipe_or_fork_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """A failed start kills and reaps the watchdog, closes its stdin and forgets it for forks:
    a descriptor left in the close-on-fork set would close whatever reuses its number in every
    child forked later (a DataLoader worker's socket, a file)."""
    from perseus.device import ownership
    from perseus.errors import DeviceError
    from perseus.runtime.safety import guard

    script = tmp_path / "silent_watchdog.py"
    script.write_text("import sys, time\ntime.sleep(30)\n")
    monkeypatch.setattr(guard, "_WATCHDOG_SCRIPT", script)
    monkeypatch.setattr(guard.subprocess, "Popen", _Recorded)
    _Recorded.made.clear()
    if failure == "interrupted":

        def interrupted(fd: int, timeout_s: float) -> bytes:
            raise KeyboardInterrupt

        monkeypatch.setattr(guard, "_read_line", interrupted)
    elif failure in ("poll", "read"):
        _fail_the_ready_pipe(monkeypatch, guard, failure)
    before = set(ownership._FORK_CLOSE)
    watchdog = guard.Watchdog({"backend": "sim"}, tmp_path / "lock")
    with pytest.raises(KeyboardInterrupt if failure == "interrupted" else DeviceError) as info:
        watchdog.start(timeout_s=0.2)
    if failure in ("poll", "read"):  # one line, like every other failed start
        assert str(info.value) == (
            "the clock watchdog could not be started: reading its ready line failed "
            f"([Errno {errno.EBADF if failure == 'poll' else errno.EIO}] boom)"
        )
    (proc,) = _Recorded.made
    assert proc.returncode is not None  # killed and reaped
    assert proc.stdin is not None and proc.stdin.closed
    assert proc.stdout is not None and proc.stdout.closed
    assert set(ownership._FORK_CLOSE) == before
    assert watchdog.pid is None


def _fail_the_ready_pipe(monkeypatch: pytest.MonkeyPatch, guard: Any, call: str) -> None:
    """Polling the watchdog's stdout raises EBADF, or it is readable and ``os.read`` of it
    raises EIO (other descriptors read as usual: Popen reads its own pipe)."""
    real_read = os.read
    watched: list[int] = []

    class Poll:
        def register(self, fd: int, events: int) -> None:
            watched.append(fd)

        def poll(self, timeout_ms: float) -> list[tuple[int, int]]:
            if call == "poll":
                raise OSError(errno.EBADF, "boom")
            return [(watched[-1], guard.select.POLLIN)]

    def read(fd: int, n: int) -> bytes:
        if fd in watched:
            raise OSError(errno.EIO, "boom")
        return real_read(fd, n)

    monkeypatch.setattr(guard.select, "poll", Poll)
    monkeypatch.setattr(guard.os, "read", read)


def test_the_ready_line_is_read_from_a_descriptor_above_1024() -> None:
    """A training process with many files, sockets and DataLoader pipes open gets a descriptor
    from 1024 up for the watchdog's stdout: ``select.select`` refused it (ValueError: a
    traceback out of the claim); the ready line must be read all the same."""
    import resource

    from perseus.runtime.safety import guard

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1500:
        pytest.skip(f"the descriptor limit ({hard}) is below 1500")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1501), hard))
    r, w = os.pipe()
    try:
        os.dup2(r, 1500)
        os.write(w, b"ready\n")
        assert guard._read_line(1500, 1.0) == b"ready"
    finally:
        for fd in (r, w, 1500):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("errno_", [errno.EAGAIN, errno.EMFILE])
def test_a_watchdog_that_cannot_be_spawned_fails_the_claim_with_a_device_error_and_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int
) -> None:
    """Popen raising OSError (no process or descriptor left) is the DeviceError the claim and
    the watchdog promise (the CLI reports a PerseusError; an OSError was a traceback), and the
    claim lets the GPU go: the next claim owns it."""
    from perseus.device.simulated import SimulatedGPU
    from perseus.errors import DeviceError
    from perseus.runtime.safety import guard

    def no_process(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        raise OSError(errno_, os.strerror(errno_))

    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path / "sim", set_latency_s=0.0)
    claim = guard.GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None)
    with monkeypatch.context() as m:
        m.setattr(guard.subprocess, "Popen", no_process)
        with pytest.raises(DeviceError, match="watchdog could not be started"):
            claim.acquire()
    assert claim.watchdog is None
    again = guard.GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None)
    again.acquire().release()


def test_ctrl_c_while_the_watchdog_is_reaped_still_lets_the_gpu_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing in the watchdog's reaping (12 in 60 trials) skipped the rest of the
    release: the lock stayed held, and a loop that caught the KeyboardInterrupt and started its
    next run found the GPU "already owned by another agent in this process"."""
    from perseus.device.simulated import SimulatedGPU
    from perseus.runtime.safety import guard

    gpu = SimulatedGPU.from_preset("a100", state_dir=tmp_path / "sim", set_latency_s=0.0)
    claim = guard.GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None)
    claim.acquire()
    stop = guard.Watchdog.stop

    def interrupted(self: guard.Watchdog, timeout_s: float = 2.0) -> None:
        stop(self, timeout_s)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(guard.Watchdog, "stop", interrupted)
        with pytest.raises(KeyboardInterrupt):
            claim.release()
    assert claim.watchdog is None
    again = guard.GpuClaim(gpu, watchdog=True, handle_signals=False, on_exit=lambda: None)
    again.acquire().release()
