"""Never leave a GPU locked at a low clock: ownership, exit hooks and a watchdog process.

A clock lock is global to the device and outlives the process that set it (notes §4.4), so a
crashed agent would leave the GPU slow for everyone. Three layers make sure it is reset:

1. :class:`GpuOwnership`: one owner per GPU, an exclusive ``flock`` on a file keyed by the
   GPU's UUID. A second agent gets :class:`~perseus.errors.DeviceBusyError` naming the owner's
   pid. The kernel drops the lock when the owner dies.
2. :class:`ExitGuard`: ``atexit`` plus SIGTERM/SIGINT handlers that run the agent's reset, then
   chain to whatever handler was installed before (so Ctrl-C still raises KeyboardInterrupt and
   SIGTERM still terminates).
3. :class:`Watchdog`: a tiny separate process holding a pipe from the owner; when the owner
   dies, even by SIGKILL, the pipe reaches EOF and the watchdog resets the lock (unless a new
   live owner has taken the GPU meanwhile).

Forked children (DataLoader workers) must not keep the ownership lock or the watchdog pipe
alive, nor reset the GPU from their inherited signal handlers: file descriptors are closed in
the child right after ``fork`` and the handlers check the pid.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from perseus.device.sim_state import acquire_owner_lock, read_owner_pid, release_owner_lock
from perseus.errors import DeviceBusyError, DeviceError

__all__ = ["ExitGuard", "GpuOwnership", "Watchdog"]

_WATCHDOG_SCRIPT = Path(__file__).resolve().parent / "_watchdog.py"

# File descriptors that must not survive into a forked child (ownership locks, watchdog pipes).
_FORK_CLOSE: set[int] = set()
_fork_hook_installed = False


def _close_in_child() -> None:
    for fd in list(_FORK_CLOSE):
        with contextlib.suppress(OSError):
            os.close(fd)
    _FORK_CLOSE.clear()


def _close_on_fork(fd: int) -> None:
    global _fork_hook_installed
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_installed = True
    _FORK_CLOSE.add(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class GpuOwnership:
    """Exclusive ownership of one GPU's clocks, by ``flock`` on ``lock_path``.

    Args:
        uuid: The GPU's UUID (for messages).
        lock_path: The lock file (per GPU UUID).
    """

    def __init__(self, uuid: str, lock_path: Path) -> None:
        self.uuid = uuid
        self.lock_path = lock_path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 2.0) -> None:
        """Become the owner.

        A lock held by no live process (a watchdog resetting the GPU after its owner died,
        or a dead owner's forked child exiting) is waited for, up to ``wait_s``.

        Raises:
            DeviceBusyError: if another live process (or another agent in this process) owns
                the GPU; the message names its pid and the lock file.
        """
        if self._fd is not None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            fd, owner = acquire_owner_lock(self.lock_path)
            if fd is not None:
                break
            transient = owner is None or not _alive(owner)
            if not transient or time.monotonic() >= deadline:
                who = f"process {owner}" if owner is not None else "another process"
                if owner == os.getpid():
                    who = "another agent in this process"
                raise DeviceBusyError(
                    f"GPU {self.uuid} is already owned by {who} (lock {self.lock_path}); one "
                    "agent per GPU: stop the other agent or give each rank its own GPU"
                )
            time.sleep(0.01)
        self._fd = fd
        _close_on_fork(fd)

    def release(self) -> None:
        """Give up ownership (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            _FORK_CLOSE.discard(fd)
            release_owner_lock(fd, self.lock_path)

    @staticmethod
    def owner_pid(lock_path: Path) -> int | None:
        """The live owner's pid, or None when the GPU is free."""
        fd, owner = acquire_owner_lock(lock_path)
        if fd is not None:
            release_owner_lock(fd, lock_path)
            return None
        return owner if owner is not None else read_owner_pid(lock_path)


_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class ExitGuard:
    """Runs ``callback`` once at interpreter exit or on SIGTERM/SIGINT, then chains.

    Signal handlers can only be installed from the main thread; elsewhere only the ``atexit``
    hook is installed. :meth:`uninstall` restores the previous handlers if ours are still the
    active ones.
    """

    DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)

    def __init__(
        self, callback: Callable[[], None], signals: tuple[int, ...] = DEFAULT_SIGNALS
    ) -> None:
        self._callback = callback
        self._signals = signals
        self._previous: dict[int, _Handler] = {}
        self._pid = 0
        self._ran = False
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._pid = os.getpid()
        self._ran = False
        atexit.register(self._run_once)
        if threading.current_thread() is threading.main_thread():
            for sig in self._signals:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        atexit.unregister(self._run_once)
        if threading.current_thread() is threading.main_thread():
            for sig, previous in self._previous.items():
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self._installed = False

    def _run_once(self) -> None:
        if self._ran or os.getpid() != self._pid:
            return
        self._ran = True
        with contextlib.suppress(Exception):
            self._callback()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Read the previous handler first: the callback may uninstall us and clear the table.
        previous = self._previous.get(signum, signal.SIG_DFL)
        self._run_once()
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # SIG_IGN: the process had chosen to ignore it; so do we (after the reset).


class Watchdog:
    """A separate process that resets the GPU's lock if this process dies.

    Args:
        spec: The GPU's ``watchdog_spec()`` (backend, uuid, where its state lives).
        lock_path: The GPU's ownership lock file.
        poll_interval_s: How often the watchdog also checks that its parent is alive.
    """

    def __init__(self, spec: dict[str, str], lock_path: Path, poll_interval_s: float = 0.05):
        self.spec = {**spec, "lock_path": str(lock_path)}
        self.poll_interval_s = poll_interval_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the watchdog and wait until it is watching.

        Raises:
            DeviceError: if it did not come up within ``timeout_s``.
        """
        if self._proc is not None:
            return
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(_WATCHDOG_SCRIPT),
                json.dumps(self.spec),
                str(os.getpid()),
                str(self.poll_interval_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            # Its own session: a Ctrl-C to our process group must not kill it before it resets.
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None  # PIPE requested
        _close_on_fork(proc.stdin.fileno())
        ready = _read_line(proc.stdout.fileno(), timeout_s)
        proc.stdout.close()
        if ready != b"ready":
            proc.kill()
            proc.wait()
            raise DeviceError(f"the clock watchdog did not start within {timeout_s:g} s")
        self._proc = proc

    def stop(self, timeout_s: float = 2.0) -> None:
        """Tell the watchdog the owner exits cleanly, and reap it (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None  # PIPE requested
        _FORK_CLOSE.discard(proc.stdin.fileno())
        with contextlib.suppress(OSError):
            proc.stdin.write(b"stop")
            proc.stdin.flush()
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_line(fd: int, timeout_s: float) -> bytes:
    import select

    data = b""
    deadline = timeout_s
    while b"\n" not in data:
        readable, _, _ = select.select([fd], [], [], deadline)
        if not readable:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data.strip()
