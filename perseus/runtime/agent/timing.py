"""The rank agent's two ways of timing ops and clock changes (``docs/timing.md``).

:class:`DeviceTiming` posts an event and a :class:`~perseus.runtime.agent.boundary.Boundary`
to the clock worker at each op boundary (the training thread never waits for the device);
:class:`HostTiming` requests an op's clock as the host enters it and times on the host's clock.
Both are called as ``begin``, ``enter``/``exit`` around op ``j``, ``close`` (iteration end) and
``finish`` (the oldest closed iteration's time and energy).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from perseus.device.base import DeviceEvent, EventSource
from perseus.device.clock import Clock
from perseus.runtime.agent.boundary import Boundary, MidSwitch, OpRequest
from perseus.runtime.agent.controller import FrequencyController
from perseus.runtime.agent.op_timing import OpTimingHistory
from perseus.runtime.agent.rank_plan import OpPhase
from perseus.runtime.agent.readback import (
    ClockDelivery,
    OpReading,
    SharedHolds,
    clock_delivery,
)
from perseus.schedule.actions import Action

__all__ = ["CounterMark", "DeviceTiming", "HostTiming", "OpRow"]

_log = logging.getLogger(__name__)

#: One op record: iteration, index, action, clock, time_s, energy_j, mid clock, start_s, end_s.
OpRow = tuple[int, int, Action, int, float, float, int | None, float | None, float | None]

#: Predicted time from an op's start to the start of its phase: ``(op index, phase) -> time_s``.
MidTimeFn = Callable[[int, int], "float | None"]

#: An iteration's ``(time_s, energy_j, mid-op changes made, missed, clocks as read back)``.
Finished = tuple[float, float, int, int, "ClockDelivery | None"]


class CounterMark:
    """A point on the device's timeline marked without waiting: the worker reads the counter
    as the device passes it and then runs ``then`` (without a worker ``read_mj`` reads it
    now); :meth:`resolve` gives its time and reading.
    """

    __slots__ = ("_controller", "_event", "_mj", "_read_mj", "_resolved", "_stamp")

    def __init__(
        self,
        event: DeviceEvent,
        controller: FrequencyController | None,
        read_mj: Callable[[], int],
        then: Callable[[], None] | None = None,
    ) -> None:
        self._event, self._controller, self._read_mj = event, controller, read_mj
        self._mj = event.energy_mj if event.query() else None
        self._stamp: Boundary | None = None
        if self._mj is None and controller is None:
            self._mj = read_mj()
        elif self._mj is None and controller is not None:
            self._stamp = Boundary(OpRequest(event, None, None, stamp=True), event, then)
            controller.post(self._stamp)
        self._resolved: tuple[float, int] | None = None

    def wait(self) -> None:
        """Wait until the device passed the mark: for the worker's reading, else the event."""
        ctl, stamp = self._controller, self._stamp
        if ctl is not None and stamp is not None and ctl.wait_done(stamp):
            return  # and the boundaries posted before it
        if self._mj is None:  # else the event had completed
            self._event.synchronize()
        if ctl is not None:
            ctl.flush(timeout_s=1.0)  # the boundaries posted before it are handled

    def resolve(self) -> tuple[float, int]:
        """``(device time, counter mJ)`` at the mark (waits if needed), read once: it stays
        valid after the event is recycled."""
        if self._resolved is None:
            self.wait()
            mj = self._mj if self._mj is not None else self._event.energy_mj
            if mj is None and self._stamp is not None:
                mj = self._stamp.report.start_mj
            time_s = self._event.device_time_s()
            self._resolved = time_s, int(self._read_mj() if mj is None else mj)
        return self._resolved


class _Figures(NamedTuple):
    """An iteration's op rows, mid-op changes made and missed, and clocks as read back."""

    rows: list[OpRow]
    mid_switches: int
    mid_switches_missed: int
    delivery: ClockDelivery | None


@dataclass(slots=True)
class _Closed:
    """An iteration ended on the host, figures unread, and the plan it ran. Its figures are
    worked out once, under :attr:`lock`: by the worker at its end, else the training thread."""

    iteration: int
    begin: CounterMark
    jobs: list[Boundary]
    freqs: tuple[int, ...]
    phases: tuple[tuple[OpPhase, ...], ...]
    actions: tuple[Action, ...]
    end: CounterMark = field(init=False)
    figures: _Figures | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Clocks:
    """The plan's per-op phases, as the agent snapped them (shared by both modes)."""

    __slots__ = (
        "actions",
        "controller",
        "freqs",
        "mems",
        "phases",
        "succ",
    )

    def __init__(self, controller: FrequencyController | None) -> None:
        #: The clock worker (None: no GPU control, times and energy only).
        self.controller = controller
        self.phases: tuple[tuple[OpPhase, ...], ...] = ()
        self.freqs: tuple[int, ...] = ()  # each op's first SM clock
        self.mems: tuple[int | None, ...] = ()  # each op's first memory clock
        self.actions: tuple[Action, ...] = ()
        #: Per op, once per plan: the next op's SM clock (None: no change) and memory clock.
        self.succ: tuple[tuple[int | None, int | None], ...] = ()

    def set(self, actions: Sequence[Action], phases: Sequence[tuple[OpPhase, ...]]) -> None:
        self.actions = tuple(actions)
        self.phases = tuple(phases)
        self.freqs = tuple(p[0].freq_mhz for p in self.phases)
        self.mems = tuple(p[0].mem_freq_mhz for p in self.phases)
        # The last op's successor is the next iteration's first op.
        n = len(self.phases)
        succ = []
        for j, p in enumerate(self.phases):
            nxt, nxt_mem = self.freqs[(j + 1) % n], self.mems[(j + 1) % n]
            same = len(p) == 1 and nxt == p[0].freq_mhz and nxt_mem == p[0].mem_freq_mhz
            succ.append((None if same else nxt, nxt_mem))
        self.succ = tuple(succ)


class DeviceTiming(_Clocks):
    """Ops and clock changes on the device's timeline (see the module docstring).

    Args:
        energy_mj: Reads the counter (iteration ends, when events carry no reading).
        stamp_ops: Whether the worker reads the counter at every op boundary.
        recycle: Called as each iteration's figures are read (pooled CUDA events).
    """

    __slots__ = (
        "_begin",
        "_closed",
        "_energy_mj",
        "_events",
        "_mid_time_s",
        "_post",
        "_record_ops",
        "_recycle",
        "_shared",
        "_stamp_ops",
        "history",
        "jobs",
    )

    def __init__(
        self,
        events: EventSource,
        controller: FrequencyController | None,
        energy_mj: Callable[[], int],
        *,
        stamp_ops: bool,
        mid_time_s: MidTimeFn,
        record_ops: Callable[[Iterable[OpRow]], None],
        recycle: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(controller)
        self._events = events
        self._recycle = recycle
        self._energy_mj = energy_mj
        self._stamp_ops = stamp_ops
        self._mid_time_s = mid_time_s
        self._record_ops = record_ops
        self.history = OpTimingHistory()  # what clock changes are timed from
        self.jobs: list[Boundary] = []
        self._begin: CounterMark | None = None
        self._post: Callable[[Boundary], None] | None = None  # where enter() posts (begin())
        self._closed: deque[_Closed] = deque()  # ended on the host, figures not read yet
        self._shared = SharedHolds()  # the held ops iterations repeat, made once

    def begin(self, iteration: int) -> None:
        ctl = self.controller
        if ctl is not None and self.freqs:
            ctl.apply_now(self.freqs[0], self.mems[0])
        self.jobs = []
        self._begin = CounterMark(self._events.record_event(), ctl, self._energy_mj)
        # Observe-only without readback or per-op counter reads, the worker has nothing to do.
        wanted = ctl is not None and (self._stamp_ops or not ctl.observe_only or ctl.reads_back)
        self._post = ctl.post if ctl is not None and wanted else None

    def enter(self, j: int) -> None:
        phases = self.phases[j]
        nxt, nxt_mem = self.succ[j]
        # The op's device time and idle gap after it: the worker aims the change's landing there.
        expected, gap = self.history.predicted(j, self.freqs[j])
        # Phased op: each later phase's clocks at its planned layer boundary.
        mids = (
            ()
            if len(phases) == 1
            else tuple(
                MidSwitch(self._mid_time_s(j, i), p.freq_mhz, p.mem_freq_mhz)
                for i, p in enumerate(phases)
                if i > 0
            )
        )
        job = Boundary(OpRequest(self._events.record_event(), nxt, expected, nxt_mem, mids, gap))
        self.jobs.append(job)
        post = self._post
        if post is not None:
            post(job)

    def switch_shares(self) -> tuple[float, ...]:
        """See :meth:`~perseus.runtime.agent.rank_agent.RankAgent.switch_shares`."""
        jobs = self.jobs
        if not jobs or jobs[-1].end is not None:
            return ()
        mids = jobs[-1].request.mids
        timed = next((i for i, mid in enumerate(mids) if mid.at_s is None), len(mids))
        return tuple(p.start_share for p in self.phases[len(jobs) - 1][1 : timed + 1])

    def mark_end(self) -> None:
        jobs = self.jobs
        if jobs and jobs[-1].end is None:
            jobs[-1].end = self._events.record_event()

    def exit(self, j: int) -> None:
        self.mark_end()

    def close(self, iteration: int) -> CounterMark:
        """The iteration ends on the host: its end, marked on the device; nothing waits."""
        ctl = self.controller
        if ctl is not None and not ctl.threaded:
            # Inline controller (virtual time): its work runs here, while the device runs the
            # iteration; waiting for the end first would apply every change late.
            ctl.flush(timeout_s=1.0)
        begin = self._begin
        assert begin is not None
        closed = _Closed(iteration, begin, self.jobs, self.freqs, self.phases, self.actions)
        closed.end = end = CounterMark(
            self._events.record_event(), ctl, self._energy_mj, lambda: self._work_out(closed)
        )
        self._closed.append(closed)
        self.jobs = []
        return end

    def finish(self) -> Finished:
        """The oldest closed iteration's figures, its ops recorded and learnt from (waits for
        the worker to pass its end)."""
        closed = self._closed.popleft()
        end_s, mj = closed.end.resolve()
        begin_s, begin_mj = closed.begin.resolve()  # read by the worker before the end
        with closed.lock:  # the worker's figures, or (none) worked out here, once
            if closed.figures is None:
                closed.figures = self._figures(closed)
            figures = closed.figures
        self._record_ops(figures.rows)
        if self._recycle is not None:
            self._recycle()
        time_s, energy_j = end_s - begin_s, (mj - begin_mj) / 1000.0
        return time_s, energy_j, figures.mid_switches, figures.mid_switches_missed, figures.delivery

    def _work_out(self, closed: _Closed) -> None:
        """On the worker, at the iteration's end: its figures, off the training thread."""
        with closed.lock:
            if closed.figures is not None:  # a late worker: the training thread took them
                return
            try:
                closed.figures = self._figures(closed)
            except Exception:  # the training thread tries again, and raises
                _log.debug("iteration %d: figures left to the training thread", closed.iteration)

    def _figures(self, closed: _Closed) -> _Figures:
        jobs, freqs, actions, phases = closed.jobs, closed.freqs, closed.actions, closed.phases
        iteration = closed.iteration
        rows: list[OpRow] = []
        readings: list[OpReading] = []
        for j, start_s, end_s in self.history.learn(jobs, freqs, phases):
            job = jobs[j]
            report = job.report
            planned = freqs[j] if j < len(freqs) else 0
            if report.read_mhz is not None and j < len(freqs):
                read = phases[j][report.read_phase]  # the phase that ran when read
                readings.append(
                    OpReading(
                        actions[j],
                        read.freq_mhz,
                        read.freq_mhz if report.observed else report.asked_mhz,
                        report.read_mhz,
                        report.read_reasons,
                        end_s - start_s,
                        read.mem_freq_mhz,
                        report.asked_mem_mhz,
                        report.read_mem_mhz,
                    )
                )
            rows.append(
                (
                    iteration,
                    j,
                    actions[j],
                    planned,
                    end_s - start_s,
                    job.energy_j() or 0.0,
                    job.mid_freq_mhz,
                    start_s,
                    end_s,
                )
            )
        return _Figures(
            rows,
            sum(job.report.mids_issued for job in jobs),
            sum(job.report.mids_missed for job in jobs),
            clock_delivery(readings, self._shared),
        )

    def abort(self) -> None:
        """Forget the abandoned iteration's ops (an open op ends here: the worker waits for
        each posted op's end)."""
        with contextlib.suppress(Exception):  # a device that cannot record one is lost anyway
            self.mark_end()
        self.jobs = []
        self.history.forget_boundary()

    @property
    def last_end_event(self) -> DeviceEvent | None:
        return self.jobs[-1].end if self.jobs else None


class HostTiming(_Clocks):
    """Clocks requested when the host enters an op; times on the host's clock.

    Args:
        energy_mj: Reads the counter around each op (a no-op reader when per-op energy is off).
        energy_iter_mj: Reads the counter at iteration ends.
    """

    __slots__ = (
        "_e_op",
        "_e_step",
        "_energy_iter_mj",
        "_energy_mj",
        "_figures",
        "_now",
        "_record_op",
        "_t_op",
        "_t_step",
        "_warned_two_clock",
        "iteration",
        "rank",
    )

    def __init__(
        self,
        controller: FrequencyController | None,
        clock: Clock,
        energy_mj: Callable[[], int],
        energy_iter_mj: Callable[[], int],
        *,
        record_op: Callable[[OpRow], None],
        rank: int,
    ) -> None:
        super().__init__(controller)
        self._now = clock.now
        self._energy_mj = energy_mj
        self._energy_iter_mj = energy_iter_mj
        self._record_op = record_op
        self.rank = rank
        self.iteration = 0
        self._t_step = 0.0
        self._e_step = 0
        self._t_op = 0.0
        self._e_op = 0
        self._warned_two_clock = False
        self._figures: deque[tuple[float, float]] = deque()

    def begin(self, iteration: int) -> None:
        self.iteration = iteration
        if self.controller is not None and self.freqs:
            self.controller.request(self.freqs[0], self.mems[0])
        self._e_step = self._energy_iter_mj()
        self._t_step = self._now()

    def enter(self, j: int) -> None:
        ctl = self.controller
        if ctl is not None:
            if len(self.phases[j]) > 1 and not self._warned_two_clock:
                self._warned_two_clock = True
                _log.warning(
                    "rank %d: host timing cannot switch clocks mid-op; phased ops run at "
                    "their first clocks (use a GPU with device events)",
                    self.rank,
                )
            ctl.request(self.freqs[j], self.mems[j])
        self._e_op = self._energy_mj()
        self._t_op = self._now()

    def mark_end(self) -> None:
        """Host timing has no device events: a no-op."""

    def exit(self, j: int) -> None:
        t = self._now()
        e = self._energy_mj()
        self._record_op(
            (
                self.iteration,
                j,
                self.actions[j],
                self.freqs[j],
                t - self._t_op,
                (e - self._e_op) / 1000.0,
                None,
                self._t_op,
                t,
            )
        )
        if self.controller is not None and j + 1 < len(self.freqs):
            self.controller.request(self.freqs[j + 1], self.mems[j + 1])

    def close(self, iteration: int) -> None:
        figures = self._now() - self._t_step, (self._energy_iter_mj() - self._e_step) / 1000.0
        self._figures.append(figures)

    def finish(self) -> Finished:
        return (*self._figures.popleft(), 0, 0, None)

    def abort(self) -> None:
        """Nothing to forget."""

    @property
    def last_end_event(self) -> DeviceEvent | None:
        return None
