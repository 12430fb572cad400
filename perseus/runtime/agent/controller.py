"""Apply clocks (SM, and memory where a plan sets one) off the training thread: a set call
blocks ~5 ms, so the agent only posts work and a worker makes the driver calls.

Device-timed (:meth:`FrequencyController.post`): the worker waits for an op's start event,
issues the next clocks to land as the op ends, reads the clock back inside each op and stamps
events with the energy counter. Host-timed (:meth:`FrequencyController.request`): the latest
request, as soon as possible. On a virtual clock the work is done inline (``docs/timing.md``).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import deque
from collections.abc import Callable

from perseus.device.base import GPU, ClockReadbackGPU, DeviceEvent, EventSource, ObserveOnlyWarning
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.errors import DeviceError
from perseus.log import get_logger
from perseus.runtime.agent.boundary import Boundary, MidSwitch, OpReport
from perseus.runtime.agent.clock_setter import ApplyStats, ClockSetter
from perseus.runtime.agent.readback import IDLE_REASON

__all__ = ["FrequencyController"]

#: How often the worker re-checks an event it waits for (a CUDA event has no timed wait).
POLL_S = 0.0002

#: The worker stops sleeping this long before a planned set call and polls (yielding) for
#: the rest: a sleep overshoots by up to a scheduler tick on a loaded machine.
FINAL_POLL_S = 0.001
#: ... and stops querying the op's end event this long before it (a query may wait on a
#: lock); an op that ends earlier than predicted by more than this plus the lead is rare.
FINAL_APPROACH_S = 0.003

_log = get_logger(__name__)


class FrequencyController:
    """Applies clocks on a worker thread, timed by device events or by host requests.

    Args:
        gpu: The device to drive.
        events: Where device time comes from (None: host-timed requests only).
        control: False only observes (stamps events with the counter; never sets clocks).
        stamp_ops: Read the energy counter at every op boundary whose event carries no reading
            (False for NVML, whose reads cost ~3 ms: only iteration ends are read).
        clock: Where the worker reads the time and sleeps (virtual: the work is done inline).
    """

    def __init__(
        self,
        gpu: GPU,
        *,
        events: EventSource | None = None,
        control: bool = True,
        stamp_ops: bool = True,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.gpu = gpu
        self.clock = clock
        self._threaded = clock.real_time
        self.events = events
        self._stamp_ops = stamp_ops
        self._cond = threading.Condition(threading.Lock())
        # Clock pairs (SM, memory or None) from here on: request() and apply_now() post them.
        self._pending: tuple[int, int | None] | None = None
        self._pending_since = 0.0
        self._posted: tuple[int, int | None] | None = None  # last value accepted by request()
        self._jobs: deque[Boundary] = deque()
        self._busy = False
        self._idle = False  # the worker waits for work (post() then wakes it)
        self._attention = False  # set by the worker when the setter's notice needs surfacing
        self._closed = False
        self._thread: threading.Thread | None = None
        self.setter = ClockSetter(
            gpu,
            events=events,
            clock=clock,
            control=control,
            stopped=lambda: self._closed,
        )
        self.device_lock = self.setter.device_lock
        # None: the device cannot say which clock ran.
        self._readback: ClockReadbackGPU | None = gpu if isinstance(gpu, ClockReadbackGPU) else None
        self._stale = 0
        self._failures = 0  # ops whose handling raised

    def start(self) -> None:
        """Start the worker thread (idempotent; none when not ``threaded``)."""
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
    def observe_only(self) -> bool:
        """True once no clock is set any more (``control=False``, refused, or failing)."""
        return self.setter.observe_only

    @property
    def reads_back(self) -> bool:
        """True when the GPU can say which clock ran (observe-only too)."""
        return self._readback is not None

    @property
    def threaded(self) -> bool:
        """True when a worker thread does the work (else :meth:`flush` does it inline)."""
        return self._threaded

    def stats(self) -> ApplyStats:
        """Apply-delay statistics over the recent history."""
        return self.setter.stats(self._stale)

    # ----------------------------------------------------------------------------------------
    # Posting (training thread)

    def request(self, freq_mhz: int, mem_freq_mhz: int | None = None) -> None:
        """Host-timed: apply ``freq_mhz`` (and memory clock ``mem_freq_mhz`` unless None) as
        soon as possible; returns immediately."""
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
        """Device-timed: apply ``freq_mhz`` (and ``mem_freq_mhz`` unless None) before the next
        posted boundary is handled (at an iteration boundary the device is idle)."""
        setter = self.setter
        if freq_mhz == setter.target_mhz and not setter.mem_change(mem_freq_mhz):
            return
        self._posted = None  # boundaries may have moved the clock since the last request
        self.request(freq_mhz, mem_freq_mhz)

    def post(self, boundary: Boundary) -> None:
        """Device-timed: handle ``boundary`` in order (see the module docstring)."""
        if self._attention:
            self._surface()
        self._jobs.append(boundary)  # atomic; the lock only to wake a worker waiting for work
        if self._idle:
            with self._cond:
                self._cond.notify()

    def forget(self) -> None:
        """Forget the last posted clock so the next request is applied even if equal (someone
        else reset the GPU)."""
        self._posted = None
        self.setter.forget()

    def flush(self, timeout_s: float = 1.0) -> bool:
        """Wait until nothing is pending or in flight; True if it drained in time."""
        return self._wait(self._drained, timeout_s)

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        if not self._threaded:
            self._drain()
        with self._cond:
            self._cond.wait_for(lambda: done() or self._thread is None or self._closed, timeout_s)
            ok = done()
        if self._attention:
            self._surface()
        return ok

    def wait_done(self, job: Boundary) -> bool:
        """Wait until the worker has handled ``job`` and every job posted before it; False when
        the controller closed or its worker stopped first."""
        if not self._threaded:
            self._drain()
        with self._cond:
            while job in self._jobs and self._working():
                self._cond.wait(0.05)  # timed: a worker that died says nothing
            return job not in self._jobs

    def _working(self) -> bool:
        thread = self._thread
        return not self._closed and thread is not None and thread.is_alive()

    def _drained(self) -> bool:
        return self._pending is None and not self._jobs and not self._busy

    def wait_applied(self, freq_mhz: int, timeout_s: float = 1.0) -> bool:
        """Wait until a set call for ``freq_mhz`` has returned (True), the controller is
        observe-only (True: nothing to wait for) or the timeout passed (False)."""
        return self._wait(lambda: self.setter.done_mhz == freq_mhz or self.observe_only, timeout_s)

    def close(self, timeout_s: float = 1.0) -> None:
        """Drop anything pending and stop the worker (idempotent)."""
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

    def _surface(self) -> None:
        """On the caller's thread: warn once about observe-only mode or dropped memory clocks."""
        self._attention = False
        notice, self.setter.notice = self.setter.notice, None
        if notice is not None:
            warnings.warn(notice, ObserveOnlyWarning, stacklevel=3)

    # ----------------------------------------------------------------------------------------
    # Worker

    def _take(self) -> tuple[tuple[int, int | None] | None, float, Boundary | None]:
        """Under the lock: the pending request, else the oldest posted boundary."""
        pair, since = self._pending, self._pending_since
        self._pending = None
        job = self._jobs[0] if pair is None and self._jobs else None
        return pair, since, job

    def _handle_done(self, job: Boundary) -> None:
        try:
            self._handle(job)
        except Exception as e:  # DeviceErrors are handled where they occur: a bug, say
            self._failed(e)
        else:  # on failure the training thread works out what ``then`` would have
            if job.then is not None and not self._closed:
                job.then()
        with self._cond:
            if self._jobs and self._jobs[0] is job:
                self._jobs.popleft()

    def _failed(self, error: Exception) -> None:
        """An op's handling raised: drop its boundary and go observe-only (said once), rather
        than let the worker die with boundaries posted to it."""
        if self._failures == 0:  # the traceback is the bug's report
            _log.error("clock worker on %s: an op's handling raised", self.gpu.name, exc_info=error)
            self.setter.degrade(f"the clock worker failed on {self.gpu.name}: {error!r}")
            self._attention = True
        self._failures += 1

    def _drain(self) -> None:
        """Inline mode: do everything posted so far, in the worker's order."""
        while not self._closed:
            with self._cond:
                pair, since, job = self._take()
            if pair is not None:
                self._apply(pair[0], since, pair[1])
            elif job is None or job.end is None:
                return  # nothing left, or the host is still inside this op: the rest waits
            else:
                self._handle_done(job)

    def _run(self) -> None:
        while not self._closed:
            with self._cond:
                # Idle is said before the queue is looked at: post() appends, then looks at
                # it, so either it sees us idle and wakes us, or we see its boundary.
                self._idle = True
                while self._pending is None and not self._jobs and not self._closed:
                    self._cond.wait(0.05)  # timed: close_nowait() takes no lock to wake us
                self._idle = False
                if self._closed:
                    self._cond.notify_all()
                    return
                pair, since, job = self._take()
                self._busy = True
            try:
                if pair is not None:
                    self._apply(pair[0], since, pair[1])
                elif job is not None:
                    self._handle_done(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _apply(self, freq_mhz: int, since_s: float, mem_freq_mhz: int | None = None) -> None:
        self.setter.apply(freq_mhz, since_s, mem_freq_mhz)
        if self.setter.notice is not None:
            self._attention = True
        if self._threaded:
            with self._cond:
                self._cond.notify_all()  # wait_applied(), also mid-way through a job

    def _wait_event(self, event: DeviceEvent, stamp: bool) -> int | None:
        """Poll until ``event`` completed (or we close); its counter reading."""
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

    def _ended(self, job: Boundary) -> bool:
        end = job.end
        return self._closed or (end is not None and end.query())

    def _wait_end(self, job: Boundary, until_s: float | None) -> bool:
        """Wait for ``job``'s end event, or until device-clock time ``until_s``; True if the
        end event completed."""
        wait: Callable[[float], bool] | None = getattr(job.end, "wait", None)  # SimEvent.wait
        if wait is not None and not self.clock.real_time:
            return wait(math.inf if until_s is None else until_s)
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
        """The last stretch before a planned set call: sleep, then poll (see FINAL_POLL_S)."""
        events = self.events
        assert events is not None
        sleep = self.clock.sleep
        while not self._closed:
            left = until_s - events.timeline_now_s()
            if left <= 0:
                return
            sleep(left - FINAL_POLL_S if left > FINAL_POLL_S and self.clock.real_time else left)

    def _handle(self, job: Boundary) -> None:
        """One op: its start reading, mid-op changes, clock read back, the next op's clocks,
        its end reading and prediction error."""
        request = job.request
        job.report = report = OpReport()
        report.start_mj = self._wait_event(job.start, stamp=self._stamp_ops or request.stamp)
        if request.stamp and not self._closed:
            job.start.device_time_s()  # read here, and kept: not on the training thread
        self._issue_mids(job)
        if self._closed:
            return
        if self._readback is not None and not request.stamp:
            self._read_back(job, self._readback)
        freq, mem = request.freq_next_mhz, request.mem_next_mhz
        if freq is not None and self.setter.wants(freq, mem):
            self._issue_next(job, freq, mem)
            if self._closed:
                return
        self._finish(job)

    def _issue_mids(self, job: Boundary) -> None:
        """Phased op: each later phase's clocks issued a landing time before its boundary;
        once the op ends the rest are skipped (counted); none from an untimed phase on."""
        events, mids, report = self.events, job.request.mids, job.report
        for i, mid in enumerate(mids):
            if mid.at_s is None or events is None:
                return
            if self.setter.wants(mid.freq_mhz, mid.mem_freq_mhz) and not self._issue_mid(job, mid):
                report.mids_missed = len(mids) - i
                return
            report.read_phase = i + 1  # issued, or already at these clocks

    def _issue_mid(self, job: Boundary, mid: MidSwitch) -> bool:
        """One mid-op change; False (nothing issued) when the op ends first."""
        assert mid.at_s is not None
        setter = self.setter
        lead = (setter.landing_s() or 0.0) + setter.extra_lead_s(mid.freq_mhz, mid.mem_freq_mhz)
        if self._wait_end(job, job.start.device_time_s() + mid.at_s - lead) or self._closed:
            return False
        job.report.mids_issued += 1
        self._apply(mid.freq_mhz, self.clock.now(), mid.mem_freq_mhz)
        return True

    def _read_back(self, job: Boundary, gpu: ClockReadbackGPU) -> None:
        """Read the clocks the GPU runs inside ``job``'s op: mid-way when its time is known,
        else as soon as it runs (idle readings retried); not when the op ended first or,
        controlling, no clock of ours is applied."""
        asked, observed = self.setter.applied_mhz, self.observe_only
        read_mem = job.request.mem_next_mhz is not None
        if asked is None and not observed:
            return
        due = self._read_due_s(job)
        if due is not None and self._wait_end(job, due[0]):
            return
        while not self._ended(job):
            try:
                # The reasons are read on both sides of the clock: a clock read in the gap
                # before the op runs (the idle clock) with reasons read once it runs would
                # pass for a clock delivered.
                before = gpu.clock_event_reasons()
                read_mhz, reasons = gpu.current_clock_mhz(), gpu.clock_event_reasons()
                read_mem_mhz = gpu.current_memory_clock_mhz() if read_mem else None
            except DeviceError:
                self._readback = None  # not on this GPU or driver: stop asking
                return
            if self.events is not None and self._ended(job):
                return  # the op may have ended before the read: it says nothing of the op
            if not (before | reasons) & IDLE_REASON or self.events is None:
                report = job.report
                report.read_mhz, report.read_reasons, report.asked_mhz = read_mhz, reasons, asked
                report.observed = observed
                report.read_mem_mhz, report.asked_mem_mhz = read_mem_mhz, self.setter.mem_target_mhz
                return
            if self._idle_wait_over(job, None if due is None else due[1]):
                return

    def _read_due_s(self, job: Boundary) -> tuple[float, float] | None:
        """When to read ``job``'s clock and the last moment to (None: its time is unknown)."""
        expected, events = job.request.expected_s, self.events
        if expected is None or events is None:
            return None
        start = job.start.device_time_s()
        last = start + expected - (self.setter.landing_s() or 0.0) - FINAL_APPROACH_S
        return min(start + 0.5 * expected, last), last

    def _idle_wait_over(self, job: Boundary, last_s: float | None) -> bool:
        """After an idle reading: wait for the op's launch, then a moment; True when the op
        ended or it is too late to read."""
        events = self.events
        assert events is not None
        while job.end is None and not self._closed:  # not launched yet: no read till then
            self.clock.sleep(5 * POLL_S)
        now = events.timeline_now_s()
        return (last_s is not None and now >= last_s) or self._wait_end(job, now + 5 * POLL_S)

    def _issue_next(self, job: Boundary, freq_mhz: int, mem_freq_mhz: int | None = None) -> None:
        """The next op's clocks: at the aim (predicted end plus the learnt offset), else at
        the end event."""
        events, report = self.events, job.report
        until = self._aim_s(job, freq_mhz, mem_freq_mhz)
        report.aim_s = until
        if events is not None:
            report.ready_s = events.timeline_now_s()
        if until is not None and events is not None:
            # Watch the end event until shortly before the aim; then only the clock: a device
            # event query may wait on a lock (the simulator's, held while the host launches).
            if not self._wait_end(job, until - FINAL_APPROACH_S):
                self._settle_until(until)
        else:
            self._wait_end(job, until)
        if self._closed:
            return
        if events is not None:
            report.issue_s = events.timeline_now_s()
        self._apply(freq_mhz, self.clock.now(), mem_freq_mhz)
        if events is not None:
            report.return_s = events.timeline_now_s()

    def _aim_s(self, job: Boundary, freq_mhz: int, mem_freq_mhz: int | None) -> float | None:
        """When to issue the next op's clocks on the device's clock (None: at the op's end)."""
        expected = job.request.expected_s
        if expected is None:
            return None
        setter = self.setter
        offset = setter.issue_offset_s(expected, job.request.gap_s)
        if offset is None:
            return None
        offset -= setter.extra_lead_s(freq_mhz, mem_freq_mhz)
        return job.start.device_time_s() + expected + offset

    def _finish(self, job: Boundary) -> None:
        """Wait for the op's end: its counter reading and prediction error."""
        sleep = self.clock.sleep
        while job.end is None and not self._closed:
            sleep(POLL_S)
        end, expected = job.end, job.request.expected_s
        if end is None:
            return
        job.report.end_mj = self._wait_event(end, stamp=self._stamp_ops)
        if expected and not self._closed:
            actual = end.device_time_s() - job.start.device_time_s()
            self.setter.note_end_error(actual / expected - 1.0)
