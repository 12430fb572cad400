"""Never leave a GPU locked at a low clock: ownership, exit hooks and a watchdog process.

A clock lock is global to the device and outlives the process that set it
(docs/hardware.md#sharing), so a
crashed agent would leave the GPU slow for everyone. Three layers make sure it is reset:

1. :class:`~perseus.device.ownership.GpuOwnership`: one owner per GPU, an
   exclusive ``flock`` on a file keyed by the GPU's UUID. A second agent gets
   :class:`~perseus.errors.DeviceBusyError` naming the owner's pid. The kernel drops the lock
   when the owner dies; the next owner resets the GPU it opened (clocks and default power
   limit) if its previous owner died without doing so (owner and watchdog both killed). The
   dead owner's lock file only says that a reset is due, never what to reset.
2. :class:`ExitGuard`: ``atexit`` plus SIGTERM/SIGINT handlers that run the agent's reset when
   the signal ends the process, and only then: a signal first goes to the handler installed
   before (so Ctrl-C still raises KeyboardInterrupt and SIGTERM still terminates); the reset
   runs when that handler raises (the exception is ending the process) or when the signal's
   default action kills it. A program's own handler that returns (a "stop after this epoch"
   flag), or a signal the process ignores (SIGINT in a background job ``cmd &``), leaves the
   GPU and the run alone: the process lives on, and resets when it really ends.
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
from multiprocessing.util import Finalize
from pathlib import Path
from types import FrameType
from typing import Any

from perseus.device.base import ManagedGPU, PowerLimitGPU
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

    Signals are process-wide, so the handlers are too: the first guard installs ours (keeping
    the handler that was there), the last one restores it (if ours is still the active one).
    Guards that come and go in any order (two agents, one closed early) therefore never leave a
    stale handler behind or call a closed guard's callback.

    Python runs signal handlers on the main thread, between two bytecodes. A main thread
    blocked in C (a gloo/NCCL collective waiting for a peer that died: exactly when torchrun
    sends SIGTERM to the survivors) would run ours only when the call returns, possibly
    minutes later. So the chain also registers a wakeup fd (``signal.set_wakeup_fd``, unless
    someone else uses it), to which CPython's C-level handler writes the signal number at once,
    and a daemon thread reading it runs the guards' callbacks immediately. If the signal's
    previous disposition was the default (terminate) and the main thread has not ended the
    process within ``grace_s``, that thread ends it with status ``128 + signum`` as the default
    action would have.
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
        # Runs in the main thread between two bytecodes of whatever it was doing: the guards'
        # callbacks must not take a lock the interrupted code may hold (see ExitGuard). The
        # previous handler decides whether the process ends; the guards run only if it does.
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

    # Wakeup-fd watcher ---------------------------------------------------------------------

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
        # The default action is to die now: reset, give the main thread the chance to die
        # properly (exit status "killed by signal"), then do it ourselves.
        self._run_guards(signum)
        time.sleep(self.grace_s)
        os._exit(128 + signum)


_CHAIN = _SignalChain()


class ExitGuard:
    """Runs ``callback`` once when the process ends: at interpreter exit, or on a SIGTERM/SIGINT
    that ends it.

    A signal goes first to the handler installed before the first guard (so Ctrl-C still
    raises KeyboardInterrupt and SIGTERM still terminates); ``callback`` runs if that handler
    raises (before the exception unwinds) or if the signal's default action is to terminate
    (before it does). A handler that returns, or a signal the process ignores, leaves
    ``callback`` for the real end. Signal handlers can only be installed from the main thread;
    elsewhere only the ``atexit`` hook is installed.

    Contract for ``callback`` (it may run inside a signal handler, on the main thread, at any
    bytecode of the training loop): it must reset the device *directly* and never wait for a
    lock the interrupted code may hold (a controller's lock, a queue's mutex); it must not
    raise (exceptions are swallowed) and should finish within milliseconds. The watchdog
    remains the backstop if it cannot.
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
        # Called from atexit, the main thread's signal handler or the signal watcher thread:
        # exactly one of them runs the callback. The others wait (bounded: the running one may
        # need a lock the interrupted main thread holds) so the process does not end mid-reset.
        # (No early look at ``_ran``: it is set before the callback finishes, and a caller
        # that returned then would let the process die mid-reset.)
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
    """A separate process that resets the GPU's lock if this process dies.

    Args:
        spec: The GPU's ``watchdog_spec()`` (backend, uuid, where its state lives).
        lock_path: The GPU's ownership lock file.
        poll_interval_s: How often the watchdog also checks that its parent is alive.
    """

    def __init__(self, spec: dict[str, Any], lock_path: Path, poll_interval_s: float = 0.05):
        # Handed to the watchdog on its command line: it resets this device and no other,
        # whatever the lock file may say later.
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
        close_on_fork(proc.stdin.fileno())
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
    import select

    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data.strip()


class GpuClaim:
    """The three layers for one GPU an agent changes clocks on: ownership, the watchdog
    process (for GPUs that describe their reset, :class:`~perseus.device.base.ManagedGPU`) and
    exit hooks running ``on_exit``.

    Args:
        gpu: The GPU (its ``uuid``; a managed GPU's own lock path and watchdog spec).
        watchdog: Start the watchdog (managed GPUs only).
        handle_signals: Install SIGTERM/SIGINT handlers besides ``atexit``.
        on_exit: What the exit hooks run (the agent's emergency reset).
        hold_lock: Keep the ownership lock while claimed (an agent). False: only record that
            this process owes the GPU a reset (:meth:`GpuOwnership.mark_due`), for a process
            that changes the GPU's power limit while an agent of the same process takes the
            lock itself (a recurring job with ``own_gpu=False``); the watchdog and the next
            owner still reset the GPU if this process dies.
    """

    def __init__(
        self,
        gpu: Any,
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
        """Reset the GPU this claim holds to its defaults: clocks and (where it has one) the
        default power limit. A simulated GPU is reset in its state file, like the watchdog
        does; any other GPU through its own methods."""
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
        """Stop the watchdog (no reset), give up ownership, remove the hooks (idempotent)."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        if self._hold_lock:
            self.ownership.release()
        else:
            self.ownership.clear_due()
        self._guard.uninstall()
