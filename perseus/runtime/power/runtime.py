"""Follow a plan schedule and a run-time power cap: one boundary hook, the same on every rank.

At every iteration boundary :class:`PowerRuntime`:

1. reads the job's power cap from the store (on rank 0 of its group only, so every rank of
   every pipeline sees the same value: it travels in one all-reduce (MAX) over the group);
2. decides the plan of the next iteration from data every rank shares (the iteration index
   and that cap): the schedule's plan for that iteration (``segments`` of a
   :class:`~perseus.io.power_files.ScheduleFile`), or the fastest plan, and, if that plan's
   average power exceeds the cap, the fastest plan under the cap instead (the lowest-power
   plan, with a warning, when none fits);
3. returns it to the session, which deploys it from the next iteration on.

A cap written to the store while iteration ``k`` runs is read at the end of ``k`` and in force
from ``k + 1``: every pipeline runs under a new cap within two iterations of it being set.
Schedule iterations count from ``origin_iteration`` (the session iteration that runs the
schedule's iteration 0). The hook does not pause the job between signal intervals: a launcher
that wants idle gaps reads each interval's ``start_s`` from the schedule file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.errors import ConfigError, InfeasibleError
from perseus.io.power_files import ScheduleFile, read_schedule
from perseus.plan import Frontier
from perseus.runtime.collectives import all_reduce_max, global_rank, is_distributed
from perseus.runtime.power.cap import ACK_KEY, CLEARED, read_cap
from perseus.runtime.straggler.switching import raw_store
from perseus.solver.power import fastest_under_power

__all__ = ["PowerDecision", "PowerRuntime", "attach_power"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PowerDecision:
    """One boundary's decision.

    Attributes:
        iteration: The session iteration the decision is for (the next one).
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


def _group_rank(group: Any) -> int:
    if not is_distributed():
        return 0
    if group is None:
        return global_rank()
    import torch.distributed as dist

    return int(dist.get_rank(group))


class PowerRuntime:
    """Boundary hook that runs a plan schedule and obeys a power cap.

    Args:
        frontier: The deployed frontier (the schedule indexes its points).
        schedule: A schedule file's model (:func:`perseus.io.power_files.read_schedule`), or
            None to run the fastest plan unless a cap says otherwise.
        store: The job's store to read caps from (None: no run-time cap).
        group: The process group the cap is shared over (default: the world, so that every
            pipeline of a data-parallel job moves together).
        origin_iteration: The session iteration that runs the schedule's iteration 0.
        source: Where the schedule came from, for messages.

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
    ) -> None:
        if schedule is not None:
            schedule.check_frontier(frontier, source)
        self.frontier = frontier
        self.schedule = schedule
        self.store = raw_store(store) if store is not None else None
        self.group = group
        self.origin_iteration = origin_iteration
        self.decisions: list[PowerDecision] = []
        self.point_index = self.scheduled_index(origin_iteration)
        self._acked: str | None = None

    def scheduled_index(self, iteration: int) -> int:
        """The plan the schedule gives session iteration ``iteration`` (pure)."""
        if self.schedule is None:
            return 0
        return self.schedule.point_at(max(0, iteration - self.origin_iteration))

    def read_cap_w(self, iteration: int | None = None) -> float | None:
        """The pipeline cap every rank agrees on (one all-reduce), or None.

        Rank 0 of the group reads the store and acknowledges each new cap (and each clearing)
        under :data:`~perseus.runtime.power.cap.ACK_KEY` with ``iteration``.
        """
        value = 0.0
        if self.store is not None and _group_rank(self.group) == 0:
            entry = read_cap(self.store)
            if entry is not None:
                cap_w, scope, token = entry
                value = cap_w * (self.frontier.job.ranks if scope == "gpu" else 1)
                self._acknowledge(token, iteration)
            else:
                self._acknowledge(None, iteration)
        (reduced,) = all_reduce_max([value], self.group)
        return reduced if reduced > 0 else None

    def _acknowledge(self, token: str | None, iteration: int | None) -> None:
        if token == self._acked or self.store is None:
            return
        if token is None and self._acked is None:
            return
        self._acked = token
        when = str(iteration) if iteration is not None else "?"
        self.store.set(ACK_KEY, f"{token if token is not None else CLEARED} {when}")

    def decide(self, iteration: int, cap_w: float | None) -> PowerDecision:
        """The plan of session iteration ``iteration`` under ``cap_w`` (pure but for the log)."""
        scheduled = self.scheduled_index(iteration)
        points = self.frontier.points
        index, reason = scheduled, "schedule"
        if cap_w is not None and points[scheduled].avg_power_w > cap_w * (1 + 1e-12):
            try:
                best = fastest_under_power(points, cap_w)
                index, reason = points.index(best), "cap"
            except InfeasibleError:
                index = min(range(len(points)), key=lambda i: points[i].avg_power_w)
                reason = "cap-unreachable"
                if not self.decisions or self.decisions[-1].reason != reason:
                    _log.warning(
                        "power cap %.1f W is below every plan's average power; running the "
                        "lowest-power plan (%.1f W)",
                        cap_w,
                        points[index].avg_power_w,
                    )
        decision = PowerDecision(iteration, scheduled, cap_w, index, reason)
        self.decisions.append(decision)
        self.point_index = index
        return decision

    def __call__(self, stats: Any) -> tuple[Frontier, int] | None:
        """The :data:`perseus.runtime.session.BoundaryHook` interface."""
        if stats.phase != "run":
            return None
        cap_w = self.read_cap_w(stats.iteration)
        previous = self.point_index
        decision = self.decide(stats.iteration + 1, cap_w)
        if decision.point_index == previous and stats.point_index == previous:
            return None
        return self.frontier, decision.point_index


def attach_power(
    session: Any, schedule: str | Path | ScheduleFile | None, store: Any
) -> PowerRuntime:
    """Add a :class:`PowerRuntime` to a started ``session`` (a
    :class:`~perseus.runtime.session.RankSession`) and deploy the schedule's first plan.

    Its iteration 0 is the session's next iteration.

    Raises:
        ConfigError: if the session has no frontier yet (online profiling).
        PlanError: if the schedule was made for another frontier.
    """
    if session.frontier is None:
        raise ConfigError(
            "power_schedule/power_store need a deployed frontier: pass plan= (or profile=), "
            "not online_profile=True"
        )
    doc = read_schedule(schedule) if isinstance(schedule, (str, Path)) else schedule
    runtime = PowerRuntime(
        session.frontier,
        schedule=doc,
        store=store,
        origin_iteration=session.next_iteration,
        source=str(schedule)[:200] if isinstance(schedule, (str, Path)) else "schedule",
    )
    if runtime.point_index != session.point_index:
        session.deploy(session.frontier, runtime.point_index)
    session.add_boundary_hook(runtime)
    return runtime
