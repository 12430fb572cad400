"""Time as a seam: the clock that timing code reads and sleeps on.

Everything in perseus that decides *when* (the clock worker issuing a set call ahead of an
op's end, the simulated GPU's stream running its queue, a set call's latency) reads the time
and waits through one small protocol, :class:`Clock`, instead of calling :mod:`time`:

* :class:`RealClock` is the process's monotonic clock (``time.perf_counter``) and
  ``time.sleep``: production, and the few real-time smoke tests;
* :class:`VirtualClock` is a number that only moves when someone sleeps on it. Code driven
  from one thread on a virtual clock runs the same decisions as in real time, deterministically
  and without waiting: a 5 ms set latency is ``sleep(0.005)``, which adds 5 ms to the clock
  and returns at once. Tests of timing decisions run on it.

A simulated GPU shared by several processes needs a clock they agree on, so it defaults to
:class:`WallClock` (``time.time``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["REAL_CLOCK", "Clock", "RealClock", "VirtualClock", "WallClock", "clock_of"]


@runtime_checkable
class Clock(Protocol):
    """Where time comes from and how to wait for it (seconds)."""

    #: True when :meth:`sleep` really waits (a busy-wait is then worth its CPU time).
    real_time: bool

    def now(self) -> float:
        """The time now, in seconds (monotone)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a virtual clock advances by that much instead)."""
        ...


class RealClock:
    """The process's monotonic clock (``time.perf_counter``) and ``time.sleep``."""

    __slots__ = ()
    real_time = True

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return "RealClock()"


class WallClock(RealClock):
    """The wall clock (``time.time``): one timeline for several processes (the simulated GPU's
    state is shared by every process that opens it)."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "WallClock()"


class VirtualClock:
    """A clock that advances only when slept on (or by :meth:`advance`); never waits.

    Deterministic when one thread drives it (the controller's inline mode, a test's loop).
    Thread-safe: concurrent sleepers each add their time, in some order.

    Args:
        start_s: The initial time.
    """

    real_time = False

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.RLock()
        #: Number of sleep calls so far (tests check that a wait polled, or did not).
        self.sleeps = 0
        # Periodic callbacks: [next due time, period, callback], fired as time passes them.
        self._timers: list[list[Any]] = []
        self._firing = False

    def now(self) -> float:
        return self._now_s

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def call_every(
        self, period_s: float | Callable[[], float], callback: Callable[[], object]
    ) -> Callable[[], None]:
        """Call ``callback`` every ``period_s`` of virtual time, first one period from now
        (what a background thread polling on a timer does in real time: the energy counter
        sampler). ``period_s`` may be a function giving each wait in turn. Each call sees the
        clock at its due time.

        Returns:
            A function that stops the calls (like stopping that thread; idempotent).

        Raises:
            ValueError: for a non-positive period.
        """
        period: Callable[[], float] = period_s if callable(period_s) else (lambda: float(period_s))
        first = period()
        if not first > 0:
            raise ValueError(f"period_s must be > 0, got {first}")
        timer = [self._now_s + first, period, callback]
        with self._lock:
            self._timers.append(timer)

        def cancel() -> None:
            with self._lock:
                self._timers = [t for t in self._timers if t is not timer]

        return cancel

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (negative values are ignored), firing the
        periodic callbacks due on the way, in time order."""
        with self._lock:
            self.sleeps += 1
            if not seconds > 0:
                return
            # At least one step of the float: a sleep that rounds to nothing would leave a
            # waiter polling for a time that never comes.
            target = max(self._now_s + seconds, math.nextafter(self._now_s, math.inf))
            if self._timers and not self._firing:
                self._firing = True
                try:
                    while self._timers:  # a callback may cancel a timer
                        due = min(self._timers, key=lambda timer: timer[0])
                        if due[0] > target:
                            break
                        self._now_s = max(self._now_s, due[0])
                        due[0] += max(due[1](), 1e-9)
                        due[2]()
                finally:
                    self._firing = False
            self._now_s = target

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now_s!r})"


#: The default clock of the agent and the controller.
REAL_CLOCK: Clock = RealClock()


def clock_of(device: object, default: Clock = REAL_CLOCK) -> Clock:
    """The timeline ``device`` runs on (a simulated GPU's ``clock``), else ``default``.

    Code that waits for a device's events must sleep on the device's own clock: on a
    :class:`VirtualClock`, a worker thread polling in real time would race the training
    thread, and every timing decision would depend on the host's scheduling.
    """
    clock = getattr(device, "clock", None)
    return clock if isinstance(clock, Clock) else default
