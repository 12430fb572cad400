"""Never leave a GPU at a low clock or power limit: ownership, exit hooks and a watchdog process.

A clock lock or a power limit outlives the process that set it, so three layers reset the GPU
(``docs/safety.md``): :class:`~perseus.device.ownership.GpuOwnership` (the next owner resets
after a dead one), :class:`ExitGuard` (``atexit``, SIGTERM/SIGINT) and :class:`Watchdog` (a
process that resets at its owner pipe's EOF, even after SIGKILL). Forked children close the
lock and pipe descriptors, and their inherited handlers check the pid.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.util import Finalize
from pathlib import Path
from types import FrameType
from typing import Any

from perseus.device.base import GPU, ManagedGPU, PowerLimitGPU
from perseus.device.clock import REAL_CLOCK
from perseus.device.ownership import (
    GpuOwnership,
    close_on_fork,
    default_lock_dir,
    forget_on_fork,
    owner_lock_path,
    reset_from_spec,
)
from perseus.errors import DeviceError

__all__ = ["ExitGuard", "GpuClaim", "Watchdog"]

_WATCHDOG_SCRIPT = Path(__file__).resolve().parent / "_watchdog.py"

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class _SignalChain:
    """The one handler per signal shared by every :class:`ExitGuard` of this process.

    The first guard installs ours (keeping the previous handler), the last one restores it, so
    guards may come and go in any order. A main thread blocked in C (a collective waiting for a
    dead peer, when torchrun sends SIGTERM) would run Python handlers only when the call
    returns, so a wakeup fd (``signal.set_wakeup_fd``, unless someone else uses it) lets a
    daemon thread run the guards at once; under the default disposition it then ends the
    process with status ``128 + signum`` if the main thread has not within ``grace_s``.
    """

    def __init__(self, grace_s: float = 1.0) -> None:
        self.grace_s = grace_s
        self._guards: dict[int, list[ExitGuard]] = {}
        self._previous: dict[int, _Handler] = {}
        self._pid = 0
        self._wakeup: tuple[int, int] | None = None  # (read fd, write fd)

    def add(self, guard: ExitGuard, signals: tuple[int, ...]) -> None:
        if self._pid != os.getpid():  # a forked child inherited the table: start afresh
            self._guards.clear()
            self._previous.clear()
            if self._wakeup is not None:  # the parent's wakeup fd, read by no thread here
                self._stop_watcher()
            self._pid = os.getpid()
        for sig in signals:
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue  # the process ignores it: it never ends the process, nothing to do
            guards = self._guards.setdefault(sig, [])
            if not guards and signal.getsignal(sig) != self._on_signal:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
            guards.append(guard)
        if self._wakeup is None and any(self._guards.values()):
            self._start_watcher()

    def remove(self, guard: ExitGuard) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        for sig, guards in self._guards.items():
            if guard in guards:
                guards.remove(guard)
            if not guards and on_main and sig in self._previous:
                previous = self._previous.pop(sig)
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        if on_main and not any(self._guards.values()):
            self._stop_watcher()

    def _guards_for(self, signum: int) -> list[ExitGuard]:
        return list(reversed(self._guards.get(signum, ()))) if os.getpid() == self._pid else []

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # The previous handler decides whether the process ends; the guards run only if it does.
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            try:
                previous(signum, frame)
            except BaseException:  # KeyboardInterrupt, SystemExit: the process is ending
                self._run_guards(signum)
                raise
            return  # the program handled it and goes on: its run and its GPU stay as they are
        if previous in (signal.SIG_DFL, None):
            self._run_guards(signum)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # SIG_IGN (set after we installed ours): ignored, and so the GPU is left alone.

    def _run_guards(self, signum: int) -> None:
        for guard in self._guards_for(signum):
            guard._run_once()

    def _start_watcher(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread, or unsupported
            os.close(r)
            os.close(w)
            return
        if old != -1:  # someone else (an asyncio loop) relies on it: leave it to them
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        threading.Thread(
            target=self._watch, args=(r,), name="perseus-signal-watcher", daemon=True
        ).start()

    def _stop_watcher(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is None:
            return
        r, w = wakeup
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, w):
                signal.set_wakeup_fd(current)  # not ours any more: put it back
        with contextlib.suppress(OSError):
            os.close(w)  # the watcher reads EOF and closes ``r``
        if self._pid != os.getpid():  # a forked child: no watcher thread owns ``r`` here
            with contextlib.suppress(OSError):
                os.close(r)

    def _watch(self, r: int) -> None:
        try:
            while True:
                try:
                    data = os.read(r, 64)
                except InterruptedError:
                    continue
                if not data:
                    return
                for signum in data:
                    self._on_wakeup(signum)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(r)

    def _on_wakeup(self, signum: int) -> None:
        if not self._guards_for(signum):
            return
        ours = signal.getsignal(signum) == self._on_signal  # not replaced by someone since
        default = self._previous.get(signum, signal.SIG_DFL) in (signal.SIG_DFL, None)
        if not (ours and default):
            return  # a handler of the program's decides, on the main thread (_on_signal)
        # Default action: reset, let the main thread die by the signal, else exit ourselves.
        self._run_guards(signum)
        REAL_CLOCK.sleep(self.grace_s)
        os._exit(128 + signum)


_CHAIN = _SignalChain()


class ExitGuard:
    """Runs ``callback`` once when the process ends: at exit, or on a SIGTERM/SIGINT that ends it
    (the previous handler decides: ``docs/safety.md#signals-the-process-survives``).

    Off the main thread only the ``atexit`` hook (and multiprocessing's finalizer) is
    installed. ``callback`` may run inside a signal handler at any bytecode: it must reset the
    device directly, never wait for a lock the interrupted code may hold, and finish within
    milliseconds (exceptions are swallowed; the watchdog remains the backstop).
    """

    DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)

    def __init__(
        self, callback: Callable[[], None], signals: tuple[int, ...] = DEFAULT_SIGNALS
    ) -> None:
        self._callback = callback
        self._signals = signals
        self._pid = 0
        self._ran = False
        self._running = threading.Lock()
        self._installed = False
        self._finalizer: Finalize | None = None

    def install(self) -> None:
        if self._installed:
            return
        self._pid = os.getpid()
        self._ran = False
        atexit.register(self._run_once)
        # A worker that multiprocessing forked skips atexit and runs its finalizers instead.
        self._finalizer = Finalize(None, self._run_once, exitpriority=100)
        if self._signals and threading.current_thread() is threading.main_thread():
            _CHAIN.add(self, self._signals)
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        atexit.unregister(self._run_once)
        if self._finalizer is not None:
            self._finalizer.cancel()
        _CHAIN.remove(self)
        self._installed = False

    def _run_once(self, wait_s: float = 1.0) -> None:
        # atexit, the signal handler and the watcher thread: one runs the callback, the others
        # wait (bounded) so the process does not end mid-reset; hence no early look at ``_ran``.
        if os.getpid() != self._pid:
            return
        if not self._running.acquire(timeout=wait_s):
            return
        try:
            if self._ran:
                return
            self._ran = True
            with contextlib.suppress(Exception):
                self._callback()
        finally:
            self._running.release()


class Watchdog:
    """A separate process that resets the GPU (clocks, power limit) if this process dies.

    Args:
        spec: The GPU's ``watchdog_spec()`` (backend, uuid, where its state lives).
        lock_path: The GPU's ownership lock file.
        poll_interval_s: How often the watchdog also checks that its parent is alive.
    """

    def __init__(self, spec: dict[str, Any], lock_path: Path, poll_interval_s: float = 0.05):
        # On the watchdog's command line: it resets this device, whatever the lock file says.
        self.spec = {**spec, "lock_path": str(lock_path)}
        self.poll_interval_s = poll_interval_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the watchdog and wait until it is watching.

        Raises:
            DeviceError: if it could not be started (no descriptor or process left: EMFILE,
                EAGAIN), its ready pipe could not be read, or it did not come up within
                ``timeout_s``.
        """
        if self._proc is not None:
            return
        args = [json.dumps(self.spec), str(os.getpid()), str(self.poll_interval_s)]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(_WATCHDOG_SCRIPT), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                # Its own session: a Ctrl-C to our process group must not kill it before it resets.
                start_new_session=True,
            )
        except OSError as e:  # Popen closed the pipes it made
            raise DeviceError(f"the clock watchdog could not be started: {e}") from e
        assert proc.stdin is not None and proc.stdout is not None  # PIPE requested
        close_on_fork(proc.stdin.fileno())
        try:
            ready = _read_line(proc.stdout.fileno(), timeout_s)
            proc.stdout.close()
            if ready != b"ready":
                raise DeviceError(f"the clock watchdog did not start within {timeout_s:g} s")
        except BaseException:
            # Killed before its stdin closes (EOF would make it reset), then the pipe closed
            # and forgotten: a later fork must not close whatever reuses the descriptor.
            proc.kill()
            proc.wait()
            proc.stdout.close()
            forget_on_fork(proc.stdin.fileno())
            with contextlib.suppress(OSError):
                proc.stdin.close()
            raise
        self._proc = proc

    def stop(self, timeout_s: float = 2.0) -> None:
        """Tell the watchdog the owner exits cleanly, and reap it (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None  # PIPE requested
        forget_on_fork(proc.stdin.fileno())
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
    data = b""
    deadline = REAL_CLOCK.now() + timeout_s
    pipe = select.poll()  # not select.select: it refuses descriptors from 1024 up
    pipe.register(fd, select.POLLIN)
    while b"\n" not in data:
        left = deadline - REAL_CLOCK.now()
        if left <= 0:
            break
        try:
            chunk = os.read(fd, 64) if pipe.poll(left * 1000.0) else b""
        except OSError as e:  # EBADF, EIO: a DeviceError as any failed start (start cleans up)
            raise DeviceError(
                f"the clock watchdog could not be started: reading its ready line failed ({e})"
            ) from e
        if not chunk:
            break
        data += chunk
    return data.strip()


class GpuClaim:
    """The three layers for one GPU: ownership, the watchdog (for a
    :class:`~perseus.device.base.ManagedGPU`) and exit hooks running ``on_exit``.

    Args:
        gpu: The GPU (its ``uuid``; a managed GPU's own lock path and watchdog spec).
        watchdog: Start the watchdog (managed GPUs only).
        handle_signals: Install SIGTERM/SIGINT handlers besides ``atexit``.
        on_exit: What the exit hooks run (the agent's emergency reset).
        hold_lock: Keep the ownership lock while claimed. False only records that this
            process owes the GPU a reset (:meth:`GpuOwnership.mark_due`): a recurring job with
            ``own_gpu=False`` whose agent takes the lock itself.
    """

    def __init__(
        self,
        gpu: GPU,
        *,
        watchdog: bool,
        handle_signals: bool,
        on_exit: Callable[[], None],
        hold_lock: bool = True,
    ) -> None:
        self._managed = gpu if isinstance(gpu, ManagedGPU) else None
        if self._managed is not None:
            self.lock_path = self._managed.owner_lock_path()
        else:
            self.lock_path = owner_lock_path(default_lock_dir(), gpu.uuid)
        # A dead previous owner's lock says only that a reset is due: reset the GPU in hand.
        self.ownership = GpuOwnership(gpu.uuid, self.lock_path, reset=self._reset_in_hand)
        self._gpu = gpu
        self._use_watchdog = watchdog
        self._hold_lock = hold_lock
        self.watchdog: Watchdog | None = None
        self._guard = ExitGuard(on_exit, ExitGuard.DEFAULT_SIGNALS if handle_signals else ())

    def _reset_in_hand(self) -> None:
        """Reset the GPU in hand: clocks and default power limit (a simulated one in its state
        file, as the watchdog does)."""
        if self._managed is not None:
            spec = self._managed.watchdog_spec()
            if spec.get("backend") == "sim":
                reset_from_spec(spec)
                return
        self._gpu.reset_locked_clock()
        if isinstance(self._gpu, PowerLimitGPU):
            self._gpu.reset_power_limit()

    def acquire(self) -> GpuClaim:
        """Own the GPU, start the watchdog, install the exit hooks (all or nothing).

        Raises:
            DeviceBusyError: if another agent owns the GPU.
            DeviceError: if the watchdog cannot start.
        """
        if self._hold_lock:
            self.ownership.acquire()
        else:
            self.ownership.mark_due()
        try:
            if self._use_watchdog and self._managed is not None:
                self.watchdog = Watchdog(self._managed.watchdog_spec(), self.lock_path)
                self.watchdog.start()
            self._guard.install()
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Stop the watchdog (no reset), give up ownership, remove the hooks (idempotent;
        each step runs when the one before is interrupted: Ctrl-C in the watchdog's reaping
        kept the lock, and a loop that goes on found its GPU owned)."""
        watchdog, self.watchdog = self.watchdog, None
        try:
            if watchdog is not None:
                watchdog.stop()
        finally:
            try:
                if self._hold_lock:
                    self.ownership.release()
                else:
                    self.ownership.clear_due()
            finally:
                self._guard.uninstall()
