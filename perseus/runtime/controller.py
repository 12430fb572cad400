"""Apply SM clocks off the training thread.

A set-clock call blocks its caller for ~5 ms (up to 15 ms, notes §5.1), far too long for the
training loop, so the rank agent only *posts* the next clock and a worker thread applies it.
Only the latest request matters (an op's clock that was not applied before the next op began
is useless), so the controller keeps a single slot: a new request overwrites a pending one,
and a request equal to the last one posted is skipped on the caller's side at the cost of one
comparison. A worker error is stored and raised on the caller's next call, not lost.

Permission and support errors are not fatal: the controller switches to *observe-only* (no
further set calls) and warns once with :class:`~perseus.device.base.ObserveOnlyWarning`.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass

from perseus.device.base import GPU, ObserveOnlyWarning
from perseus.errors import DeviceError, DeviceNotSupportedError, DevicePermissionError

__all__ = ["ApplyStats", "FrequencyController"]


@dataclass(frozen=True, slots=True)
class ApplyStats:
    """Clock-apply delays: from the training thread's request to the driver call's return."""

    applied: int
    skipped_stale: int
    median_delay_s: float
    p99_delay_s: float
    max_delay_s: float


class FrequencyController:
    """Applies the most recently requested clock on a worker thread.

    Usage::

        ctl = FrequencyController(gpu)
        ctl.start()
        ctl.request(1095)   # returns at once
        ctl.flush()         # wait until applied (tests, iteration boundaries)
        ctl.close()

    Args:
        gpu: The device to drive.
        history: How many apply delays to keep for :meth:`stats`.
    """

    def __init__(self, gpu: GPU, *, history: int = 10_000) -> None:
        self.gpu = gpu
        self._cond = threading.Condition(threading.Lock())
        self._pending: int | None = None
        self._pending_since = 0.0
        self._posted: int | None = None  # last value accepted by request()
        self._applied: int | None = None  # last value the driver accepted (snapped)
        self._busy = False
        self._error: BaseException | None = None
        self._notice: str | None = None
        self._attention = False  # set by the worker when _error or _notice needs surfacing
        self._closed = False
        self._thread: threading.Thread | None = None
        self._delays_s: deque[float] = deque(maxlen=history)
        self._stale = 0
        self.observe_only = False
        # Held by the worker around each driver call, so a reset on shutdown cannot be
        # overtaken by a set call that was already in flight.
        self.device_lock = threading.Lock()

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is not None:
            return
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"perseus-clock-{self.gpu.uuid[:12]}", daemon=True
        )
        self._thread.start()

    @property
    def applied_mhz(self) -> int | None:
        """The last clock the driver accepted (after snapping), or None."""
        return self._applied

    def request(self, freq_mhz: int) -> None:
        """Post ``freq_mhz``; returns immediately. Unchanged requests cost one comparison.

        Raises:
            DeviceError: the error a previous apply hit (raised once, then cleared).
        """
        if self._attention:
            self._surface()
        if freq_mhz == self._posted or self.observe_only:
            return
        with self._cond:
            if self._pending is not None:
                self._stale += 1
            self._pending = freq_mhz
            self._pending_since = time.perf_counter()
            self._posted = freq_mhz
            self._cond.notify()

    def forget(self) -> None:
        """Forget the last posted clock so the next request is applied even if equal (after
        someone else reset the GPU)."""
        self._posted = None

    def flush(self, timeout_s: float = 1.0) -> bool:
        """Wait until no request is pending or in flight; True if it drained in time.

        Raises:
            DeviceError: an error the worker hit.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    break
                self._cond.wait(left)
            drained = self._pending is None and not self._busy
        if self._attention:
            self._surface()
        return drained

    def close(self, timeout_s: float = 1.0) -> None:
        """Drop any pending request and stop the worker (idempotent); errors are dropped too."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def stats(self) -> ApplyStats:
        """Apply-delay statistics over the recent history."""
        delays = sorted(self._delays_s)
        if not delays:
            return ApplyStats(0, self._stale, 0.0, 0.0, 0.0)
        n = len(delays)
        return ApplyStats(
            applied=n,
            skipped_stale=self._stale,
            median_delay_s=delays[n // 2],
            p99_delay_s=delays[min(n - 1, int(0.99 * n))],
            max_delay_s=delays[-1],
        )

    def _surface(self) -> None:
        """On the caller's thread: warn about observe-only mode once, re-raise a worker error."""
        self._attention = False
        notice, self._notice = self._notice, None
        if notice is not None:
            warnings.warn(notice, ObserveOnlyWarning, stacklevel=3)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    self._cond.notify_all()
                    return
                freq, since = self._pending, self._pending_since
                self._pending = None
                self._busy = True
            try:
                assert freq is not None  # set under the lock above
                with self.device_lock:
                    if not self._closed:
                        self._applied = self.gpu.set_locked_clock(freq)
                self._delays_s.append(time.perf_counter() - since)
            except (DevicePermissionError, DeviceNotSupportedError) as e:
                self.observe_only = True
                self._notice = (
                    f"perseus: cannot lock clocks on {self.gpu.name}; observe-only mode (time "
                    f"and energy are still measured): {e}"
                )
                self._attention = True
            except DeviceError as e:
                self._error = e
                self._posted = None
                self._attention = True
            except Exception as e:  # a backend bug must not kill the worker silently
                wrapped = DeviceError(f"setting the clock on {self.gpu.name} failed: {e!r}")
                wrapped.__cause__ = e
                self._error = wrapped
                self._posted = None
                self._attention = True
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
