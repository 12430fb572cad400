"""Many jobs, one power budget: one frontier point per job, least weighted slowdown.

A multiple-choice knapsack: each job's points cost ``weight × slowdown`` and draw their
average power; :func:`plan_fleet` takes hull segments in order of cost per watt saved (the LP
bound), rounds the break segment up, and places the last watts by a dynamic program over the
few moves whose reduced cost can still win (``docs/fleet.md``). Complexity: O(K log K) for K
points, plus O(K' x grid) for the K' points in the dynamic program.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perseus.dag.graph import FloatArray, IntArray
from perseus.errors import ConfigError, InfeasibleError
from perseus.plan import Frontier
from perseus.profile.pareto import convex_front

__all__ = ["FleetAssignment", "FleetJob", "FleetPlan", "fleet_job", "plan_fleet"]

#: The dynamic program's states reach this many deficits below zero and above the deficit.
_REACH = 4
#: Watts of float noise a budget comparison forgives (relative to the budget).
_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class FleetJob:
    """One job's choices, in the job's own terms (all its GPUs together).

    Attributes:
        name: The job's name (unique in a fleet).
        weight: The value of one unit of the job's progress (>= 0).
        points: Index into the job's frontier ``points`` of each choice (ascending time).
        time_s: Iteration time of each choice; ``time_s[0]`` is the job's fastest plan.
        average_power_w: Average power of each choice (every GPU of the job).
        peak_power_w: Peak power of each choice (every GPU of the job).
        fastest_time_s: The time slowdowns are measured against (default: the fastest
            choice; a per-GPU cap may have left the job's fastest plan out).
    """

    name: str
    weight: float
    points: tuple[int, ...]
    time_s: tuple[float, ...]
    average_power_w: tuple[float, ...]
    peak_power_w: tuple[float, ...]
    fastest_time_s: float | None = None

    def __post_init__(self) -> None:
        n = len(self.points)
        if n == 0:
            raise ConfigError(f"job {self.name!r}: no frontier point to choose from")
        if not (len(self.time_s) == len(self.average_power_w) == len(self.peak_power_w) == n):
            raise ConfigError(f"job {self.name!r}: points, times and powers differ in length")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ConfigError(f"job {self.name!r}: weight must be a finite number >= 0")

    def slowdown(self, choice: int) -> float:
        """Choice ``choice``'s slowdown against the job's fastest plan."""
        return self.time_s[choice] / self._fastest_s() - 1.0

    def _fastest_s(self) -> float:
        return self.fastest_time_s if self.fastest_time_s is not None else min(self.time_s)


@dataclass(frozen=True, slots=True)
class FleetAssignment:
    """One job's plan in a fleet plan (``point``: the index into its frontier's points)."""

    name: str
    point: int
    time_s: float
    average_power_w: float
    peak_power_w: float
    slowdown: float


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """A fleet plan: a point per job, its totals and the LP bound it was measured against.

    Attributes:
        jobs: One assignment per job, in the input order.
        budget_w: The total average power budget the plan was made for.
        total_average_power_w: Sum of the jobs' average power (<= ``budget_w``).
        weighted_slowdown: Sum of weight x slowdown (what the plan minimises).
        lp_bound: The convex-hull greedy's (LP) value: no plan does better.
    """

    jobs: tuple[FleetAssignment, ...]
    budget_w: float
    total_average_power_w: float
    weighted_slowdown: float
    lp_bound: float


def fleet_job(
    name: str,
    frontier: Frontier,
    *,
    weight: float = 1.0,
    gpus: int | None = None,
    per_gpu_cap_w: float | None = None,
) -> FleetJob:
    """A job's choices from its frontier: ``gpus / ranks`` pipelines run each plan.

    Args:
        frontier: Its frontier (peak power from its points' power figures, else the average).
        weight: The value of one unit of the job's progress.
        gpus: GPUs of the job, a multiple of the frontier's ranks (default: the ranks).
        per_gpu_cap_w: Leave out plans whose average power per GPU exceeds this.

    Raises:
        ConfigError: ``gpus`` not a positive multiple of the ranks.
        InfeasibleError: no plan under the cap.
    """
    ranks = frontier.job.ranks
    gpus = ranks if gpus is None else gpus
    if gpus < ranks or gpus % ranks:
        raise ConfigError(
            f"job {name!r}: gpus {gpus} is not a positive multiple of its frontier's {ranks} "
            "ranks (one pipeline per replica); fix gpus in the jobs file"
        )
    replicas = gpus // ranks
    keep = [
        i
        for i, p in enumerate(frontier.points)
        if per_gpu_cap_w is None or p.avg_power_w <= per_gpu_cap_w * ranks * (1 + _SLACK)
    ]
    if not keep:
        lowest = min(p.avg_power_w for p in frontier.points) / ranks
        raise InfeasibleError(
            f"job {name!r}: no plan fits `per_gpu_cap_w` {per_gpu_cap_w:g} W; its lowest "
            f"average power per GPU is {lowest:.6g} W"
        )
    pts = [frontier.points[i] for i in keep]
    return FleetJob(
        name=name,
        weight=float(weight),
        points=tuple(keep),
        time_s=tuple(p.time_s for p in pts),
        average_power_w=tuple(replicas * p.avg_power_w for p in pts),
        peak_power_w=tuple(
            replicas * (p.power.peak_power_w if p.power is not None else p.avg_power_w) for p in pts
        ),
        fastest_time_s=frontier.fastest.time_s,
    )


@dataclass(frozen=True, slots=True)
class _Segments:
    """Every job's hull segments, sorted by cost per watt saved (the greedy's order)."""

    job: IntArray
    to_choice: IntArray  # the hull vertex a segment reaches
    saved_w: FloatArray
    added_cost: FloatArray


def _costs(jobs: Sequence[FleetJob]) -> list[FloatArray]:
    """Each job's weight x slowdown per choice."""
    return [j.weight * (np.asarray(j.time_s, np.float64) / j._fastest_s() - 1.0) for j in jobs]


def _start(jobs: Sequence[FleetJob], costs: Sequence[FloatArray]) -> tuple[list[int], _Segments]:
    """Each job's hull start (its fastest cheapest point) and every hull segment."""
    start, seg_job, seg_to, seg_w, seg_c = [], [], [], [], []
    for k, (job, cost) in enumerate(zip(jobs, costs, strict=True)):
        power = np.asarray(job.average_power_w, dtype=np.float64)
        # Cheapest first: power falling, cost rising, cost per watt saved rising.
        hull = convex_front(power, cost)[::-1]
        start.append(int(hull[0]))
        seg_job.append(np.full(hull.size - 1, k, dtype=np.int64))
        seg_to.append(hull[1:])
        seg_w.append(-np.diff(power[hull]))
        seg_c.append(np.diff(cost[hull]))
    saved, added = np.concatenate(seg_w), np.concatenate(seg_c)
    order = np.argsort(added / saved, kind="stable")
    return start, _Segments(
        np.concatenate(seg_job)[order], np.concatenate(seg_to)[order], saved[order], added[order]
    )


def plan_fleet(
    jobs: Sequence[FleetJob],
    budget_w: float,
    *,
    method: Literal["dp", "greedy"] = "dp",
    grid: int = 9000,
) -> FleetPlan:
    """The fleet plan of least weighted slowdown whose total average power fits ``budget_w``.

    Args:
        jobs: The jobs (unique names), e.g. from :func:`fleet_job`.
        method: ``"dp"`` (LP greedy, then the dynamic program over the last watts) or
            ``"greedy"`` (the LP greedy rounded up to whole hull segments).
        grid: Steps of the dynamic program over the watts still to save.

    Returns:
        The plan; ``lp_bound <= weighted_slowdown``.

    Raises:
        ConfigError: a bad budget, method or grid, or repeated job names.
        InfeasibleError: when even every job's lowest-power plan exceeds the budget.
    """
    _check_inputs(jobs, budget_w, method, grid)
    least_w = sum(min(j.average_power_w) for j in jobs)
    if least_w > budget_w * (1 + _SLACK):
        raise InfeasibleError(
            f"no assignment fits {budget_w:.6g} W: the least power that fits is {least_w:.6g} W "
            "(every job on its lowest-power plan)"
        )
    costs = _costs(jobs)
    choice, seg = _start(jobs, costs)
    total_w = sum(j.average_power_w[c] for j, c in zip(jobs, choice, strict=True))
    excess_w = total_w - budget_w
    lp_bound = _total(costs, choice)
    if excess_w <= 0:
        return _result(jobs, costs, choice, budget_w, lp_bound)
    # The greedy: whole segments before the break segment `last`, which is taken in part.
    cum = np.cumsum(seg.saved_w)
    last = min(int(np.searchsorted(cum, excess_w)), seg.saved_w.size - 1)
    for k, to in zip(seg.job[:last], seg.to_choice[:last], strict=True):
        choice[int(k)] = int(to)
    deficit_w = excess_w - (float(cum[last - 1]) if last else 0.0)
    part = deficit_w / float(seg.saved_w[last])
    lp_bound = _total(costs, choice) + part * float(seg.added_cost[last])
    incumbent = list(choice)
    incumbent[int(seg.job[last])] = int(seg.to_choice[last])
    if method == "greedy" or deficit_w <= 0:
        return _result(jobs, costs, incumbent if deficit_w > 0 else choice, budget_w, lp_bound)
    price = float(seg.added_cost[last] / seg.saved_w[last])
    allowed = _total(costs, incumbent) - lp_bound
    better = _cover(jobs, costs, choice, deficit_w, price, allowed, grid)
    if better is not None and _total(costs, better) < _total(costs, incumbent):
        incumbent = better
    return _result(jobs, costs, incumbent, budget_w, lp_bound)


def _check_inputs(jobs: Sequence[FleetJob], budget_w: float, method: str, grid: int) -> None:
    if not (math.isfinite(budget_w) and budget_w > 0):
        raise ConfigError(f"`budget_w` must be a positive number of watts, got {budget_w}")
    if method not in ("dp", "greedy"):
        raise ConfigError(f"`method` must be 'dp' or 'greedy', got {method!r}")
    if not 1 <= grid <= 10**6:
        raise ConfigError(f"`grid` must be 1..1000000 steps, got {grid}")
    if not jobs:
        raise ConfigError("a fleet plan needs at least one job")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        twice = sorted(n for n, times in Counter(names).items() if times > 1)
        raise ConfigError(f"job names must be unique; repeated: {', '.join(twice[:5])}")


def _total(costs: Sequence[FloatArray], choice: Sequence[int]) -> float:
    return float(sum(c[k] for c, k in zip(costs, choice, strict=True)))


def _cover(
    jobs: Sequence[FleetJob],
    costs: Sequence[FloatArray],
    base: Sequence[int],
    deficit_w: float,
    price: float,
    allowed: float,
    grid: int,
) -> list[int] | None:
    """Save at least ``deficit_w`` more watts from ``base`` at least cost: a dynamic program
    over the net watts saved, one move (another point) per job at most.

    The states span ``-4 deficit_w .. 5 deficit_w`` in ``grid`` steps (a job may move back to
    a faster plan while others save more); the top state stands for "at least". Only moves
    within ``allowed`` of the LP optimum by reduced cost (cost plus ``price`` per watt) enter.
    Watts are rounded down to whole steps, so the pick always saves ``deficit_w``.
    """
    step_w = (1 + 2 * _REACH) * deficit_w / grid
    origin = _REACH * grid // (1 + 2 * _REACH)  # the state of zero watts saved
    dp = np.full(grid + 1, np.inf)
    dp[origin] = 0.0
    # Per job that moves: its moves' steps, each state's move plus one (0: none; a byte or two
    # a state, not two int64 arrays: K' x grid of those was 2 GB at 15,000 jobs) and the state
    # the top one came from. A state below the top came from itself less its move's steps.
    picks: list[tuple[int, IntArray, np.ndarray, int]] = []
    for k, (job, cost) in enumerate(zip(jobs, costs, strict=True)):
        power = np.asarray(job.average_power_w, dtype=np.float64)
        value = cost + price * power
        b = base[k]
        units = np.floor((power[b] - power) / step_w).astype(np.int64)
        moves = np.flatnonzero((value - value.min() <= allowed) & (units != 0))
        if moves.size == 0:
            continue
        new = dp.copy()
        src = np.zeros(grid + 1, dtype=np.min_scalar_type(len(units)))
        top_from = grid
        for i in moves:
            u = int(units[i])
            if abs(u) > grid:
                continue
            added = float(cost[i] - cost[b])
            lo, hi = max(0, u), min(grid, grid + u)  # targets reached without saturating
            cand = dp[lo - u : hi - u] + added
            better = cand < new[lo:hi]
            new[lo:hi][better] = cand[better]
            src[lo:hi][better] = i + 1
            if u > 0:  # the top state: "at least", from any state within u of it
                j = int(np.argmin(dp[grid - u :])) + grid - u
                if dp[j] + added < new[grid]:
                    new[grid], src[grid], top_from = dp[j] + added, i + 1, j
        picks.append((k, units, src, top_from))
        dp = new
    need = origin + math.ceil(deficit_w / step_w - 1e-9)
    if need > grid or not np.isfinite(dp[need:]).any():
        return None
    state = int(np.argmin(dp[need:])) + need
    out = list(base)
    for k, units, src, top_from in reversed(picks):
        move = int(src[state]) - 1
        if move >= 0:
            out[k] = move
            state = top_from if state == grid else state - int(units[move])
    return out


def _result(
    jobs: Sequence[FleetJob],
    costs: Sequence[FloatArray],
    choice: Sequence[int],
    budget_w: float,
    lp_bound: float,
) -> FleetPlan:
    out = tuple(
        FleetAssignment(
            name=j.name,
            point=j.points[c],
            time_s=j.time_s[c],
            average_power_w=j.average_power_w[c],
            peak_power_w=j.peak_power_w[c],
            slowdown=j.slowdown(c),
        )
        for j, c in zip(jobs, choice, strict=True)
    )
    return FleetPlan(
        jobs=out,
        budget_w=float(budget_w),
        total_average_power_w=float(sum(a.average_power_w for a in out)),
        weighted_slowdown=_total(costs, choice),
        lp_bound=min(lp_bound, _total(costs, choice)),
    )
