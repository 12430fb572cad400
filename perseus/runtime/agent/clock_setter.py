"""The driver calls behind the clock worker, and what they teach about when to make them.

Permission and support errors switch :class:`ClockSetter` to *observe-only* (a refused memory
lock only drops memory clocks); other errors are retried :data:`RETRIES` times, then also
switch to observe-only instead of killing training. Each call's landing (issue to the new
clock in effect) feeds :func:`issue_offset_s`.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseus.device.base import GPU, AppliedClockGPU, EventSource, MemoryClockGPU
from perseus.device.clock import Clock, retry
from perseus.errors import DeviceError, DeviceNotSupportedError, DevicePermissionError

__all__ = ["ApplyStats", "ClockSetter", "DeviceLock", "issue_offset_s"]

#: Quantiles of the op-end prediction error folded into the landing distribution.
_ERROR_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
#: How many quantiles of the landing history the targeting uses (cached between calls).
_LANDING_QUANTILES = 64

_REFUSED = (DevicePermissionError, DeviceNotSupportedError)

#: Extra attempts for a failing set call before going observe-only.
RETRIES = 2
#: Apply delays kept for :meth:`ClockSetter.stats`.
_HISTORY = 10_000


def _not_refused(e: Exception) -> bool:
    return not isinstance(e, _REFUSED)


class DeviceLock:
    """The lock held around each driver call, knowing its holder.

    A reset at exit waits for a set call in flight, never for the main thread: a signal
    handler that interrupted the main thread holding it (an emulated op's launch, a power
    pause) would only wait for itself, and no driver call is in flight then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holder: int | None = None

    def __enter__(self) -> DeviceLock:
        self._lock.acquire()
        self.holder = threading.get_ident()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        self.holder = None
        self._lock.release()

    def acquire_for_reset(self, timeout_s: float = 2.0, poll_s: float = 0.01) -> bool:
        """Take the lock once no other thread but the main one holds it (at most
        ``timeout_s``); False: the reset goes on without it."""
        main = threading.main_thread().ident
        for _ in range(max(1, round(timeout_s / poll_s))):
            if self.holder == main:
                return False
            if self._lock.acquire(timeout=poll_s):
                self.holder = threading.get_ident()
                return True
        return False


def issue_offset_s(
    landings_s: Sequence[float], gap_s: float, end_errors_s: Sequence[float] = ()
) -> float:
    """When to issue a clock change, relative to an op's predicted end (negative: before).

    The new clock lands ``L`` after the call (``landings_s``: samples of ``L``); the op's
    true end is the prediction plus an error (``end_errors_s``: samples). Landing before the
    end runs its tail at the next op's clock, landing after the next op's start (``gap_s``
    later) runs that op's head at the old one. The expected wrong-clock time is least where
    both are equally likely; when a range of offsets has none, this returns its middle.
    """
    errors = tuple(end_errors_s) or (0.0,)
    a = sorted(d - e for d in landings_s for e in errors)  # landing relative to the true end
    if not a:
        return 0.0
    n = len(a)
    gap = max(0.0, gap_s)

    def bounds(strict: bool) -> float:
        lo, hi = -a[-1] - 1e-3, gap - a[0] + 1e-3
        for _ in range(48):
            y = 0.5 * (lo + hi)
            early = bisect.bisect_left(a, -y)  # P(land before the end) * n
            late = n - bisect.bisect_right(a, gap - y)  # P(land after the next start) * n
            if late > early or (not strict and late == early):
                hi = y
            else:
                lo = y
        return 0.5 * (lo + hi)

    return 0.5 * (bounds(False) + bounds(True))


#: In steady state the same inputs recur op after op (96 bisection steps each otherwise).
_issue_offset_cached_s = functools.lru_cache(maxsize=64)(issue_offset_s)


@dataclass(frozen=True, slots=True)
class ApplyStats:
    """Clock-set calls: how long the driver call blocked, and request-to-apply delays."""

    applied: int
    skipped_stale: int
    median_delay_s: float
    p99_delay_s: float
    max_delay_s: float
    median_set_latency_s: float = 0.0


class ClockSetter:
    """Set calls for one GPU, on the worker's thread (see the module docstring).

    Args:
        events: The device's timeline (None: landings from call durations only).
        control: False never sets a clock (observe-only from the start).
        stopped: True once the controller closes: no call is started after that.
    """

    def __init__(
        self,
        gpu: GPU,
        *,
        events: EventSource | None,
        clock: Clock,
        control: bool,
        stopped: Callable[[], bool],
    ) -> None:
        self.gpu = gpu
        self._events = events
        self._clock = clock
        self._stopped = stopped
        self.observe_only = not control
        #: Held around each driver call: a reset on shutdown cannot be overtaken by a set call.
        self.device_lock = DeviceLock()
        self.applied_mhz: int | None = None  # the last clock the driver accepted (snapped)
        self.target_mhz: int | None = None  # the last clock asked for, applied or not
        self.done_mhz: int | None = None  # the last clock whose set call returned
        self.mem_target_mhz: int | None = None  # the last memory clock asked for
        self._mem_gpu: MemoryClockGPU | None = gpu if isinstance(gpu, MemoryClockGPU) else None
        self._clock_applied: Callable[[], float | None] | None = (
            gpu.clock_applied_s if isinstance(gpu, AppliedClockGPU) else None
        )
        #: Why the controller went observe-only or dropped memory clocks (warned once).
        self.notice: str | None = None
        self._delays_s: deque[float] = deque(maxlen=_HISTORY)
        self._latencies_s: deque[float] = deque(maxlen=256)
        # Issue -> the new clock in effect, on the device's clock (the lead is learnt from it).
        self._landings_s: deque[float] = deque(maxlen=256)
        self._landing_q: tuple[float, ...] = ()  # quantiles of _landings_s (cached)
        self._landing_q_at = 0  # _landing_count when _landing_q was computed
        self._landing_count = 0
        # Relative error of each op's predicted device time: (actual - expected) / expected.
        self._end_errors: deque[float] = deque(maxlen=128)

    # What to set ---------------------------------------------------------------------------

    def wants(self, freq_mhz: int | None, mem_freq_mhz: int | None = None) -> bool:
        """True when the pair is a change to make (a None memory clock is no change)."""
        if freq_mhz is None or self.observe_only:
            return False
        return freq_mhz != self.target_mhz or self.mem_change(mem_freq_mhz)

    def mem_change(self, mem_freq_mhz: int | None) -> bool:
        return (
            mem_freq_mhz is not None
            and self._mem_gpu is not None
            and mem_freq_mhz != self.mem_target_mhz
        )

    def forget(self) -> None:
        """Someone else reset the GPU: the next pair asked for is a change."""
        self.target_mhz = None
        self.mem_target_mhz = None

    # The calls -----------------------------------------------------------------------------

    def apply(self, freq_mhz: int, since_s: float, mem_freq_mhz: int | None = None) -> None:
        """Set the memory clock (when ``mem_freq_mhz`` is a change), then the SM clock (a
        memory-only change leaves the SM lock alone); ``since_s``: when it was asked for."""
        if self.observe_only or self._stopped():
            return
        set_mem = self.mem_change(mem_freq_mhz)
        set_sm = freq_mhz != self.target_mhz or not set_mem
        self.target_mhz = freq_mhz
        returned: float | None = None
        if set_mem:
            assert mem_freq_mhz is not None
            self.mem_target_mhz = mem_freq_mhz
            returned = self._retrying(lambda: self._set_memory(mem_freq_mhz))
            if returned is None:
                return
        if set_sm:
            returned = self._retrying(lambda: self._set_sm(freq_mhz))
            if returned is None:
                return
        assert returned is not None
        self._delays_s.append(returned - since_s)
        self.done_mhz = freq_mhz

    def _retrying(self, call: Callable[[], float | None]) -> float | None:
        """``call()``'s return time, retried on transient errors (None: stopped, or gone
        observe-only)."""
        waits_s = [0.001 * (attempt + 1) for attempt in range(RETRIES)]
        try:  # a transient error (NVML timeout) or a backend bug is retried
            return retry(call, transient=_not_refused, backoff_s=waits_s, clock=self._clock)
        except _REFUSED as e:
            self.degrade(f"cannot lock clocks on {self.gpu.name}: {e}")
        except Exception as e:
            self.degrade(
                f"setting the clock on {self.gpu.name} kept failing ({RETRIES + 1} tries, "
                f"last: {e!r})"
            )
        return None

    def _set_memory(self, mem_freq_mhz: int) -> float | None:
        """One memory-clock call; a refused one drops memory clocks (SM clocks go on)."""
        mem_gpu, now = self._mem_gpu, self._clock.now
        assert mem_gpu is not None
        with self.device_lock:
            if self._stopped():
                return None
            t0 = now()
            try:
                mem_gpu.set_memory_locked_clock(mem_freq_mhz)
            except _REFUSED as e:
                self._drop_memory_clocks(e)
            t1 = now()
        if self._mem_gpu is not None:
            self._latencies_s.append(t1 - t0)
            self._note_landing(t1 - t0)
        return t1

    def _set_sm(self, freq_mhz: int) -> float | None:
        """One SM-clock call; its landing as the device reports it where it can."""
        events, applied, now = self._events, self._clock_applied, self._clock.now
        with self.device_lock:
            if self._stopped():
                return None
            issued = events.timeline_now_s() if events is not None else 0.0
            t0 = now()
            self.applied_mhz = self.gpu.set_locked_clock(freq_mhz)
            t1 = now()
            landed = applied() if applied is not None and events is not None else None
        self._latencies_s.append(t1 - t0)
        self._note_landing(t1 - t0 if landed is None else landed - issued)
        return t1

    def _drop_memory_clocks(self, error: DeviceError) -> None:
        """The driver refused a memory lock: keep setting SM clocks only, warn once."""
        self._mem_gpu = None
        self.mem_target_mhz = None
        self.notice = (
            f"perseus: cannot lock memory clocks on {self.gpu.name}: {error}; running SM clocks "
            "only, at the default memory clock (the plan's figures will not hold)"
        )

    def degrade(self, why: str) -> None:
        """Set no clock any more (observe-only); ``why`` goes into ``notice``."""
        self.notice = f"perseus: {why}; observe-only mode (time and energy are still measured)"
        self.observe_only = True  # last: a waiter that sees it also sees the notice

    # What the calls teach ------------------------------------------------------------------

    def _note_landing(self, landing_s: float) -> None:
        self._landings_s.append(landing_s)
        self._landing_count += 1

    def note_end_error(self, relative: float) -> None:
        """An op's (actual - expected) / expected device time."""
        self._end_errors.append(relative)

    def set_latency_s(self) -> float | None:
        """Median measured set-call latency (None before the first call)."""
        lat = sorted(self._latencies_s)
        return lat[len(lat) // 2] if lat else None

    def landing_s(self) -> float | None:
        """Median time from a set call's issue to its clock in effect (None before one)."""
        q = self._landing_quantiles()
        return q[len(q) // 2] if q else None

    def extra_lead_s(self, freq_mhz: int, mem_freq_mhz: int | None) -> float:
        """A pair change makes two set calls: the memory call's landing comes first."""
        if self.mem_change(mem_freq_mhz) and freq_mhz != self.target_mhz:
            return self.landing_s() or 0.0
        return 0.0

    def _landing_quantiles(self) -> tuple[float, ...]:
        count = self._landing_count
        if count and (not self._landing_q or count - self._landing_q_at >= 8):
            lat = sorted(self._landings_s)
            m = min(len(lat), _LANDING_QUANTILES)
            self._landing_q = tuple(lat[int((i + 0.5) * len(lat) / m)] for i in range(m))
            self._landing_q_at = count
        return self._landing_q

    def issue_offset_s(self, expected_s: float, gap_s: float) -> float | None:
        """When to issue a change relative to its op's predicted end (None: no landing
        measured yet)."""
        landings = self._landing_quantiles()
        if not landings:
            return None
        errs = sorted(self._end_errors)
        errors = (
            tuple(expected_s * errs[int(q * len(errs))] for q in _ERROR_QUANTILES)
            if len(errs) >= 8
            else ()
        )
        return _issue_offset_cached_s(landings, gap_s, errors)

    def stats(self, stale: int) -> ApplyStats:
        """Recent apply delays (``stale``: requests overwritten before they were applied)."""
        delays = sorted(self._delays_s)
        latency = self.set_latency_s() or 0.0
        if not delays:
            return ApplyStats(0, stale, 0.0, 0.0, 0.0, latency)
        n = len(delays)
        return ApplyStats(
            applied=n,
            skipped_stale=stale,
            median_delay_s=delays[n // 2],
            p99_delay_s=delays[min(n - 1, int(0.99 * n))],
            max_delay_s=delays[-1],
            median_set_latency_s=latency,
        )
