"""The fastest plan under a peak power budget, off the time-energy frontier too.

Peak summed power is not monotone along the frontier, and a plan off it can have a lower
peak. :func:`fastest_under_peak` enumerates every plan of small jobs (``"exhaustive"``,
exact), or shaves the peak greedily from frontier plans and tries uniform per-op power levels
(``"search"``, with the gap to :func:`~perseus.solver.lp_bound.lp_peak_time_bound_s`); jobs
with two-clock or phased ops or memory clocks use their frontier plans only
(``docs/power.md``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perseus.dag.evaluate import evaluate_many, longest_path, node_ops
from perseus.dag.graph import FloatArray, IntArray
from perseus.errors import InfeasibleError
from perseus.job import PlanningJob
from perseus.plan import PlanPoint
from perseus.solver.lp_bound import lp_peak_time_bound_s
from perseus.solver.power import PowerTimeline, plan_power, timeline_of

__all__ = ["PeakPick", "fastest_under_peak"]


@dataclass(frozen=True, slots=True)
class PeakPick:
    """The plan found under a peak budget.

    Attributes:
        point: The plan (with its power figures).
        method: ``"exhaustive"`` (exact) or ``"search"``.
        frontier_time_s: The frontier's fastest plan whose peak fits (None: none fits).
        bound_time_s: A lower bound on any plan's time (exhaustive: the point's own; search:
            the peak LP's).
        evaluated: Plans timed.
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


@dataclass(frozen=True, slots=True)
class _Clocks:
    """Per node, its profile's clocks, highest first: (N, K) tables padded with the last, and
    the clocks per node (``count``)."""

    freq_mhz: IntArray
    time_s: FloatArray
    energy_j: FloatArray
    power_w: FloatArray
    count: IntArray

    @classmethod
    def of(cls, job: PlanningJob) -> _Clocks | None:
        """None when the job has two-clock or phased ops or memory clocks (a clock is then not
        one number)."""
        if job.layer_split is not None:
            return None
        rows = []
        for op in node_ops(job.graph, job.profile):
            opts = op.options
            if any(o.mem_freq_mhz is not None for o in opts):
                return None
            rows.append(sorted(((o.freq_mhz, o.time_s, o.energy_j) for o in opts), reverse=True))
        width = max(len(r) for r in rows)
        table = np.array([r + [r[-1]] * (width - len(r)) for r in rows], dtype=np.float64)
        time_s, energy_j = table[:, :, 1], table[:, :, 2]
        return cls(
            table[:, :, 0].astype(np.int64),
            time_s,
            energy_j,
            energy_j / time_s,
            np.array([len(r) for r in rows], dtype=np.int64),
        )

    def index_of(self, freqs_mhz: IntArray) -> IntArray:
        """Column of each node's clock."""
        out: IntArray = np.argmax(self.freq_mhz == freqs_mhz[:, None], axis=1).astype(np.int64)
        return out

    def freqs(self, index: IntArray) -> IntArray:
        out: IntArray = self.freq_mhz[np.arange(index.size), index]
        return out

    def moved_times_s(
        self, job: PlanningJob, index: IntArray, nodes: IntArray, step: int
    ) -> FloatArray:
        """The makespan of plan ``index`` with each of ``nodes`` in turn ``step`` clocks lower."""
        trial = np.tile(self.time_s[np.arange(index.size), index], (nodes.size, 1))
        trial[np.arange(nodes.size), nodes] = self.time_s[nodes, index[nodes] + step]
        out: FloatArray = longest_path(job.graph, trial)[1].max(axis=1)
        return out


def _priced(job: PlanningJob, freqs: IntArray) -> PlanPoint:
    point = job.point(freqs)
    return point.model_copy(update={"power": plan_power(job, point)})


def _peak_of(
    job: PlanningJob, clocks: _Clocks, index: IntArray
) -> tuple[float, PowerTimeline, FloatArray, FloatArray]:
    """Makespan, power timeline, op starts and ends of the plan ``index``."""
    rows = np.arange(index.size)
    t, e = clocks.time_s[rows, index], clocks.energy_j[rows, index]
    start, end = longest_path(job.graph, t)
    tl = timeline_of(start, end, t, e, job.blocking_power_w, job.graph.num_ranks)
    return float(end.max()), tl, start, end


def _lowering(
    job: PlanningJob,
    clocks: _Clocks,
    index: IntArray,
    lo: float,
    hi: float,
    start: FloatArray,
    end: FloatArray,
) -> tuple[int | None, int]:
    """The op running in ``[lo, hi)`` whose next lower clock costs the least iteration time
    (ties: the larger power drop, then the lower node; None if none can go lower), and the
    plans timed."""
    active = np.flatnonzero((start < hi) & (end > lo) & (end > start) & (index + 1 < clocks.count))
    if not active.size:
        return None, 0
    times = clocks.moved_times_s(job, index, active, 1)
    drop = clocks.power_w[active, index[active]] - clocks.power_w[active, index[active] + 1]
    return int(active[np.lexsort((active, -drop, times))[0]]), int(active.size)


def _shave(
    job: PlanningJob, clocks: _Clocks, index: IntArray, budget_w: float, best_s: float
) -> tuple[IntArray | None, int]:
    """Greedy peak shaving from one plan (:func:`_lowering` while the peak is over budget).
    Returns the plan that fits (None: gave up, or no faster than ``best_s``), plans timed."""
    index = index.copy()
    timed = 0
    while True:
        total_s, tl, start, end = _peak_of(job, clocks, index)
        timed += 1
        if total_s >= best_s:
            return None, timed
        step = int(np.argmax(tl.power_w))
        if tl.power_w[step] <= budget_w:
            return index, timed
        lo, hi = tl.times_s[step], tl.times_s[step + 1]
        node, tried = _lowering(job, clocks, index, lo, hi, start, end)
        timed += tried
        if node is None:
            return None, timed
        index[node] += 1


def _raise_back(
    job: PlanningJob, clocks: _Clocks, index: IntArray, budget_w: float
) -> tuple[IntArray, int]:
    """Hill-climb a plan that fits: raise by one clock the op that shortens the iteration most
    while the peak stays within budget. Returns the plan and the plans timed."""
    index = index.copy()
    rows = np.arange(index.size)
    timed = 0
    while True:
        t = clocks.time_s[rows, index]
        now_s = float(longest_path(job.graph, t)[1].max())
        up = np.flatnonzero(index > 0)
        times = clocks.moved_times_s(job, index, up, -1) if up.size else np.zeros(0)
        timed += 1 + up.size
        for r in np.argsort(times, kind="stable").tolist():
            if times[r] >= now_s * (1 - 1e-12):
                return index, timed
            index[up[r]] -= 1
            timed += 1
            if _peak_of(job, clocks, index)[1].power_w.max() <= budget_w:
                break
            index[up[r]] += 1
        else:
            return index, timed


def _exhaustive(
    job: PlanningJob, clocks: _Clocks, budget_w: float, best: PlanPoint | None
) -> tuple[PlanPoint | None, int, float]:
    """Every plan, tried fastest first (exact): the best, the plans timed, the lowest peak."""
    choices = itertools.product(*[range(int(c)) for c in clocks.count])
    rows = np.arange(clocks.count.size)
    lowest, timed = math.inf, 0
    while batch := list(itertools.islice(choices, 4096)):
        index = np.array(batch, dtype=np.int64)
        t = clocks.time_s[rows, index]
        e = clocks.energy_j[rows, index]
        times, energies = evaluate_many(job.graph, t, e, job.blocking_power_w)
        timed += len(batch)
        for r in np.lexsort((energies, times)).tolist():
            if best is not None and (times[r], energies[r]) >= (best.time_s, best.energy_j):
                break
            _, tl, _, _ = _peak_of(job, clocks, index[r])
            lowest = min(lowest, float(tl.power_w.max()))
            if tl.power_w.max() <= budget_w:
                best = _priced(job, clocks.freqs(index[r]))
                break
    return best, timed, lowest


def _search(
    job: PlanningJob,
    clocks: _Clocks,
    priced: Sequence[PlanPoint],
    budget_w: float,
    best: PlanPoint | None,
    max_bases: int,
) -> tuple[PlanPoint | None, int, float]:
    """Shave from frontier plans faster than ``best``; below every one, a uniform power level."""
    faster = sorted(
        (p for p in priced if best is None or p.time_s < best.time_s), key=lambda p: p.time_s
    )
    step = max(1, math.ceil(len(faster) / max_bases))  # evenly spread, from the fastest
    timed = 0
    for base in faster[::step]:
        if best is not None and base.time_s >= best.time_s:
            break
        flat = job.flat(base)
        if not isinstance(flat, np.ndarray) or flat.ndim != 1:
            continue
        best_s = best.time_s if best is not None else math.inf
        index, n = _shave(job, clocks, clocks.index_of(flat), budget_w, best_s)
        timed += n
        if index is not None:
            index, n = _raise_back(job, clocks, index, budget_w)
            timed += n
            best = _priced(job, clocks.freqs(index))
    if best is not None:
        return best, timed, math.inf
    return _uniform_level(job, clocks, budget_w, timed)


def _uniform_level(
    job: PlanningJob, clocks: _Clocks, budget_w: float, timed: int
) -> tuple[PlanPoint | None, int, float]:
    """The fastest plan of a uniform per-op power level (each op at its highest clock within
    it) whose peak fits, levels from the highest down."""
    lowest = math.inf
    last = clocks.count - 1
    for level in np.unique(clocks.power_w)[::-1].tolist():
        fits = (clocks.power_w <= level) & (np.arange(clocks.power_w.shape[1]) <= last[:, None])
        index = np.where(fits.any(axis=1), np.argmax(fits, axis=1), last)
        _, tl, _, _ = _peak_of(job, clocks, index)
        timed += 1
        lowest = min(lowest, float(tl.power_w.max()))
        if tl.power_w.max() <= budget_w:
            return _priced(job, clocks.freqs(index)), timed, lowest
    return None, timed, lowest


def fastest_under_peak(
    job: PlanningJob,
    points: Sequence[PlanPoint],
    budget_w: float,
    *,
    method: Literal["auto", "exhaustive", "search"] = "auto",
    max_plans: int = 100_000,
    max_bases: int = 6,
    bound_intervals: int = 64,
) -> PeakPick:
    """The fastest plan whose peak summed power is at most ``budget_w`` (see module).

    Args:
        points: ``job``'s frontier points (with power figures or without).
        max_plans: Most plans ``"auto"`` enumerates.
        max_bases: Most frontier plans the search shaves from.
        bound_intervals: Intervals of the search's lower-bound LP (more: tighter, slower).

    Raises:
        InfeasibleError: if no plan found fits (naming the lowest peak seen).
    """
    budget = budget_w + 1e-12 * max(budget_w, 1.0)
    clocks = _Clocks.of(job)
    if method == "auto":
        small = clocks is not None and math.prod(clocks.count.tolist()) <= max_plans
        method = "exhaustive" if small else "search"
    priced, frontier_best = _frontier_pick(job, points, budget)
    best, timed, lowest = frontier_best, 0, math.inf
    if clocks is not None and method == "exhaustive":
        best, timed, lowest = _exhaustive(job, clocks, budget, frontier_best)
    elif clocks is not None:
        best, timed, lowest = _search(job, clocks, priced, budget, frontier_best, max_bases)
    if best is None:
        lowest = min([lowest] + [p.power.peak_power_w for p in priced if p.power is not None])
        raise InfeasibleError(
            f"no plan found whose peak power is at most {budget_w:.6g} W; the lowest seen is "
            f"{lowest:.6g} W"
        )
    exact = method == "exhaustive" and clocks is not None
    return PeakPick(
        point=best,
        method=method,
        frontier_time_s=None if frontier_best is None else frontier_best.time_s,
        bound_time_s=(
            best.time_s
            if exact
            else lp_peak_time_bound_s(job, budget_w, best.time_s, intervals=bound_intervals)
        ),
        evaluated=timed,
    )


def _frontier_pick(
    job: PlanningJob, points: Sequence[PlanPoint], budget_w: float
) -> tuple[list[PlanPoint], PlanPoint | None]:
    """The points with their power figures, and the fastest whose peak fits (or None)."""
    priced = [
        p if p.power is not None else p.model_copy(update={"power": plan_power(job, p)})
        for p in points
    ]
    fits = [p for p in priced if p.power is not None and p.power.peak_power_w <= budget_w]
    return priced, min(fits, key=lambda p: (p.time_s, p.energy_j)) if fits else None
