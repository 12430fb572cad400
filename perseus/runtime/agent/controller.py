"""Apply clocks (the SM clock, and the memory clock where a plan sets one) off the training
thread, on the device's timeline.

A set-clock call blocks its caller for ~5 ms (up to 15 ms, docs/hardware.md#sim-defaults), far too
long for the
training loop, so the rank agent only *posts* work and a worker thread makes the driver calls.

Two ways to post:

* **On the device's timeline** (:meth:`FrequencyController.post`, the default whenever the
  device records events). CUDA launches are asynchronous: the host runs ahead of the GPU, so
  a clock set "when the host enters the op" lands during some earlier op. Instead, at each op
  boundary the agent records a device event on the compute stream and posts a
  :class:`Boundary`: "op *j* starts at this event; when it ends, run at ``freq_next_mhz``".
  The worker waits for the op's start event, then issues the next clock early by the
  measured set latency, at ``start + expected op time - latency`` (the expected time is the
  op's device-event time in the previous iteration, when known), so the new clock applies as
  the op ends; without an expectation it waits for the op's end event. A phased op
  (:mod:`perseus.profile.two_clock`: two to four phases) carries, per later phase, its clock
  pair and the predicted device time from the op's start to the phase's layer boundary: the
  worker issues each at ``start + predicted time to the boundary - latency`` in the same way
  (the rest skipped once the op ended), then the next op's clocks as above. A pair whose
  memory clock changes makes two driver calls (memory, then SM), each charged the device's
  set latency, so such a change is issued earlier by one more median landing. It also stamps each
  event with the energy counter as it observes completion (devices whose events carry their
  own counter reading need no stamp), so op and iteration energy are read at device-time
  boundaries.
* **Host-timed** (:meth:`FrequencyController.request`): apply the latest requested clock as
  soon as possible (a single slot: a new request overwrites a pending one). Kept for devices
  without events and as the baseline that ``benchmarks/clock_timing.py`` compares against.

Time: the worker reads the time and waits on a :class:`~perseus.device.clock.Clock` (the
real one by default). With a :class:`~perseus.device.clock.VirtualClock` there is no worker
thread: the work posted is done inline, in order, by :meth:`FrequencyController.flush` and
:meth:`FrequencyController.wait_applied` (the agent calls them in ``step_end``), so every
timing decision is deterministic (``docs/timing.md``).

Errors: permission/support errors switch to *observe-only* (no further set calls) with one
:class:`~perseus.device.base.ObserveOnlyWarning`. Other device errors are retried
(``retries`` times, with a short back-off); an error that persists also switches to
observe-only with one warning, instead of killing training.

Shutdown: :meth:`FrequencyController.close` joins the worker; :meth:`close_nowait` only sets a
flag (no lock taken), for signal handlers that may have interrupted a thread holding the
controller's lock.
"""

from __future__ import annotations

import bisect
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from perseus.device.base import (
    GPU,
    AppliedClockGPU,
    ClockReadbackGPU,
    DeviceEvent,
    EventSource,
    MemoryClockGPU,
    ObserveOnlyWarning,
)
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.errors import DeviceError, DeviceNotSupportedError, DevicePermissionError
from perseus.runtime.agent.readback import IDLE_REASON

__all__ = ["ApplyStats", "Boundary", "FrequencyController", "MidSwitch", "issue_offset_s"]

#: How often the worker re-checks an event it waits for (a CUDA event has no timed wait).
POLL_S = 0.0002

#: The worker stops sleeping this long before a planned set call and polls (yielding) for
#: the rest: a sleep overshoots by up to a scheduler tick on a loaded machine.
FINAL_POLL_S = 0.001
#: ... and stops querying the op's end event this long before it (a query may wait on a
#: lock); an op that ends earlier than predicted by more than this plus the lead is rare.
FINAL_APPROACH_S = 0.003

#: Quantiles of the op-end prediction error folded into the landing distribution.
_ERROR_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
#: How many quantiles of the landing history the targeting uses (cached between calls).
_LANDING_QUANTILES = 64


def issue_offset_s(
    landings_s: Sequence[float], gap_s: float, end_errors_s: Sequence[float] = ()
) -> float:
    """When to issue a clock change, relative to an op's predicted end (negative: before).

    The new clock lands ``L`` after the call is issued (``landings_s``: samples of ``L``).
    Landing before the op's true end runs its tail at the next op's clock; landing after the
    next op's start (``gap_s`` of idle device time after the end) runs that op's head at the
    old clock. The op's true end is the prediction plus an error (``end_errors_s``: samples,
    equally likely). The expected wrong-clock time, E[(end - x)+ + (x - end - gap)+], is least
    where landing before the end is as likely as landing after the next start: with no gap
    that is the median landing (so the lead is the median of the landing time, not of the
    call time), within a gap the two tails balance, and a gap wider than the spread leaves a
    range of offsets with no wrong time at all: this returns its middle.
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


@dataclass(frozen=True, slots=True)
class ApplyStats:
    """Clock-set calls: how long the driver call blocked, and request-to-apply delays."""

    applied: int
    skipped_stale: int
    median_delay_s: float
    p99_delay_s: float
    max_delay_s: float
    median_set_latency_s: float = 0.0


class MidSwitch(NamedTuple):
    """A clock change inside an op: at ``at_s`` of device time after the op's start (None:
    unknown, skipped), SM clock ``freq_mhz`` and memory clock ``mem_freq_mhz`` (None: left
    as it is)."""

    at_s: float | None
    freq_mhz: int
    mem_freq_mhz: int | None = None


@dataclass(eq=False, slots=True)
class Boundary:
    """One op on the device's timeline, posted by the agent when the host enters it.

    Attributes:
        start: Event recorded on the compute stream just before the op.
        end: Event recorded just after it (set by the agent when the host leaves the op).
        freq_next_mhz: Clock of the next op (None: last op of the iteration, or no change).
        expected_s: Expected device time of this op (None: unknown, wait for ``end``).
        gap_s: Expected idle device time between this op's end and the next op's start
            (waiting for its input); the change may land anywhere in it.
        start_mj / end_mj: The energy counter at the events' device times.
        mem_next_mhz: Memory clock of the next op (None: not set by the plan).
        mids: Phased op: the changes inside the op, in order (empty: one phase).
        mids_issued: Set by the worker: how many of ``mids`` were issued (before the op
            ended).
        mids_missed: Set by the worker: how many of ``mids`` were skipped because the op
            ended before the worker issued them (a late worker, or an op shorter than
            predicted).
        mid_issue_s: Device-clock time at which the first mid-op change was issued.
        stamp: Read the counter at ``start`` even when the controller does not stamp ops (an
            iteration's first event: its reading is taken here, off the training thread).
        aim_s / ready_s / issue_s / return_s: Set by the worker, on the device's clock, for
            the change to ``freq_next_mhz``: when it meant to issue the set call (None:
            waited for the end event), when it was ready to wait for that moment (the start
            event seen, earlier jobs done), when it issued the call and when the call
            returned (``benchmarks/clock_timing.py`` decomposes the wrong-clock time with
            them).
        asked_mhz / read_mhz / read_reasons: Set by the worker, which reads the clock back
            once inside the op (mid-way when its time is known, else as it starts; see
            :mod:`perseus.runtime.agent.readback`): the SM clock whose set call had returned
            then, the clock the GPU ran and its clock event reasons (None: not read).
    """

    start: DeviceEvent
    freq_next_mhz: int | None
    expected_s: float | None
    end: DeviceEvent | None = None
    start_mj: int | None = None
    end_mj: int | None = None
    applied_early: bool = field(default=False)
    mem_next_mhz: int | None = None
    mids: tuple[MidSwitch, ...] = ()
    mids_issued: int = 0
    mids_missed: int = 0
    mid_issue_s: float | None = None
    stamp: bool = False
    gap_s: float = 0.0
    aim_s: float | None = None
    ready_s: float | None = None
    issue_s: float | None = None
    return_s: float | None = None
    asked_mhz: int | None = None
    read_mhz: int | None = None
    read_reasons: int = 0

    @property
    def mid_issued(self) -> bool:
        """True when at least one mid-op change was issued."""
        return self.mids_issued > 0

    @property
    def mid_freq_mhz(self) -> int | None:
        """The SM clock of the first mid-op change (None: a one-phase op)."""
        return self.mids[0].freq_mhz if self.mids else None

    def time_s(self) -> float:
        """The op's device time (blocks until the end event completed)."""
        assert self.end is not None
        return self.end.device_time_s() - self.start.device_time_s()

    def energy_j(self) -> float | None:
        """The op's energy from the counter at its boundaries, when both were read."""
        if self.start_mj is None or self.end_mj is None:
            return None
        return (self.end_mj - self.start_mj) / 1000.0


class FrequencyController:
    """Applies clocks on a worker thread, timed by device events or by host requests.

    Usage::

        ctl = FrequencyController(gpu, events=gpu)
        ctl.start()
        ctl.apply_now(1410)                  # iteration start
        ctl.post(Boundary(start_event, freq_next_mhz=1095, expected_s=0.05))
        ctl.flush()                          # wait until everything posted is done
        ctl.close()

    Args:
        gpu: The device to drive.
        events: Where device time comes from (None: host-timed requests only).
        control: False only observes (stamps events with the counter; never sets clocks).
        retries: Extra attempts for a failing set call before going observe-only.
        history: How many apply delays to keep for :meth:`stats`.
        apply_delay_s: How long after a set call returns the new clock takes effect, for a
            device that cannot tell (NVML: +0-2 ms, docs/hardware.md#sim-model; not measured here,
            so 0 by
            default). A device with ``clock_applied_s()`` (the simulator) reports it.
        stamp_ops: Read the device's energy counter at every op boundary whose event carries
            no reading of its own. False for NVML: its counter is published every 100 ms and a
            read costs ~3 ms of driver time (measured on an H100, benchmarks/README.md), so
            per-op reads would only return 0 or one whole 100 ms step, and would make the
            worker fall behind the ops; iteration energy is then read at the iteration's ends.
        clock: Where the worker reads the time and sleeps (:mod:`perseus.device.clock`); the
            device's events must be on the same timeline when it is virtual.
        threaded: Run the worker on its own thread (default: when ``clock`` is real). Without a
            thread the work posted is done on the caller's thread, in order, by :meth:`flush`
            and :meth:`wait_applied`: with a :class:`~perseus.device.clock.VirtualClock` every
            timing decision is then deterministic (tests).
        read_back: Read the clock the GPU ran and its clock event reasons once per op
            (devices with :class:`~perseus.device.base.ClockReadbackGPU`), on the worker.
    """

    def __init__(
        self,
        gpu: GPU,
        *,
        events: EventSource | None = None,
        control: bool = True,
        retries: int = 2,
        history: int = 10_000,
        stamp_ops: bool = True,
        apply_delay_s: float = 0.0,
        clock: Clock = REAL_CLOCK,
        threaded: bool | None = None,
        read_back: bool = True,
    ) -> None:
        self.gpu = gpu
        self.clock = clock
        self._threaded = clock.real_time if threaded is None else threaded
        self.events = events
        self._stamp_ops = stamp_ops
        self._cond = threading.Condition(threading.Lock())
        # Clock pairs (SM, memory or None) from here on: request() and apply_now() post them.
        self._pending: tuple[int, int | None] | None = None
        self._pending_since = 0.0
        self._posted: tuple[int, int | None] | None = None  # last value accepted by request()
        self._applied: int | None = None  # last value the driver accepted (snapped)
        self._target: int | None = None  # the last clock asked for, applied or not
        self._done: int | None = None  # the last clock whose set call returned
        self._mem_target: int | None = None  # the last memory clock asked for
        self._mem_gpu: MemoryClockGPU | None = gpu if isinstance(gpu, MemoryClockGPU) else None
        self._jobs: deque[Boundary] = deque()
        self._busy = False
        self._error: BaseException | None = None
        self._notice: str | None = None
        self._attention = False  # set by the worker when _error or _notice needs surfacing
        self._closed = False
        self._thread: threading.Thread | None = None
        self._delays_s: deque[float] = deque(maxlen=history)
        self._latencies_s: deque[float] = deque(maxlen=256)
        # Issue -> the new clock in effect, on the device's clock (the lead is learnt from it).
        self._landings_s: deque[float] = deque(maxlen=256)
        self._landing_q: tuple[float, ...] = ()  # quantiles of _landings_s (cached)
        self._landing_q_at = 0  # _landing_count when _landing_q was computed
        self._landing_count = 0
        # Relative error of each op's predicted device time: (actual - expected) / expected.
        self._end_errors: deque[float] = deque(maxlen=128)
        self._apply_delay_s = apply_delay_s
        self._clock_applied: Callable[[], float | None] | None = (
            gpu.clock_applied_s if isinstance(gpu, AppliedClockGPU) else None
        )
        # Reads back what ran (NVML, the simulator); None: the device cannot tell.
        self._readback: ClockReadbackGPU | None = (
            gpu if read_back and isinstance(gpu, ClockReadbackGPU) else None
        )
        self._stale = 0
        self._retries = retries
        self.observe_only = not control
        # Held by the worker around each driver call, so a reset on shutdown cannot be
        # overtaken by a set call that was already in flight.
        self.device_lock = threading.Lock()

    def start(self) -> None:
        """Start the worker thread (idempotent; no thread when not ``threaded``)."""
        if self._thread is not None:
            return
        self._closed = False
        if not self._threaded:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"perseus-clock-{self.gpu.uuid[:12]}", daemon=True
        )
        self._thread.start()

    @property
    def applied_mhz(self) -> int | None:
        """The last clock the driver accepted (after snapping), or None."""
        return self._applied

    @property
    def applied_target_mhz(self) -> int | None:
        """The last requested clock whose set call has returned (before snapping)."""
        return self._done

    def set_latency_s(self) -> float | None:
        """Median measured set-call latency (None before the first call)."""
        lat = sorted(self._latencies_s)
        return lat[len(lat) // 2] if lat else None

    def landing_s(self) -> float | None:
        """Median time from issuing a set call to the new clock taking effect: as the device
        reports it, else the call's duration plus ``apply_delay_s`` (None before the first)."""
        q = self._landing_quantiles()
        return q[len(q) // 2] if q else None

    def _landing_quantiles(self) -> tuple[float, ...]:
        count = self._landing_count
        if count and (not self._landing_q or count - self._landing_q_at >= 8):
            lat = sorted(self._landings_s)
            m = min(len(lat), _LANDING_QUANTILES)
            self._landing_q = tuple(lat[int((i + 0.5) * len(lat) / m)] for i in range(m))
            self._landing_q_at = count
        return self._landing_q

    def _issue_offset_s(self, job: Boundary) -> float | None:
        """When to issue ``job``'s change relative to its op's predicted end (None: no
        landing measured yet)."""
        landings = self._landing_quantiles()
        if not landings:
            return None
        errs = sorted(self._end_errors)
        expected = job.expected_s or 0.0
        errors = (
            tuple(expected * errs[int(q * len(errs))] for q in _ERROR_QUANTILES)
            if len(errs) >= 8
            else ()
        )
        return issue_offset_s(landings, job.gap_s, errors)

    # ----------------------------------------------------------------------------------------
    # Posting (training thread)

    def request(self, freq_mhz: int, mem_freq_mhz: int | None = None) -> None:
        """Host-timed: apply ``freq_mhz`` (and memory clock ``mem_freq_mhz`` unless None) as
        soon as possible; returns immediately.

        Raises:
            DeviceError: a worker error (raised once, then cleared).
        """
        if self._attention:
            self._surface()
        pair = (freq_mhz, mem_freq_mhz)
        if pair == self._posted or self.observe_only:
            return
        with self._cond:
            if self._pending is not None:
                self._stale += 1
            self._pending = pair
            self._pending_since = self.clock.now()
            self._posted = pair
            self._cond.notify()
        if not self._threaded:
            self._drain()  # inline: "as soon as possible" is now

    def apply_now(self, freq_mhz: int, mem_freq_mhz: int | None = None) -> None:
        """Device-timed mode: apply ``freq_mhz`` (and ``mem_freq_mhz`` unless None) before
        the next posted boundary is handled (the device is idle at an iteration boundary, so
        "now" is the right time)."""
        if freq_mhz == self._target and not self._mem_change(mem_freq_mhz):
            return
        self._posted = None  # boundaries may have moved the clock since the last request
        self.request(freq_mhz, mem_freq_mhz)

    def post(self, boundary: Boundary) -> None:
        """Device-timed: handle ``boundary`` in order (see the module docstring)."""
        if self._attention:
            self._surface()
        with self._cond:
            self._jobs.append(boundary)
            self._cond.notify()

    def forget(self) -> None:
        """Forget the last posted clock so the next request is applied even if equal (after
        someone else reset the GPU: a power schedule's pause between intervals)."""
        self._posted = None
        self._target = None
        self._mem_target = None

    def flush(self, timeout_s: float = 1.0) -> bool:
        """Wait until nothing is pending or in flight; True if it drained in time.

        Raises:
            DeviceError: an error the worker hit.
        """
        if not self._threaded:
            self._drain()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    break
                self._cond.wait(min(left, 0.05))
            drained = self._pending is None and not self._jobs and not self._busy
        if self._attention:
            self._surface()
        return drained

    def wait_applied(self, freq_mhz: int, timeout_s: float = 1.0) -> bool:
        """Wait until a set call for ``freq_mhz`` has returned (True), the controller is
        observe-only (True: nothing to wait for) or the timeout passed (False).

        Raises:
            DeviceError: an error the worker hit.
        """
        if not self._threaded:
            self._drain()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._done != freq_mhz and not self.observe_only:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    break
                self._cond.wait(min(left, 0.05))
            ok = self._done == freq_mhz or self.observe_only
        if self._attention:
            self._surface()
        return ok

    def close(self, timeout_s: float = 1.0) -> None:
        """Drop anything pending and stop the worker (idempotent); errors are dropped too."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._jobs.clear()
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def close_nowait(self) -> None:
        """Ask the worker to stop without taking any lock (signal handlers, atexit)."""
        self._closed = True

    def stats(self) -> ApplyStats:
        """Apply-delay statistics over the recent history."""
        delays = sorted(self._delays_s)
        latency = self.set_latency_s() or 0.0
        if not delays:
            return ApplyStats(0, self._stale, 0.0, 0.0, 0.0, latency)
        n = len(delays)
        return ApplyStats(
            applied=n,
            skipped_stale=self._stale,
            median_delay_s=delays[n // 2],
            p99_delay_s=delays[min(n - 1, int(0.99 * n))],
            max_delay_s=delays[-1],
            median_set_latency_s=latency,
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

    # ----------------------------------------------------------------------------------------
    # Worker

    @property
    def threaded(self) -> bool:
        """True when a worker thread does the work (else :meth:`flush` does it inline)."""
        return self._threaded

    def _drain(self) -> None:
        """Inline mode: do everything posted so far on this thread, in the worker's order."""
        while not self._closed:
            with self._cond:
                freq, since = self._pending, self._pending_since
                self._pending = None
                job = self._jobs[0] if freq is None and self._jobs else None
            if freq is not None:
                self._apply(freq[0], since, freq[1])
            elif job is not None:
                if job.end is None:
                    return  # the host is still inside this op: the rest waits for it
                self._handle(job)
                with self._cond:
                    if self._jobs and self._jobs[0] is job:
                        self._jobs.popleft()
            else:
                return

    def _run(self) -> None:
        while not self._closed:
            with self._cond:
                while self._pending is None and not self._jobs and not self._closed:
                    self._cond.wait(0.05)  # timed: close_nowait() takes no lock to wake us
                if self._closed:
                    self._cond.notify_all()
                    return
                freq, since = self._pending, self._pending_since
                self._pending = None
                job = self._jobs[0] if freq is None and self._jobs else None
                self._busy = True
            try:
                if freq is not None:
                    self._apply(freq[0], since, freq[1])
                elif job is not None:
                    self._handle(job)
                    with self._cond:
                        if self._jobs and self._jobs[0] is job:
                            self._jobs.popleft()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _wait_event(self, event: DeviceEvent, stamp: bool) -> int | None:
        """Poll until ``event`` completed (or we close); its counter reading. On a virtual
        clock nothing can happen meanwhile (the work is inline): wait for the event at once."""
        sleep = self.clock.sleep
        if not self.clock.real_time:
            event.synchronize()
        while not event.query():
            if self._closed:
                return None
            sleep(POLL_S)
        mj = event.energy_mj
        if mj is None and stamp:
            try:
                mj = self.gpu.energy_mj()
            except DeviceError:
                mj = None
        return mj

    def _wait_end(self, job: Boundary, until_s: float | None) -> bool:
        """Wait for ``job``'s end event, or until device-clock time ``until_s``; True if the
        end event completed."""
        events, sleep = self.events, self.clock.sleep
        while not self._closed:
            end = job.end
            if end is not None and end.query():
                return True
            if until_s is not None and events is not None:
                left = until_s - events.timeline_now_s()
                if left <= 0:
                    return False
                sleep(min(left, 0.002) if end is None else min(left, POLL_S * 5))
            else:
                sleep(POLL_S)
        return False

    def _settle_until(self, until_s: float) -> None:
        """The last stretch before a planned set call: sleep, then poll (a sleep overshoots
        by up to a scheduler tick on a loaded machine)."""
        events = self.events
        assert events is not None
        sleep = self.clock.sleep
        while not self._closed:
            left = until_s - events.timeline_now_s()
            if left <= 0:
                return
            sleep(left - FINAL_POLL_S if left > FINAL_POLL_S and self.clock.real_time else left)

    def _handle(self, job: Boundary) -> None:
        """One op on the device's timeline: its start reading, the mid-op changes of a
        phased op, the next op's clocks, its end reading and prediction error."""
        job.start_mj = self._wait_event(job.start, stamp=self._stamp_ops or job.stamp)
        events = self.events
        for i, mid in enumerate(job.mids):
            if mid.at_s is None or events is None:
                break
            if not self._wants(mid.freq_mhz, mid.mem_freq_mhz):
                continue  # already at these clocks
            if not self._issue_mid(job, mid, events):
                # The op ended first: its later phases are skipped too.
                job.mids_missed = len(job.mids) - i
                break
        if self._closed:
            return
        if self._readback is not None and not job.stamp:
            self._read_back(job, self._readback)
        if job.freq_next_mhz is not None and self._wants(job.freq_next_mhz, job.mem_next_mhz):
            self._issue_next(job, job.freq_next_mhz, job.mem_next_mhz)
            if self._closed:
                return
        self._finish(job)

    def _read_back(self, job: Boundary, gpu: ClockReadbackGPU) -> None:
        """Read the clock the GPU runs inside ``job``'s op: mid-way through it when its time
        is known (before the next clock is due), else as soon as it runs (the device may idle
        after the start event, waiting for the op's input: such readings are retried);
        nothing when the op ended first or no clock of ours is applied (observe-only)."""
        if self._applied is None or self.observe_only:
            return
        events = self.events
        due = None
        if job.expected_s is not None and events is not None:
            start = job.start.device_time_s()
            due = start + job.expected_s - (self.landing_s() or 0.0) - FINAL_APPROACH_S
            if self._wait_end(job, min(start + 0.5 * job.expected_s, due)):
                return
        while not (job.end is not None and job.end.query()) and not self._closed:
            try:
                read_mhz, reasons = gpu.current_clock_mhz(), gpu.clock_event_reasons()
            except DeviceError:
                self._readback = None  # not on this GPU or driver: stop asking
                return
            if not reasons & IDLE_REASON or events is None:
                job.read_mhz, job.read_reasons, job.asked_mhz = read_mhz, reasons, self._applied
                return
            while job.end is None and not self._closed:  # not launched yet: no read till then
                self.clock.sleep(5 * POLL_S)
            now = events.timeline_now_s()
            if (due is not None and now >= due) or self._wait_end(job, now + 5 * POLL_S):
                return

    def _wants(self, freq_mhz: int | None, mem_freq_mhz: int | None = None) -> bool:
        """True when the pair is a change to make (a None memory clock is no change)."""
        if freq_mhz is None or self.observe_only:
            return False
        return freq_mhz != self._target or self._mem_change(mem_freq_mhz)

    def _mem_change(self, mem_freq_mhz: int | None) -> bool:
        return (
            mem_freq_mhz is not None
            and self._mem_gpu is not None
            and mem_freq_mhz != self._mem_target
        )

    def _extra_lead_s(self, freq_mhz: int, mem_freq_mhz: int | None) -> float:
        """A pair change makes two set calls: the memory call's landing comes first."""
        if self._mem_change(mem_freq_mhz) and freq_mhz != self._target:
            return self.landing_s() or 0.0
        return 0.0

    def _issue_mid(self, job: Boundary, mid: MidSwitch, events: EventSource) -> bool:
        """Phased op: the same prediction as for op boundaries, aimed at the planned layer
        boundary inside the op; False (nothing issued) when the op ends first."""
        assert mid.at_s is not None
        lead = (self.landing_s() or 0.0) + self._extra_lead_s(mid.freq_mhz, mid.mem_freq_mhz)
        mid_until = job.start.device_time_s() + mid.at_s - lead
        if self._wait_end(job, mid_until) or self._closed:
            return False
        if job.mid_issue_s is None:
            job.mid_issue_s = events.timeline_now_s()
        job.mids_issued += 1
        self._apply(mid.freq_mhz, self.clock.now(), mid.mem_freq_mhz)
        return True

    def _issue_next(self, job: Boundary, freq_mhz: int, mem_freq_mhz: int | None = None) -> None:
        """The next op's clocks: at the aim (predicted end plus the learnt offset), or when
        the op's end event completes when there is no prediction."""
        events = self.events
        until = None
        offset = self._issue_offset_s(job) if job.expected_s is not None else None
        if job.expected_s is not None and offset is not None:
            offset -= self._extra_lead_s(freq_mhz, mem_freq_mhz)
            until = job.start.device_time_s() + job.expected_s + offset
        job.aim_s = until
        if events is not None:
            job.ready_s = events.timeline_now_s()
        settle = False
        if until is not None and events is not None:
            # Watch the end event until shortly before the aim; then only the clock: a device
            # event query may wait on a lock (the simulator's, held while the host launches).
            ended = self._wait_end(job, until - FINAL_APPROACH_S)
            if not ended:
                settle = True
                self._settle_until(until)
        else:
            ended = self._wait_end(job, until)
        if self._closed:
            return
        if events is not None:
            job.issue_s = events.timeline_now_s()
        self._apply(freq_mhz, self.clock.now(), mem_freq_mhz)
        if settle:  # did the op end before the call was issued?
            end, issued = job.end, job.issue_s or 0.0
            ended = end is not None and end.query() and end.device_time_s() <= issued
        job.applied_early = not ended
        if events is not None:
            job.return_s = events.timeline_now_s()

    def _finish(self, job: Boundary) -> None:
        """Wait for the op's end: its counter reading and how far its time was predicted."""
        sleep = self.clock.sleep
        while job.end is None and not self._closed:
            sleep(POLL_S)
        if job.end is not None:
            job.end_mj = self._wait_event(job.end, stamp=self._stamp_ops)
            if job.expected_s and not self._closed:
                actual = job.end.device_time_s() - job.start.device_time_s()
                self._end_errors.append(actual / job.expected_s - 1.0)

    def _apply(self, freq: int, since: float, mem: int | None = None) -> None:
        """Set the memory clock (when ``mem`` is a change), then the SM clock (a memory-only
        change leaves the SM lock alone); each call is one driver call and its latency."""
        if self.observe_only or self._closed:
            return
        set_mem = self._mem_change(mem)
        set_sm = freq != self._target or not set_mem
        self._target = freq
        if set_mem:
            self._mem_target = mem
        last: BaseException | None = None
        now = self.clock.now
        for attempt in range(self._retries + 1):
            try:
                events, applied = self.events, self._clock_applied
                if set_mem:
                    mem_gpu = self._mem_gpu
                    assert mem is not None and mem_gpu is not None
                    with self.device_lock:
                        if self._closed:
                            return
                        t0 = now()
                        try:
                            mem_gpu.set_memory_locked_clock(mem)
                        except (DevicePermissionError, DeviceNotSupportedError) as e:
                            self._drop_memory_clocks(e)
                        t1 = now()
                    set_mem = False  # done: a retry of the SM call does not repeat it
                    if self._mem_gpu is not None:
                        self._latencies_s.append(t1 - t0)
                        self._landings_s.append(t1 - t0 + self._apply_delay_s)
                        self._landing_count += 1
                    if not set_sm:
                        self._delays_s.append(t1 - since)
                        self._done = freq
                        return
                with self.device_lock:
                    if self._closed:
                        return
                    issued = events.timeline_now_s() if events is not None else 0.0
                    t0 = now()
                    self._applied = self.gpu.set_locked_clock(freq)
                    t1 = now()
                    landed = applied() if applied is not None and events is not None else None
                self._latencies_s.append(t1 - t0)
                if landed is not None:
                    self._landings_s.append(landed - issued)
                else:
                    self._landings_s.append(t1 - t0 + self._apply_delay_s)
                self._landing_count += 1
                self._delays_s.append(t1 - since)
                self._done = freq
                return
            except (DevicePermissionError, DeviceNotSupportedError) as e:
                self._degrade(f"cannot lock clocks on {self.gpu.name}: {e}")
                return
            except Exception as e:  # transient (NVML timeout) or a backend bug: retry
                last = e
                self.clock.sleep(0.001 * (attempt + 1))
        self._degrade(
            f"setting the clock on {self.gpu.name} kept failing ({self._retries + 1} tries, "
            f"last: {last!r})"
        )

    def _drop_memory_clocks(self, error: DeviceError) -> None:
        """The driver refused a memory lock (a board that lists memory clocks but does not
        lock them): keep setting SM clocks, never ask for a memory clock again, warn once."""
        self._mem_gpu = None
        self._mem_target = None
        self._notice = (
            f"perseus: cannot lock memory clocks on {self.gpu.name}: {error}; running SM clocks "
            "only, at the default memory clock (the plan's figures will not hold)"
        )
        self._attention = True

    def _degrade(self, why: str) -> None:
        self._notice = f"perseus: {why}; observe-only mode (time and energy are still measured)"
        self._attention = True
        self._posted = None
        self.observe_only = True  # last: a waiter that sees it also sees the notice
