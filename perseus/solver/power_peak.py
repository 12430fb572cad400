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


@dataclass(slots=True)
class _Search:
    """One search under a peak budget: the job, its clocks, the budget (slack included), the
    plans timed so far and the lowest peak seen by :meth:`exhaustive` and :meth:`uniform_level`."""

    job: PlanningJob
    clocks: _Clocks
    budget_w: float
    timed: int = 0
    lowest: float = math.inf

    def point(self, index: IntArray) -> PlanPoint:
        point = self.job.point(self.clocks.freqs(index))
        return point.model_copy(update={"power": plan_power(self.job, point)})

    def peak_of(self, index: IntArray) -> tuple[float, PowerTimeline, FloatArray, FloatArray]:
        """Makespan, power timeline, op starts and ends of the plan ``index``."""
        job, rows = self.job, np.arange(index.size)
        t, e = self.clocks.time_s[rows, index], self.clocks.energy_j[rows, index]
        start, end = longest_path(job.graph, t)
        tl = timeline_of(start, end, t, e, job.blocking_power_w, job.graph.num_ranks)
        return float(end.max()), tl, start, end

    def lowering(
        self, index: IntArray, lo: float, hi: float, start: FloatArray, end: FloatArray
    ) -> int | None:
        """The op running in ``[lo, hi)`` whose next lower clock costs the least iteration time
        (ties: the larger power drop, then the lower node; None if none can go lower)."""
        c = self.clocks
        active = np.flatnonzero((start < hi) & (end > lo) & (end > start) & (index + 1 < c.count))
        if not active.size:
            return None
        times = c.moved_times_s(self.job, index, active, 1)
        self.timed += int(active.size)
        drop = c.power_w[active, index[active]] - c.power_w[active, index[active] + 1]
        return int(active[np.lexsort((active, -drop, times))[0]])

    def shave(self, index: IntArray, best_s: float) -> IntArray | None:
        """Greedy peak shaving from one plan (:meth:`lowering` while the peak is over budget):
        the plan that fits (None: gave up, or no faster than ``best_s``)."""
        index = index.copy()
        while True:
            total_s, tl, start, end = self.peak_of(index)
            self.timed += 1
            if total_s >= best_s:
                return None
            step = int(np.argmax(tl.power_w))
            if tl.power_w[step] <= self.budget_w:
                return index
            node = self.lowering(index, tl.times_s[step], tl.times_s[step + 1], start, end)
            if node is None:
                return None
            index[node] += 1

    def raise_back(self, index: IntArray) -> IntArray:
        """Hill-climb a plan that fits: raise by one clock the op that shortens the iteration
        most while the peak stays within budget."""
        index = index.copy()
        rows = np.arange(index.size)
        while True:
            now_s = float(longest_path(self.job.graph, self.clocks.time_s[rows, index])[1].max())
            up = np.flatnonzero(index > 0)
            times = self.clocks.moved_times_s(self.job, index, up, -1) if up.size else np.zeros(0)
            self.timed += 1 + up.size
            for r in np.argsort(times, kind="stable").tolist():
                if times[r] >= now_s * (1 - 1e-12):
                    return index
                index[up[r]] -= 1
                self.timed += 1
                if self.peak_of(index)[1].power_w.max() <= self.budget_w:
                    break
                index[up[r]] += 1
            else:
                return index

    def exhaustive(self, best: PlanPoint | None) -> PlanPoint | None:
        """Every plan, tried fastest first (exact): the best."""
        c = self.clocks
        choices = itertools.product(*[range(int(n)) for n in c.count])
        rows = np.arange(c.count.size)
        while batch := list(itertools.islice(choices, 4096)):
            index = np.array(batch, dtype=np.int64)
            t, e = c.time_s[rows, index], c.energy_j[rows, index]
            times, energies = evaluate_many(self.job.graph, t, e, self.job.blocking_power_w)
            self.timed += len(batch)
            for r in np.lexsort((energies, times)).tolist():
                if best is not None and (times[r], energies[r]) >= (best.time_s, best.energy_j):
                    break
                if self._fits(index[r]):
                    best = self.point(index[r])
                    break
        return best

    def _fits(self, index: IntArray) -> bool:
        """Whether the plan's peak is within budget (the lowest peak seen kept)."""
        peak = self.peak_of(index)[1].power_w.max()
        self.lowest = min(self.lowest, float(peak))
        return bool(peak <= self.budget_w)

    def search(
        self, priced: Sequence[PlanPoint], best: PlanPoint | None, max_bases: int
    ) -> PlanPoint | None:
        """Shave from frontier plans faster than ``best``; below every one, a uniform power
        level."""
        faster = sorted(
            (p for p in priced if best is None or p.time_s < best.time_s), key=lambda p: p.time_s
        )
        step = max(1, math.ceil(len(faster) / max_bases))  # evenly spread, from the fastest
        for base in faster[::step]:
            if best is not None and base.time_s >= best.time_s:
                break
            flat = self.job.flat(base)
            if not isinstance(flat, np.ndarray) or flat.ndim != 1:
                continue
            best_s = best.time_s if best is not None else math.inf
            index = self.shave(self.clocks.index_of(flat), best_s)
            if index is not None:
                best = self.point(self.raise_back(index))
        return best if best is not None else self.uniform_level()

    def uniform_level(self) -> PlanPoint | None:
        """The fastest plan of a uniform per-op power level (each op at its highest clock
        within it) whose peak fits, levels from the highest down."""
        c = self.clocks
        last = c.count - 1
        for level in np.unique(c.power_w)[::-1].tolist():
            fits = (c.power_w <= level) & (np.arange(c.power_w.shape[1]) <= last[:, None])
            index = np.where(fits.any(axis=1), np.argmax(fits, axis=1), last)
            self.timed += 1
            if self._fits(index):
                return self.point(index)
        return None


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
    priced, best = _frontier_pick(job, points, budget)
    frontier_time_s = None if best is None else best.time_s
    found = _Search(job, clocks, budget) if clocks is not None else None
    exact = found is not None and method == "exhaustive"
    if found is not None:
        best = found.exhaustive(best) if exact else found.search(priced, best, max_bases)
    if best is None:
        lowest = min(
            [found.lowest if found is not None else math.inf]
            + [p.power.peak_power_w for p in priced if p.power is not None]
        )
        raise InfeasibleError(
            f"no plan found whose peak power is at most {budget_w:.6g} W; the lowest seen is "
            f"{lowest:.6g} W"
        )
    return PeakPick(
        point=best,
        method=method,
        frontier_time_s=frontier_time_s,
        bound_time_s=(
            best.time_s
            if exact
            else lp_peak_time_bound_s(job, budget_w, best.time_s, intervals=bound_intervals)
        ),
        evaluated=0 if found is None else found.timed,
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
