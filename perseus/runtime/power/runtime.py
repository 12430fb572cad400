"""Follow a plan schedule and a run-time power cap: one boundary hook, the same on every rank.

At every iteration boundary :class:`PowerRuntime` reads the job's cap (rank 0, shared in one
all-reduce) and picks the next iteration's plan from data every rank shares; given a clock it
also waits for each schedule interval with the clocks released, and re-plans when realised
values differ (docs/power.md).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.device.clock import Clock, clock_of
from perseus.errors import ConfigError, InfeasibleError
from perseus.io.power_files import ScheduleFile, read_schedule, schedule_document
from perseus.plan import Frontier
from perseus.runtime.collectives import all_reduce_max, all_reduce_sum, group_rank
from perseus.runtime.power.cap import ACK_KEY, UNHELD_KEY, read_cap
from perseus.runtime.power.follow import CostMeter, IncurredCost, ScheduleClock
from perseus.runtime.power.replan import Realised, Replanner, SignalSource
from perseus.runtime.straggler.switching import DECISIONS_KEPT, raw_store, write_ack
from perseus.solver.power import fastest_under_power

__all__ = ["PowerDecision", "PowerRuntime", "attach_power", "release_clocks"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PowerDecision:
    """One boundary's decision for session iteration ``iteration``.

    Attributes:
        scheduled_index: The plan the schedule (or, without one, the fastest plan) asks for.
        cap_w: The pipeline cap in force (None: no cap).
        point_index: The plan that runs.
        reason: ``"schedule"``, ``"cap"`` (lowered to fit the cap) or ``"cap-unreachable"``.
    """

    iteration: int
    scheduled_index: int
    cap_w: float | None
    point_index: int
    reason: str


class PowerRuntime:
    """Boundary hook that runs a plan schedule and obeys a power cap.

    Args:
        frontier: The deployed frontier (the schedule indexes its points).
        schedule: A schedule file's model, or None to run the fastest plan unless capped.
        store: The job's store to read caps from (None: no run-time cap).
        group: The process group the cap is shared over (default: the world).
        origin_iteration: The session iteration that runs the schedule's iteration 0.
        source: Where the schedule came from, for messages.
        clock: Follow the schedule in time on this clock, from its reading now (None: by
            iteration count only).
        energy_mj: This rank's energy counter (mJ), for the cost actually incurred.
        release: Unlocks this rank's clocks before a wait.
        replanner: Re-plans the rest when realised values differ (needs ``clock``).

    Attributes:
        decisions: The latest :data:`~perseus.runtime.straggler.switching.DECISIONS_KEPT`
            decisions, oldest first.

    Raises:
        PlanError: if the schedule was made for another frontier.
    """

    def __init__(
        self,
        frontier: Frontier,
        *,
        schedule: ScheduleFile | None = None,
        store: Any = None,
        group: Any = None,
        origin_iteration: int = 0,
        source: str = "schedule",
        clock: Clock | None = None,
        energy_mj: Callable[[], int] | None = None,
        release: Callable[[], None] | None = None,
        replanner: Replanner | None = None,
    ) -> None:
        if schedule is not None:
            schedule.check_frontier(frontier, source)
        self.frontier = frontier
        self.schedule = schedule
        self.store = raw_store(store) if store is not None else None
        self.group = group
        self.origin_iteration = origin_iteration
        self.decisions: deque[PowerDecision] = deque(maxlen=DECISIONS_KEPT)
        self.point_index = self.scheduled_index(origin_iteration)
        self._acked: str | None = None
        #: The cap of the last decision (None: no cap), agreed over the group.
        self.cap_w: float | None = None
        self._cap_plan: tuple[float, int, str] | None = None  # (cap_w, index, reason)
        follow = clock is not None and schedule is not None and bool(schedule.intervals)
        self.clock = clock if follow else None
        self.replanner = replanner if follow else None
        self.timer: ScheduleClock | None = None
        self.meter: CostMeter | None = None
        if follow and schedule is not None:
            self.timer = ScheduleClock(schedule)
            self.meter = replanner.meter() if replanner else CostMeter.of_schedule(schedule)
        self._done_before = 0  # schedule iterations run before the schedule in force began
        self.waited_s = 0.0
        self._energy_mj = energy_mj
        self._release = release
        self._origin_s = clock.now() if clock is not None else 0.0
        self._interval: int | None = None
        #: The index of the next iteration to start (None: the one after the stats').
        self.next_iteration: Callable[[], int] | None = None
        self.mark()

    def elapsed_s(self) -> float:
        """Seconds since the signal's start, on the hook's clock."""
        return self.clock.now() - self._origin_s if self.clock is not None else 0.0

    def mark(self) -> None:
        """Note the pipeline's energy counter now, for the cost meter."""
        if self.meter is None or self._energy_mj is None:
            return
        (pipeline_mj,) = all_reduce_sum([float(self._energy_mj())], self.group)
        elapsed = self.elapsed_s()
        if self.replanner is not None:  # the realised values of what the span covers
            self.replanner.observe(elapsed)
        self.meter.mark(elapsed, pipeline_mj / 1000.0)

    def incurred(self) -> IncurredCost | None:
        """The cost incurred so far against the schedule's (a
        :class:`~perseus.runtime.power.replan.ReplanCost` with a re-planner; None unless
        following time with an energy counter)."""
        if self.meter is None or not self._energy_mj or self.schedule is None:
            return None
        if self.replanner is not None:
            return self.replanner.report(self.meter)
        return self.meter.report(self.schedule)

    def wait_for(self, iteration: int) -> float:
        """Release the clocks and sleep until session iteration ``iteration``'s interval opens
        (every rank alike, from the shared clock); returns the wait."""
        waited_s = 0.0
        while self.clock is not None and self.timer is not None:
            # Ranks may read the clock moments apart: agree on the latest reading.
            (elapsed,) = all_reduce_max([self.elapsed_s()], self.group)
            self._replan(iteration, elapsed)
            index = iteration - self.origin_iteration
            wait_s = self.timer.wait_s(index, elapsed)
            k = self.timer.interval_of(index)
            report = self.incurred() if k != self._interval else None
            if report is not None and self._interval is not None:
                _log.info("power schedule: %s", report.describe())
            self._interval = k
            if wait_s <= 0:
                break
            if self.replanner is not None:  # wake when the next interval opens: its value
                to_next_s = self.replanner.next_start_s(elapsed) - elapsed
                wait_s = min(wait_s, to_next_s) if to_next_s > 0 else wait_s
            if self._release is not None and not waited_s:
                self._release()
            self.clock.sleep(wait_s)
            waited_s += wait_s
            self.mark()
        self.waited_s += waited_s
        return waited_s

    def _replan(self, iteration: int, elapsed_s: float) -> None:
        """Follow the re-planner's new schedule of the rest from ``iteration``, if it makes one."""
        if self.replanner is None:
            return
        done = self._done_before + iteration - self.origin_iteration
        new = self.replanner.replan(elapsed_s, done)
        if new is None:
            return
        self.schedule = schedule_document(new, self.frontier)
        self.timer = ScheduleClock(self.schedule)
        self._done_before, self.origin_iteration = done, iteration
        self._interval = None
        _log.info(
            "power schedule: re-planned %d iterations at %.6g s (interval %d's realised value "
            "differs from the forecast): stated cost %.6g",
            new.iterations,
            elapsed_s,
            self.replanner.replans[-1].interval,
            new.cost,
        )

    def scheduled_index(self, iteration: int) -> int:
        """The plan the schedule gives session iteration ``iteration`` (pure)."""
        if self.schedule is None:
            return 0
        return self.schedule.point_at(max(0, iteration - self.origin_iteration))

    def read_cap_w(self, iteration: int | None = None) -> float | None:
        """The pipeline cap every rank agrees on (one all-reduce), or None; rank 0 of the
        group reads the store and acknowledges each new cap or clearing with ``iteration``."""
        value = 0.0
        if self.store is not None and group_rank(self.group) == 0:
            entry = read_cap(self.store)
            token = None
            if entry is not None:
                cap_w, scope, token = entry
                value = cap_w * (self.frontier.job.ranks if scope == "gpu" else 1)
            if token != self._acked:  # None: never acknowledged, or cleared
                self._acked = token
                lowest = min(p.avg_power_w for p in self.frontier.points)
                if token is not None and value < lowest * (1 - 1e-12):  # said before the ack
                    ranks = self.frontier.job.ranks
                    self.store.set(UNHELD_KEY, f"{token} {lowest!r} {ranks}")
                write_ack(self.store, ACK_KEY, token, iteration)
        (reduced,) = all_reduce_max([value], self.group)
        return reduced if reduced > 0 else None

    def decide(self, iteration: int, cap_w: float | None) -> PowerDecision:
        """The plan of session iteration ``iteration`` under ``cap_w`` (pure but for the log)."""
        scheduled = self.scheduled_index(iteration)
        points = self.frontier.points
        index, reason = scheduled, "schedule"
        if cap_w is not None and points[scheduled].avg_power_w > cap_w * (1 + 1e-12):
            index, reason = self._under_cap(cap_w)
            if reason == "cap-unreachable" and (
                not self.decisions or self.decisions[-1].reason != reason
            ):
                _log.warning(
                    "power cap %.1f W is below every plan's average power; running the "
                    "lowest-power plan (%.1f W)",
                    cap_w,
                    points[index].avg_power_w,
                )
        decision = PowerDecision(iteration, scheduled, cap_w, index, reason)
        self.decisions.append(decision)
        self.point_index, self.cap_w = index, cap_w
        return decision

    def follow_frontier(self, frontier: Frontier) -> None:
        """Decide on ``frontier`` (a session's own (re-)profiled plan) from now on; a schedule
        keeps the frontier it indexes."""
        if self.schedule is not None:
            return
        self.frontier, self._cap_plan, self.point_index = frontier, None, 0

    def within_cap(self, frontier: Frontier, point_index: int) -> tuple[Frontier, int]:
        """``(frontier, point_index)`` when that plan fits the cap in force (or none is),
        else this hook's plan under it: another boundary hook's plan (a straggler runtime's
        fastest) must not run above a cap this hook acknowledged."""
        cap_w = self.cap_w
        if cap_w is None or frontier.points[point_index].avg_power_w <= cap_w * (1 + 1e-12):
            return frontier, point_index
        return self.frontier, self.point_index

    def _under_cap(self, cap_w: float) -> tuple[int, str]:
        """The plan under ``cap_w`` and its reason (``"cap"`` or ``"cap-unreachable"``), worked
        out once per cap value: a cap stays for many iterations, each scan is O(points)."""
        if self._cap_plan is None or self._cap_plan[0] != cap_w:
            points = self.frontier.points
            try:
                plan = points.index(fastest_under_power(points, cap_w)), "cap"
            except InfeasibleError:
                lowest = min(range(len(points)), key=lambda i: points[i].avg_power_w)
                plan = lowest, "cap-unreachable"
            self._cap_plan = (cap_w, *plan)
        return self._cap_plan[1], self._cap_plan[2]

    def __call__(self, stats: Any) -> tuple[Frontier, int] | None:
        """The :data:`perseus.runtime.session.BoundaryHook` interface: the plan of the next
        iteration to start (``stats`` may be one iteration late, as a real GPU's are)."""
        if stats.phase != "run":
            return None
        self.mark()
        upcoming = stats.iteration + 1 if self.next_iteration is None else self.next_iteration()
        # Acknowledged as read when the iteration before `upcoming` ended (a real GPU's stats
        # are one iteration older): the cap is in force from `upcoming` on.
        cap_w = self.read_cap_w(upcoming - 1)
        previous = self.point_index
        self.wait_for(upcoming)  # a re-plan on the way changes the plan
        decision = self.decide(upcoming, cap_w)
        if decision.point_index == previous and stats.point_index == previous:
            return None
        return self.frontier, decision.point_index


def attach_power(
    session: Any,
    schedule: str | Path | ScheduleFile | None,
    store: Any,
    *,
    forecast: SignalSource | None = None,
    realised: SignalSource | Realised | None = None,
    objective: str | None = None,
) -> PowerRuntime:
    """Add a :class:`PowerRuntime` to a started ``session`` (a
    :class:`~perseus.runtime.session.RankSession`) as ``session.power`` and deploy the
    schedule's first plan; the schedule's iteration 0 is the session's next iteration.

    Args:
        store: The job's store, for run-time caps, or None.
        forecast: The signal the schedule was made from (a CSV or a
            :class:`~perseus.io.power_files.Signal`), for re-planning.
        realised: The realised values: a signal file on the forecast's intervals, or a
            callable giving interval ``k``'s value per kWh (None: the forecast stands).
        objective: The series of both signals to use (default: the first).

    Raises:
        ConfigError: if the session has no frontier yet (online profiling), or ``realised``
            comes without ``forecast`` or a schedule, or does not match them.
        PlanError: if the schedule was made for another frontier.
    """
    if session.frontier is None:
        raise ConfigError(
            "power_schedule/power_store need a deployed frontier: pass plan= a plan file or a "
            "profile, not OnlineProfile"
        )
    doc = read_schedule(schedule) if isinstance(schedule, (str, Path)) else schedule
    replanner = None
    if realised is not None:
        if forecast is None or doc is None:
            raise ConfigError("realised=: re-planning needs the schedule and its forecast=")
        replanner = Replanner.from_signals(session.frontier, doc, forecast, realised, objective)
    gpu = session.gpu
    runtime = PowerRuntime(
        session.frontier,
        schedule=doc,
        store=store,
        origin_iteration=session.next_iteration,
        source=str(schedule)[:200] if isinstance(schedule, (str, Path)) else "schedule",
        clock=clock_of(gpu, session.options.clock),
        energy_mj=gpu.energy_mj,
        release=lambda: release_clocks(session),
        replanner=replanner,
    )
    session.add_boundary_hook(runtime)  # which hands it the session's next_iteration
    session.power = runtime  # its cap holds over the other hooks' plans
    runtime.wait_for(session.next_iteration)  # the first interval may open later
    # The first plan, of the schedule in force after the wait (a re-plan may come on the way).
    runtime.point_index = runtime.scheduled_index(session.next_iteration)
    if runtime.point_index != session.point_index:
        session.deploy(session.frontier, runtime.point_index)
    return runtime


def release_clocks(session: Any) -> None:
    """Unlock ``session``'s GPU clocks between iterations (unless the agent only observes)."""
    agent = session.agent
    ctl = agent.controller if agent is not None else None
    if ctl is None or ctl.observe_only:
        return
    gpu = session.gpu
    with ctl.device_lock:
        gpu.reset_locked_clock()
        if getattr(gpu, "locked_memory_clock_mhz", lambda: None)() is not None:
            gpu.reset_memory_locked_clock()
    ctl.forget()
