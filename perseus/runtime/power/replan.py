"""Re-plan the rest of a schedule when an interval's realised value differs from its forecast.

:class:`Replanner` reads each interval's realised value when it opens and, when it differs,
re-solves what is left with :func:`~perseus.solver.power_schedule.schedule_plans` (realised
values so far, the forecast after). Every rank decides alike from the clock reading the ranks
agree on, so the realised values must be the same on every rank.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perseus.dag.graph import FloatArray
from perseus.errors import ConfigError, InfeasibleError
from perseus.io.power_files import ScheduleFile, Signal, read_signal
from perseus.plan import Frontier
from perseus.runtime.power.follow import CostMeter, IncurredCost
from perseus.solver.power_schedule import J_PER_KWH, MAX_SIGNAL_VALUE, PowerSchedule, schedule_plans

__all__ = ["Realised", "Replan", "ReplanCost", "Replanner"]

_log = logging.getLogger(__name__)

#: The realised value (per kWh) of signal interval ``k``, or None: the forecast stands.
Realised = Callable[[int], float | None]
SignalSource = str | os.PathLike[str] | Signal


@dataclass(frozen=True, slots=True)
class Replan:
    """One re-plan at ``at_s`` (from the signal's start), after ``done`` iterations.

    Attributes:
        interval: The signal interval whose realised value differed.
        cost: The new schedule's stated cost of what is left, idle GPUs included.
    """

    at_s: float
    interval: int
    done: int
    cost: float


@dataclass(frozen=True, slots=True)
class ReplanCost(IncurredCost):
    """The cost incurred up to ``elapsed_s`` against the plans followed (``scheduled``) and the
    original, all at the realised values (``outside_j``: drawn after the deadline).

    Attributes:
        original: The original schedule's stated cost of the same time (at the forecast).
        original_at_realised: What sticking to the original schedule would have cost.
        replans: How many re-plans ran.
    """

    original: float = 0.0
    original_at_realised: float = 0.0
    replans: int = 0

    def describe(self) -> str:
        return (
            f"incurred {self.incurred:.6g} against the re-planned schedule's {self.scheduled:.6g} "
            f"({100 * self.error:+.2f} %) and the original's {self.original:.6g} (at the "
            f"realised values {self.original_at_realised:.6g}) up to {self.elapsed_s:.6g} s; "
            f"{self.replans} re-plans"
        )


def _series(source: SignalSource, objective: str | None) -> tuple[FloatArray, FloatArray]:
    signal = source if isinstance(source, Signal) else read_signal(source)
    return signal.starts_s, signal.pick(objective).values_per_kwh


def _same(mine: PowerSchedule, doc: ScheduleFile) -> bool:
    """Whether ``doc`` runs ``mine``'s plans, as many iterations in the same intervals."""
    used = mine.used()
    ours = zip(mine.starts_s[used].tolist(), mine.interval_iterations[used].tolist(), strict=True)
    theirs = [(iv.start_s, sum(p.iterations for p in iv.plans)) for iv in doc.intervals]
    return (
        mine.segments() == tuple(tuple(s) for s in doc.segments)
        and used.size == len(theirs)
        and all(
            abs(a - b) <= 1e-9 * max(1.0, b) and n == m
            for (a, n), (b, m) in zip(ours, theirs, strict=False)
        )
    )


class Replanner:
    """The cached frontier, the forecast, the realised values as they come, the re-plans.

    Args:
        frontier: The deployed frontier (the schedule indexes its points).
        schedule: The schedule being followed, made from ``starts_s``/``forecast``.
        starts_s: The forecast signal's interval starts (seconds, 0 first).
        forecast: Its values per kWh.
        realised: The realised value of each interval, read once when it opens.

    Raises:
        ConfigError: if ``schedule`` is not the schedule of this forecast.
    """

    def __init__(
        self,
        frontier: Frontier,
        schedule: ScheduleFile,
        starts_s: FloatArray,
        forecast: FloatArray,
        realised: Realised,
    ) -> None:
        self.points = frontier.points
        self.original = schedule_plans(
            self.points,
            starts_s,
            forecast,
            iterations=schedule.iterations,
            deadline_s=schedule.deadline_s,
            idle_power_w=schedule.idle_power_w,
        )
        if not _same(self.original, schedule):
            raise ConfigError(
                "forecast: the schedule was not made from this signal (its plans differ from "
                "the forecast's optimum); pass the signal file `perseus plan schedule` read"
            )
        self.starts_s = self.original.starts_s
        self.ends_s = self.original.ends_s
        self.forecast = np.asarray(forecast, dtype=np.float64)[: self.starts_s.size].copy()
        self.values = self.forecast.copy()
        self._realised = realised
        self._known = 0  # values[:_known] were read
        self._checked = 0  # intervals [0, _checked) were checked for a re-plan
        #: ``(from_s, schedule)`` of each plan followed, the original first.
        self.pieces: list[tuple[float, PowerSchedule]] = [(0.0, self.original)]
        self.replans: list[Replan] = []

    @classmethod
    def from_signals(
        cls,
        frontier: Frontier,
        schedule: ScheduleFile,
        forecast: SignalSource,
        realised: SignalSource | Realised,
        objective: str | None = None,
    ) -> Replanner:
        """From a forecast signal and a realised one (a file with the same starts, or a
        callable), each the ``objective`` series (default: the first).

        Raises:
            ConfigError: for a bad file, or a realised file whose starts differ.
        """
        starts, values = _series(forecast, objective)
        if callable(realised):
            return cls(frontier, schedule, starts, values, realised)
        r_starts, r_values = _series(realised, objective)
        if r_starts.shape != starts.shape or not np.allclose(r_starts, starts, rtol=0, atol=1e-6):
            name = realised if not isinstance(realised, Signal) else "realised signal"
            raise ConfigError(
                f"{str(name)[:200]}: its rows start at other times than the forecast's; give "
                "the realised values on the forecast's intervals"
            )
        return cls(frontier, schedule, starts, values, lambda k: float(r_values[k]))

    def interval_at(self, elapsed_s: float) -> int:
        """The signal interval holding ``elapsed_s``."""
        k = int(np.searchsorted(self.starts_s, elapsed_s + 1e-9, side="right")) - 1
        return max(0, min(k, self.starts_s.size - 1))

    def next_start_s(self, elapsed_s: float) -> float:
        """The next interval's start after ``elapsed_s`` (the deadline after the last)."""
        k = self.interval_at(elapsed_s) + 1
        return float(self.starts_s[k]) if k < self.starts_s.size else float(self.ends_s[-1])

    def observe(self, elapsed_s: float) -> None:
        """Read the realised value of every interval opened by ``elapsed_s``."""
        last = self.interval_at(elapsed_s)
        while self._known <= last:
            k = self._known
            value = self._realised(k)
            if value is not None:
                if not abs(value) <= MAX_SIGNAL_VALUE:
                    raise ConfigError(
                        f"realised value of interval {k}: {value!r} is not a finite number "
                        f"within ±{MAX_SIGNAL_VALUE:g} per kWh"
                    )
                self.values[k] = value
            self._known += 1

    def replan(self, elapsed_s: float, done: int) -> PowerSchedule | None:
        """The new schedule of the rest at ``elapsed_s`` (the same on every rank) after ``done``
        iterations, when an interval opened since the last call has a realised value other
        than its forecast; else None (also when nothing is left or the rest no longer fits)."""
        self.observe(elapsed_s)
        k = self.interval_at(elapsed_s)
        opened = slice(self._checked, k + 1)
        self._checked = max(self._checked, k + 1)
        left = self.original.iterations - done
        if not (self.values[opened] != self.forecast[opened]).any() or left <= 0:
            return None
        from_s = max(elapsed_s, float(self.starts_s[k]))  # a reading a hair before k opened
        if from_s >= self.original.deadline_s:
            return None
        try:
            new = schedule_plans(
                self.points,
                self.starts_s,
                self.values,
                iterations=left,
                deadline_s=self.original.deadline_s,
                idle_power_w=self.original.idle_power_w,
                from_s=from_s,
            )
        except InfeasibleError as e:
            _log.warning("re-plan at %.6g s skipped, the schedule in force stays: %s", elapsed_s, e)
            return None
        self.pieces.append((from_s, new))
        self.replans.append(Replan(from_s, k, done, new.cost))
        return new

    def _cost(self, schedule: PowerSchedule, values: FloatArray, a_s: float, b_s: float) -> float:
        first = int(np.searchsorted(self.starts_s, schedule.starts_s[0], side="right")) - 1
        v = values[first : first + schedule.starts_s.size]
        return float(v @ schedule.energy_between(a_s, b_s)) / J_PER_KWH

    def report(self, meter: CostMeter) -> ReplanCost:
        """The cost ``meter`` measured up to its last mark against the plans followed and the
        original schedule."""
        now = meter.elapsed_s
        ends = [s for s, _ in self.pieces[1:]] + [math.inf]
        stated = sum(
            self._cost(piece, self.values, from_s, min(end_s, now))
            for (from_s, piece), end_s in zip(self.pieces, ends, strict=True)
        )
        return ReplanCost(
            elapsed_s=now,
            incurred=meter.incurred,
            scheduled=stated,
            outside_j=meter.outside_j,
            scheduled_outside_j=0.0,
            original=self._cost(self.original, self.forecast, 0.0, now),
            original_at_realised=self._cost(self.original, self.values, 0.0, now),
            replans=len(self.replans),
        )

    def meter(self) -> CostMeter:
        """A meter priced at this signal's values as they are realised."""
        return CostMeter(self.starts_s, self.ends_s, self.values)
