"""The fastest plan under a peak power budget, off the time-energy frontier too.

Peak summed power is not monotone along the frontier, and a plan off the frontier (more energy
at the same time) can have a lower peak: slowing the ops that overlap at the peak instant costs
less time than moving to a slower frontier plan. :func:`fastest_under_peak` searches:

* ``method="exhaustive"`` (exact): every combination of the profile's clocks over the job's
  ops, each priced by the exact evaluator and :func:`~perseus.solver.power.plan_power`.
  O(K^N) plans for N ops of K clocks: only for small jobs (``max_plans``).
* ``method="search"``: greedy peak shaving from up to ``max_bases`` frontier plans faster
  than the frontier's pick (evenly spread, fastest first): while the peak exceeds the budget, lower by one clock the op
  running at the peak instant whose lowering costs the least iteration time. Below every
  shaved plan, the plans of a uniform per-op power level (every op at the highest clock whose
  power fits: what one GPU power limit does). Not exact; never slower than the frontier's
  pick, and the frontier's average-power pick bounds it from below (a plan whose peak is at
  most W averages at most W): :class:`PeakPick` states that gap.
* ``method="auto"``: exhaustive when the job has at most ``max_plans`` plans, else search.

Jobs with two-clock or phased ops (layers per stage, memory clocks) are searched over their
frontier plans only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perseus.errors import InfeasibleError
from perseus.job import PlanningJob
from perseus.plan import PlanPoint
from perseus.schedule.actions import Kind
from perseus.solver.power import fastest_under_power, plan_power, power_timeline

__all__ = ["PeakPick", "fastest_under_peak"]

_KINDS = list(Kind)


@dataclass(frozen=True, slots=True)
class PeakPick:
    """The plan found under a peak budget.

    Attributes:
        point: The plan (with its power figures).
        method: ``"exhaustive"`` (exact) or ``"search"``.
        frontier_time_s: The frontier's fastest plan whose peak fits (None: none fits).
        bound_time_s: A lower bound on any plan's time (exhaustive: the point's own; search:
            the frontier's fastest plan whose *average* power fits, exact up to the
            frontier's gap to the LP bound).
        evaluated: Plans priced.
    """

    point: PlanPoint
    method: str
    frontier_time_s: float | None
    bound_time_s: float
    evaluated: int

    @property
    def gap(self) -> float:
        """``time / bound - 1``: at most this much faster could any plan be."""
        return self.point.time_s / self.bound_time_s - 1


def _clock_table(job: PlanningJob) -> list[list[tuple[int, float]]] | None:
    """Per node, ``(freq_mhz, power_w)`` of its profile clocks, highest first; None when ops
    have memory clocks (a clock is then a pair)."""
    g = job.graph
    out = []
    for s, k in zip(g.stage.tolist(), g.kind.tolist(), strict=True):
        opts = job.profile.op(int(s), _KINDS[int(k)]).options
        if any(o.mem_freq_mhz is not None for o in opts):
            return None
        table = sorted(((o.freq_mhz, o.energy_j / o.time_s) for o in opts), reverse=True)
        out.append(table)
    return out


def _priced(job: PlanningJob, freqs: np.ndarray) -> PlanPoint:
    point = job.point(freqs)
    return point.model_copy(update={"power": plan_power(job, point)})


def _shave(
    job: PlanningJob,
    table: list[list[tuple[int, float]]],
    freqs: np.ndarray,
    budget_w: float,
    best: PlanPoint | None,
) -> tuple[PlanPoint | None, int]:
    """Greedy peak shaving from one plan: while the peak exceeds the budget, lower by one
    clock the op running at the peak instant whose lowering costs the least time (ties: the
    larger power drop). Returns the plan that fits (None: gave up, or no faster than
    ``best``) and the plans priced."""
    freqs = freqs.copy()
    index = [
        next(i for i, (c, _) in enumerate(t) if c == f)
        for f, t in zip(freqs.tolist(), table, strict=True)
    ]
    point = _priced(job, freqs)
    evaluated = 1
    while True:
        if best is not None and point.time_s >= best.time_s:
            return None, evaluated
        timeline = power_timeline(job, point)
        step = int(np.argmax(timeline.power_w))
        if timeline.power_w[step] <= budget_w:
            return point, evaluated
        lo, hi = timeline.times_s[step], timeline.times_s[step + 1]
        ev = job.evaluate(freqs)
        active = np.flatnonzero((ev.start_s < hi) & (ev.end_s > lo) & (ev.end_s > ev.start_s))
        options = []
        for node in active.tolist():
            i = index[node]
            if i + 1 >= len(table[node]):
                continue
            trial = freqs.copy()
            trial[node] = table[node][i + 1][0]
            time_s = job.evaluate(trial).time_s
            evaluated += 1
            drop_w = table[node][i][1] - table[node][i + 1][1]
            options.append((time_s, -drop_w, node))
        if not options:
            return None, evaluated
        _, _, node = min(options)
        index[node] += 1
        freqs[node] = table[node][index[node]][0]
        point = _priced(job, freqs)
        evaluated += 1


def fastest_under_peak(
    job: PlanningJob,
    points: Sequence[PlanPoint],
    budget_w: float,
    *,
    method: Literal["auto", "exhaustive", "search"] = "auto",
    max_plans: int = 100_000,
    max_bases: int = 6,
) -> PeakPick:
    """The fastest plan whose peak summed power is at most ``budget_w`` (see module).

    Args:
        job: The job the frontier ``points`` belong to.
        points: Its frontier points (with power figures or without).
        budget_w: The peak budget, in watts, for the pipeline's summed power.
        method: ``"auto"``, ``"exhaustive"`` or ``"search"``.
        max_plans: Most plans ``"auto"`` enumerates.
        max_bases: Most frontier plans the search shaves from (evenly spread, fastest first).

    Raises:
        InfeasibleError: if no plan found fits (naming the lowest peak seen).
    """
    slack = 1e-12 * max(budget_w, 1.0)
    table = _clock_table(job) if job.layer_split is None else None
    if method == "auto":
        count = math.prod(len(t) for t in table) if table is not None else math.inf
        method = "exhaustive" if count <= max_plans else "search"
    priced = [
        p if p.power is not None else p.model_copy(update={"power": plan_power(job, p)})
        for p in points
    ]
    fits = [p for p in priced if p.power is not None and p.power.peak_power_w <= budget_w + slack]
    frontier_best = min(fits, key=lambda p: (p.time_s, p.energy_j)) if fits else None
    lowest = min(p.power.peak_power_w for p in priced if p.power is not None)
    evaluated = 0
    best = frontier_best
    if method == "exhaustive" and table is not None:
        for combo in itertools.product(*[[f for f, _ in t] for t in table]):
            cand = _priced(job, np.array(combo, dtype=np.int64))
            evaluated += 1
            assert cand.power is not None
            lowest = min(lowest, cand.power.peak_power_w)
            if cand.power.peak_power_w <= budget_w + slack and (
                best is None or (cand.time_s, cand.energy_j) < (best.time_s, best.energy_j)
            ):
                best = cand
    elif method == "search" and table is not None:
        faster = sorted(
            (p for p in priced if best is None or p.time_s < best.time_s), key=lambda p: p.time_s
        )
        # At most max_bases starting plans, evenly spread from the fastest.
        step = max(1, math.ceil(len(faster) / max_bases))
        for base in faster[::step]:
            if best is not None and base.time_s >= best.time_s:
                break
            flat = job.flat(base)
            if not isinstance(flat, np.ndarray) or flat.ndim != 1:
                continue
            shaved, n = _shave(job, table, flat, budget_w + slack, best)
            evaluated += n
            if shaved is not None:
                best = shaved
        if best is None:  # below every shaved plan: the uniform power-limit plans
            for level in sorted({w for t in table for _, w in t}, reverse=True):
                capped = np.array(
                    [next((c for c, w in t if w <= level), t[-1][0]) for t in table],
                    dtype=np.int64,
                )
                cand = _priced(job, capped)
                evaluated += 1
                assert cand.power is not None
                lowest = min(lowest, cand.power.peak_power_w)
                if cand.power.peak_power_w <= budget_w + slack:
                    best = cand
                    break
    if best is None:
        raise InfeasibleError(
            f"no plan found whose peak power is at most {budget_w:.6g} W; the lowest seen is "
            f"{lowest:.6g} W"
        )
    if method == "exhaustive" and table is not None:
        bound = best.time_s
    else:
        try:
            bound = min(best.time_s, fastest_under_power(priced, budget_w).time_s)
        except InfeasibleError:
            bound = best.time_s
    return PeakPick(
        point=best,
        method=method,
        frontier_time_s=None if frontier_best is None else frontier_best.time_s,
        bound_time_s=bound,
        evaluated=evaluated,
    )
