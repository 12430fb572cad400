"""Time as a seam: the clock that timing code reads and sleeps on.

Code that decides *when* reads the time and waits through :class:`Clock`, never :mod:`time`:
:class:`RealClock` in production; :class:`VirtualClock`, a number that only moves when slept
on, in tests (a 5 ms set latency is ``sleep(0.005)``: it advances the clock and returns at
once); :class:`WallClock` where several processes must agree (a shared simulated GPU). Retries
with back-off sleep on one too (:func:`retry`). The standard library only: the watchdog loads
this file by path.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "REAL_CLOCK",
    "WALL_CLOCK",
    "Clock",
    "RealClock",
    "VirtualClock",
    "WallClock",
    "clock_of",
    "retry",
]

_T = TypeVar("_T")


@runtime_checkable
class Clock(Protocol):
    """Where time comes from and how to wait for it (seconds)."""

    #: True when :meth:`sleep` really waits (a busy-wait is then worth its CPU time).
    real_time: bool

    def now(self) -> float:
        """The time now, in seconds (monotone)."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a virtual clock advances by that much instead)."""


class RealClock:
    """The process's monotonic clock (``time.perf_counter``) and ``time.sleep``."""

    __slots__ = ()
    real_time = True

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class WallClock(RealClock):
    """The wall clock (``time.time``): one timeline for several processes."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that advances only when slept on (or by :meth:`advance`); never waits.

    Deterministic when one thread drives it; concurrent sleepers each add their time.
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
        """Call ``callback`` every ``period_s`` of virtual time (a function: each wait in
        turn), first one period from now, as a polling thread would in real time; returns a
        function that stops the calls (idempotent). A non-positive period raises ValueError.
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
        """Move the clock forward by ``seconds`` (never back), firing due callbacks in order."""
        with self._lock:
            self.sleeps += 1
            if not seconds > 0:
                return
            # At least one float step: else a waiter could poll for a time that never comes.
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
            # A callback sleeping on this clock (a counter read's latency) may have passed it.
            self._now_s = max(self._now_s, target)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now_s!r})"


#: The default clock of the agent and the controller.
REAL_CLOCK: Clock = RealClock()
#: The default clock of what several processes or machines share (stores, a simulated GPU).
WALL_CLOCK: Clock = WallClock()


def clock_of(device: object, default: Clock = REAL_CLOCK) -> Clock:
    """The timeline ``device`` runs on (a simulated GPU's or a fake NVML's ``clock``), else
    ``default``: code waiting for a device's events must sleep on the device's own clock."""
    clock = getattr(device, "clock", None)
    return clock if isinstance(clock, Clock) else default


def retry(
    call: Callable[[], _T],
    *,
    transient: Callable[[Exception], bool],
    backoff_s: Sequence[float],
    clock: Clock = REAL_CLOCK,
) -> _T:
    """``call()``, tried again after each error ``transient`` accepts, ``len(backoff_s)``
    times at most, sleeping ``backoff_s[i]`` on ``clock`` before try ``i + 2``; any other
    error, and the last try's, propagates."""
    for wait_s in backoff_s:
        try:
            return call()
        except Exception as e:
            if not transient(e):
                raise
        clock.sleep(wait_s)
    return call()
