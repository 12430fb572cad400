"""Trace the time–energy frontier of a pipeline iteration with iterative min cuts.

The walk (Phillips–Dessouky family, as in lowtime) shortens the cheapest plan of the convex
relaxation (:mod:`perseus.solver.cost_model`) by min cuts with exact step lengths, compiled
(:mod:`perseus.solver.compiled`); the fractional plans it passes are rounded to real plans,
reclaimed, joined by the baselines and a local search (:mod:`perseus.solver.pareto_search`),
evaluated exactly and Pareto-filtered; long jobs are folded (:mod:`perseus.solver.fold`).
How and why: ``docs/planning.md``. Complexity: O(B·(N + E)) in practice for B breakpoints
(2–30 per op), plus O(N·W) and one reclaim and exact evaluation per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from perseus.dag.evaluate import PlanArg, evaluate_many, evaluations, op_costs
from perseus.dag.graph import FloatArray, IntArray
from perseus.errors import ConfigError
from perseus.job import PlanningJob, check_number
from perseus.plan import MAX_TIME_S, Frontier, PlanPoint
from perseus.profile.pareto import pareto_indices
from perseus.solver.baselines import baseline_freq_plans
from perseus.solver.cost_model import CostModel, build_cost_model
from perseus.solver.fold import FOLD_ABOVE_OPS, FoldedJob, fold_job
from perseus.solver.pareto_search import search_neighbours
from perseus.solver.paths import Topology, build_topology
from perseus.solver.reclaim import reclaim_slack
from perseus.solver.walk import METHODS, CoreFn, Lifter, Progress, core_of
from perseus.validate import Bounds

__all__ = ["DEFAULT_HULL_GAP_FRACTION", "FrontierTrace", "trace", "trace_frontier"]

#: Default hull thinning: vertices closer than this fraction of an op's fastest time merge
#: (~1.5x faster on the bundled profiles with the same savings; 0.05 loses 0.3-0.6 points).
DEFAULT_HULL_GAP_FRACTION = 0.02
#: A folded walk emits points at least this far apart (fraction of T_min): every lifted plan
#: is a full-size array.
_FOLD_MIN_GAP_FRACTION = 1e-4
#: The smallest gap fraction above 0: the walk samples about 1/gap plans, each decade below this
#: ~8x the time for under 1 % more points (A100 8x24: 2.9 s at 1e-6, 22 s at 1e-7).
MIN_GAP_FRACTION = 1e-6


@dataclass(frozen=True)
class FrontierTrace:
    """A traced frontier and how it was found.

    Attributes:
        frontier: The frontier (exact, sorted, strictly Pareto).
        iterations: Min-cut iterations (LP breakpoints visited), summed over the walks.
        candidates: Real plans evaluated before Pareto filtering.
        lp_time_s, lp_energy_j: The traced relaxation's optimum at each breakpoint, time
            descending; with ``hull_gap_fraction=0`` this is the LP floor.
        stop_reason: ``"fastest"``, or ``"stalled"`` / ``"no-step"`` when numerical trouble
            ended the walk early (the frontier is still exact and dominates the baselines).
        folded_microbatches: The microbatch count of the job actually walked, when folded
            (``iterations`` and ``lp_*`` then describe that job).
    """

    frontier: Frontier
    iterations: int
    candidates: int
    lp_time_s: FloatArray
    lp_energy_j: FloatArray
    stop_reason: str = "fastest"
    folded_microbatches: int | None = None

    @property
    def complete(self) -> bool:
        """Whether the walk reached the fastest plan of the relaxation."""
        return self.stop_reason == "fastest"

    def lp_floor_j(self, time_s: float) -> float:
        """The LP floor at deadline ``time_s`` (``inf`` below its fastest time).

        Raises:
            ConfigError: if the job was folded (its relaxation is the folded job's).
        """
        if self.folded_microbatches is not None:
            raise ConfigError(
                f"this trace walked a folded job ({self.folded_microbatches} microbatches), so "
                "its relaxation is not the full job's; use lp_bound.lp_energy_floor_j or "
                "trace(..., fold=False)"
            )
        t, e = self.lp_time_s[::-1], self.lp_energy_j[::-1]
        if time_s < t[0] * (1 - 1e-12):
            return math.inf
        # A deadline allows finishing earlier: past T* the floor stays at its minimum.
        return float(min(np.interp(time_s, t, e), e[t <= time_s].min(initial=e[0])))


def trace_frontier(
    job: PlanningJob,
    *,
    time_quantum_s: float | None = None,
    min_gap_fraction: float = 1e-3,
    all_points: bool = False,
    progress: Progress | None = None,
) -> Frontier:
    """The time–energy frontier of ``job``: real plans, exactly evaluated, strictly Pareto.

    Args:
        time_quantum_s: Minimum step (lowtime's quantum); default: exact steps from
            breakpoint to breakpoint.
        min_gap_fraction: Round the walk's fractional plans this fraction of the fastest time
            apart (0: at every breakpoint; else at least 1e-6), and keep output points that far apart (both ends
            and the no-slowdown plan always kept).
        all_points: Keep every Pareto point of the same search instead of thinning.
        progress: Called with the fraction done in [0, 1] now and then.

    Returns:
        ``job.frontier(points)``, time strictly increasing and energy strictly decreasing;
        the fastest point is no slower and no costlier than all-max.

    Raises:
        ConfigError: if ``time_quantum_s`` is not > 0 or ``min_gap_fraction`` not ≥ 0.
    """
    return trace(
        job,
        time_quantum_s=time_quantum_s,
        min_gap_fraction=min_gap_fraction,
        all_points=all_points,
        progress=progress,
    ).frontier


def trace(
    job: PlanningJob,
    *,
    time_quantum_s: float | None = None,
    min_gap_fraction: float = 1e-3,
    all_points: bool = False,
    progress: Progress | None = None,
    hull_gap_fraction: float | None = None,
    method: str | Callable[..., Any] = "compiled",
    fold: bool | None = None,
    max_clocks_per_op: int | None = None,
) -> FrontierTrace:
    """Like :func:`trace_frontier`, also returning iteration counts and the traced relaxation.

    Args:
        hull_gap_fraction: Thin each op's hull (:func:`build_cost_model`); 0 traces the LP
            floor exactly. Default: :data:`DEFAULT_HULL_GAP_FRACTION` for one clock per op,
            0 for two or more.
        method: ``"compiled"`` (numba), or a kernel with
            :func:`perseus.solver.compiled.walk_kernel`'s signature (the tests' numpy oracle).
        fold: Walk a job with fewer microbatches and lift its plans
            (:mod:`perseus.solver.fold`); default: above ``FOLD_ABOVE_OPS`` ops.
        max_clocks_per_op: 1, 2 (two-clock ops) or up to 4 phases per op; default: 2 when
            the job has ``layers_per_stage``, else 1. The plans of the frontier of one
            phase fewer seed this one, so no point is worse than that frontier's.
    """
    max_clocks_per_op, hull_gap_fraction = _checked(
        job,
        time_quantum_s,
        min_gap_fraction,
        hull_gap_fraction,
        method,
        max_clocks_per_op,
        progress,
    )
    if fold is None:
        fold = job.graph.num_nodes > FOLD_ABOVE_OPS
    fewer: list[PlanArg] = []
    if max_clocks_per_op >= 2:
        # The phased options hold those of one phase fewer, but rounding and the local search
        # may miss their plans (or, with costly switches, take a switch that does not pay):
        # that frontier's plans as seeds keep every point at least as good as its.
        fewer = [
            job.flat(p)
            for p in trace(
                job,
                time_quantum_s=time_quantum_s,
                min_gap_fraction=min_gap_fraction,
                all_points=all_points,
                method=method,
                fold=fold,
                max_clocks_per_op=max_clocks_per_op - 1,
            ).frontier.points
        ]
    model = build_cost_model(job, hull_gap_fraction, max_clocks_per_op)
    folded = fold_job(job, model, hull_gap_fraction, max_clocks_per_op) if fold else None
    quantum = time_quantum_s if time_quantum_s is not None else 0.0
    core = METHODS[method] if isinstance(method, str) else core_of(method)
    walk = (core, quantum, min_gap_fraction, all_points, progress)
    return _impl(job, model, folded, walk, fewer)


def _checked(
    job: PlanningJob,
    time_quantum_s: float | None,
    min_gap_fraction: float,
    hull_gap_fraction: float | None,
    method: str | Callable[..., Any],
    max_clocks_per_op: int | None,
    progress: object = None,
) -> tuple[int, float]:
    """:func:`trace`'s arguments checked; returns the clocks per op and hull gap to use."""
    if isinstance(method, str) and method not in METHODS:
        raise ConfigError(f"unknown solver method {method!r}; use one of {sorted(METHODS)}")
    if progress is not None and not callable(progress):
        raise ConfigError("`progress` must be a function of the fraction done or None")
    if not isinstance(job, PlanningJob):
        raise ConfigError(f"`job` must be a PlanningJob (make_job), got type {type(job).__name__}")
    if time_quantum_s is not None:
        check_number("time_quantum_s", time_quantum_s, Bounds(gt=0, le=MAX_TIME_S))
    check_number("min_gap_fraction", min_gap_fraction, Bounds(ge=0, le=1e6))
    if 0 < min_gap_fraction < MIN_GAP_FRACTION:
        raise ConfigError(
            f"`min_gap_fraction`={min_gap_fraction:g} would sample about "
            f"1/gap plans; use 0 (every breakpoint) or at least {MIN_GAP_FRACTION:g}"
        )
    if max_clocks_per_op is None:
        max_clocks_per_op = 1 if job.spec.layers_per_stage is None else 2
    if hull_gap_fraction is None:
        hull_gap_fraction = DEFAULT_HULL_GAP_FRACTION if max_clocks_per_op == 1 else 0.0
    check_number("hull_gap_fraction", hull_gap_fraction, Bounds(ge=0, lt=1))
    return max_clocks_per_op, hull_gap_fraction


def _impl(
    job: PlanningJob,
    model: CostModel,
    folded: FoldedJob | None,
    walk: tuple[CoreFn, float, float, bool, Progress | None],
    extra_seeds: list[PlanArg],
) -> FrontierTrace:
    """Walk (``walk``: the core, quantum, gap fraction, ``all_points``, progress), add the
    baselines, search around them, add ``extra_seeds`` (after the search: in it they would
    take its budget from the walk's plans), select the points."""
    core, quantum, min_gap_fraction, all_points, progress = walk
    topo = build_topology(job.graph)
    allmax_time = float(job.evaluate(job.allmax()).time_s)
    t_min_lp = float(topo.forward(model.hull_time_s[model.node_type, 0])[1].max())
    # The walk samples fractional plans ``gap`` apart whatever is kept.
    gap = min_gap_fraction * t_min_lp
    # The baselines and a folded walk's lifting run beside the walk (it releases the GIL).
    with (
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="perseus-solver") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="perseus-lift") as lane,
    ):
        try:
            seeds = pool.submit(_seeds, job, model)
            if folded is None:
                cand, iterations, lp_t, lp_e, reason = core(
                    job, model, topo, 1e-9 * allmax_time, quantum, gap, gap == 0.0, progress, None
                )
            else:
                lifter = Lifter(job, model, topo, folded, allmax_time, (lane, pool))
                cand, iterations, lp_t, lp_e, reason = _walk_folded(folded, walk, lifter)
                cand.extend(lifter.flush())
            cand.extend(reclaim_slack(model, topo, np.stack(seeds.result())))
        except BaseException:
            # An error or Ctrl-C: drop the queued lifting (the walk runs ahead of it, dozens of
            # batches) instead of waiting for every batch; only the running ones finish.
            for executor in (lane, pool):
                executor.shutdown(wait=False, cancel_futures=True)
            raise
    extra = [_to_options(job, model, f) for f in extra_seeds]
    after = reclaim_slack(model, topo, np.stack(extra)) if extra else None
    points = _select(job, model, topo, cand, 0.0 if all_points else gap, allmax_time, after)
    if progress is not None:
        progress(1.0)
    return FrontierTrace(
        frontier=job.frontier(points),
        iterations=iterations,
        candidates=len(cand),
        lp_time_s=np.array(lp_t),
        lp_energy_j=np.array(lp_e),
        stop_reason=reason,
        folded_microbatches=None if folded is None else folded.job.spec.microbatches,
    )


def _walk_folded(
    folded: FoldedJob, walk: tuple[CoreFn, float, float, bool, Progress | None], lifter: Lifter
) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """Walk the folded job, its plans going to ``lifter`` as they come (as far apart, as a
    fraction of the fastest time, as asked: denser cost 2-3x the time for a few hundredths of
    a point)."""
    core, quantum, min_gap_fraction, _, progress = walk
    small, small_model = folded.job, folded.model
    small_topo = build_topology(small.graph)
    small_t_min = float(
        small_topo.forward(small_model.hull_time_s[small_model.node_type, 0])[1].max()
    )
    small_gap = max(min_gap_fraction, _FOLD_MIN_GAP_FRACTION) * small_t_min
    small_tol = 1e-9 * float(small.evaluate(small.allmax()).time_s)
    return core(
        small, small_model, small_topo, small_tol, quantum, small_gap, False, progress, lifter
    )


def _seeds(job: PlanningJob, model: CostModel) -> list[IntArray]:
    """The baselines' plans as option indices (:func:`_to_options`)."""
    return [_to_options(job, model, f) for f in baseline_freq_plans(job)]


def _to_options(job: PlanningJob, model: CostModel, freqs_mhz: PlanArg) -> IntArray:
    """Each node's slowest Pareto option no slower than its clock in ``freqs_mhz`` (at least
    as good in time and energy)."""
    time_s, _ = op_costs(job.graph, job.profile, freqs_mhz, job.layer_split)
    table = model.opt_time_s[model.node_type]
    idx: IntArray = np.maximum((table <= time_s[:, None]).sum(axis=1) - 1, 0).astype(np.int64)
    return idx


def _select(
    job: PlanningJob,
    model: CostModel,
    topo: Topology,
    cand: list[IntArray],
    gap: float,
    allmax_time_s: float,
    after: IntArray | None = None,
) -> list[PlanPoint]:
    """Search around the (reclaimed) candidates, add ``after``, evaluate, Pareto-filter and
    thin them (:func:`_thinned`)."""
    rec = np.unique(np.stack(cand), axis=0)  # reclaimed by every walk already: idempotent
    rec = search_neighbours(model, topo, job.graph.num_ranks, rec)
    if after is not None:
        rec = np.unique(np.concatenate([rec, after]), axis=0)
    figures = [
        evaluate_many(job.graph, t, e, model.blocking_power_w) for _, t, e in _chunks(model, rec)
    ]
    times, energies = (np.concatenate(f) for f in zip(*figures, strict=True))
    kept = pareto_indices(times, energies).tolist()
    if gap > 0 and len(kept) > 2:
        kept = _thinned(kept, times, gap, allmax_time_s)
    points: list[PlanPoint] = []
    for chunk, t, e in _chunks(model, rec[kept]):
        evs = evaluations(job.graph, t, e, blocking_power_w=model.blocking_power_w)
        for idx, ev in zip(chunk, evs, strict=True):
            freqs = job.nested(model.plan_ops(idx))
            points.append(PlanPoint(time_s=ev.time_s, energy_j=ev.energy_j, freqs_mhz=freqs))
    # Only points strictly better in energy than every faster one (exact figures).
    keep = pareto_indices([p.time_s for p in points], [p.energy_j for p in points], 0.0)
    return [points[i] for i in keep.tolist()]


def _thinned(kept: list[int], times: FloatArray, gap: float, allmax_time_s: float) -> list[int]:
    """``kept`` (time order) at least ``gap`` apart, keeping both ends and the no-slowdown plan."""
    within = [i for i in kept if times[i] <= allmax_time_s * (1 + 1e-12)]
    anchors = {kept[0], kept[-1], *within[-1:]}
    thinned = [kept[0]]
    for i in kept[1:]:
        if i not in anchors and times[i] < times[thinned[-1]] + gap:
            continue
        if i in anchors and thinned[-1] not in anchors and times[i] < times[thinned[-1]] + gap:
            thinned.pop()  # an anchor displaces a point too close before it
        thinned.append(i)
    return thinned


def _chunks(model: CostModel, rows: IntArray) -> Iterator[tuple[IntArray, FloatArray, FloatArray]]:
    """Rows of option indices 64 at a time (memory), with their per-node times and energies."""
    types = model.node_type
    for lo in range(0, len(rows), 64):
        chunk = rows[lo : lo + 64]
        yield chunk, model.opt_time_s[types, chunk], model.opt_energy_j[types, chunk]
