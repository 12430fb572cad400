"""Follow a plan schedule in time: wait for each interval, and price what the job really drew.

:class:`ScheduleClock` says how long to wait before an iteration's interval opens;
:class:`CostMeter` prices the energy the pipeline's GPUs drew by the interval it was drawn in,
against what the schedule stated. Times are seconds from the signal's start on the clock the
job's device runs on.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from perseus.dag.graph import FloatArray
from perseus.io.power_files import ScheduleFile, ScheduleIntervalRecord
from perseus.runtime.profiling.energy_attribution import _overlaps
from perseus.solver.power_schedule import J_PER_KWH

__all__ = ["SPANS_KEPT", "CostMeter", "IncurredCost", "ScheduleClock"]

#: How many of the latest spans a :class:`CostMeter` keeps (a run of weeks marks every
#: iteration; the totals cover every span).
SPANS_KEPT = 10_000


class ScheduleClock:
    """When each iteration of a schedule may start (pure)."""

    def __init__(self, schedule: ScheduleFile) -> None:
        self.intervals = schedule.intervals

    def interval_of(self, iteration: int) -> int | None:
        """The index of the interval that runs schedule iteration ``iteration`` (None past it)."""
        k = bisect.bisect_right(self.intervals, iteration, key=lambda iv: iv.first_iteration) - 1
        if k < 0:
            return None
        iv = self.intervals[k]
        done = iv.first_iteration + sum(p.iterations for p in iv.plans)
        return k if iteration < done else None

    def wait_s(self, iteration: int, elapsed_s: float) -> float:
        """How long to wait at ``elapsed_s`` before schedule iteration ``iteration`` (0 when its
        interval is open, or past the schedule)."""
        k = self.interval_of(iteration)
        if k is None:
            return 0.0
        return max(0.0, self.intervals[k].start_s - elapsed_s)


@dataclass(frozen=True, slots=True)
class IncurredCost:
    """What the job drew and paid, against the schedule, up to ``elapsed_s``.

    Attributes:
        incurred: Measured energy x the interval's value, inside the schedule's intervals.
        scheduled: The schedule's cost of the same time (iterations and idle GPUs).
        outside_j: Measured energy drawn outside them (not priced: the file lacks values).
        scheduled_outside_j: The schedule's idle energy for that time.
    """

    elapsed_s: float
    incurred: float
    scheduled: float
    outside_j: float
    scheduled_outside_j: float

    @property
    def error(self) -> float:
        """``incurred / scheduled - 1`` (0 when nothing was scheduled yet)."""
        return self.incurred / self.scheduled - 1 if self.scheduled else 0.0

    def describe(self) -> str:
        return (
            f"incurred {self.incurred:.6g} against the schedule's {self.scheduled:.6g} "
            f"({100 * self.error:+.2f} %) in its intervals up to {self.elapsed_s:.6g} s; "
            f"{self.outside_j / J_PER_KWH:.6g} kWh drawn waiting outside them (scheduled "
            f"{self.scheduled_outside_j / J_PER_KWH:.6g} kWh)"
        )


@dataclass(slots=True)
class CostMeter:
    """Prices measured energy by the interval it was drawn in.

    :meth:`mark` takes the pipeline's energy counter (J) at moments between which power is
    about constant; a span's energy is spread over the intervals it overlaps in proportion to
    time and priced at their ``values`` (per kWh) as they are when it is added.

    Attributes:
        spans: The latest :data:`SPANS_KEPT` ``(start_s, end_s, drawn_j)`` added, oldest first.
        incurred: Energy x value so far (kWh x value), inside the intervals.
        outside_j: Energy drawn outside them.
    """

    starts_s: FloatArray
    ends_s: FloatArray
    values: FloatArray
    spans: deque[tuple[float, float, float]] = field(
        default_factory=lambda: deque(maxlen=SPANS_KEPT)
    )
    incurred: float = 0.0
    outside_j: float = 0.0
    _last: tuple[float, float] | None = None
    _first_s: float | None = None  # the first span's start
    _ordered: bool = field(default=False, init=False, repr=False, compare=False)
    #: :meth:`report`'s walk: (schedule, intervals summed whole, their cost, their time, at).
    _walk: tuple[ScheduleFile, int, float, float, float] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Intervals in time order, none overlapping the next (a schedule's, a signal's): a
        # span's are found by bisection, not priced against every interval (a year of minutes).
        starts, ends = self.starts_s, self.ends_s
        self._ordered = bool(np.all(starts <= ends) and np.all(ends[:-1] <= starts[1:]))

    @classmethod
    def of_schedule(cls, schedule: ScheduleFile) -> CostMeter:
        """Priced by the intervals of ``schedule`` that run iterations."""
        ivs = schedule.intervals
        return cls(
            np.array([iv.start_s for iv in ivs], dtype=np.float64),
            np.array([iv.end_s for iv in ivs], dtype=np.float64),
            np.array([iv.value for iv in ivs], dtype=np.float64),
        )

    @property
    def elapsed_s(self) -> float:
        """The time of the last mark (0 before any)."""
        return self._last[0] if self._last is not None else 0.0

    def mark(self, elapsed_s: float, energy_j: float) -> None:
        """The pipeline's energy counter ``energy_j`` at ``elapsed_s``."""
        if self._last is not None:
            self.add(self._last[0], elapsed_s, energy_j - self._last[1])
        self._last = (elapsed_s, energy_j)

    def add(self, start_s: float, end_s: float, drawn_j: float) -> None:
        """``drawn_j`` joules drawn evenly over ``[start_s, end_s)``."""
        span_s = end_s - start_s
        if not span_s > 0:
            return
        span = np.array([start_s]), np.array([end_s])
        near, _, overlap = _overlaps(self.starts_s, self.ends_s, *span, self._ordered)
        self.incurred += float(self.values[near] @ overlap) * drawn_j / span_s / J_PER_KWH
        self.outside_j += drawn_j * max(0.0, span_s - float(overlap.sum())) / span_s
        self.spans.append((start_s, end_s, drawn_j))
        if self._first_s is None:
            self._first_s = start_s

    def report(self, schedule: ScheduleFile) -> IncurredCost:
        """The cost so far against ``schedule``'s for the same time (the intervals passed
        whole are summed once over the run, not at every report: one each interval change)."""
        now = self.elapsed_s
        idle_w = schedule.idle_power_w
        ivs = schedule.intervals
        walk = self._walk
        if walk is None or walk[0] is not schedule or walk[4] > now:
            walk = (schedule, 0, 0.0, 0.0, now)
        _, first, scheduled, inside_s, _ = walk
        self._walk = (schedule, first, scheduled, inside_s, now)
        for k in range(first, len(ivs)):
            iv = ivs[k]
            if iv.start_s >= now:
                break
            cost, passed = _scheduled(iv, now, idle_w)
            scheduled += cost
            inside_s += passed
            if k == first and iv.end_s <= now:  # passed whole: the same from now on
                first += 1
                self._walk = (schedule, first, scheduled, inside_s, now)
        start = self._first_s if self._first_s is not None else now
        outside_s = max(0.0, now - start - inside_s)
        return IncurredCost(now, self.incurred, scheduled, self.outside_j, idle_w * outside_s)


def _scheduled(iv: ScheduleIntervalRecord, now_s: float, idle_w: float) -> tuple[float, float]:
    """A schedule interval's stated cost up to ``now_s`` (iterations and idle GPUs) and the
    time of it passed (it started before ``now_s``)."""
    passed = min(now_s, iv.end_s) - iv.start_s
    idle_s = max(0.0, passed - iv.busy_s)
    return iv.value * (iv.energy_j + idle_w * idle_s) / J_PER_KWH, passed
