"""Trace the time–energy frontier of a pipeline iteration with iterative min cuts.

**Problem.** Each op ``i`` picks a clock; with blocking power ``P`` and ``R`` ranks a plan that
finishes at ``T`` uses ``E = Σ_i c_i + P·R·T`` with effective op cost ``c_i = e_i − P·t_i``.
For every deadline we want the cheapest plan; the frontier runs from the minimum-time plan to
the minimum-energy one (T*).

**Algorithm** (Phillips–Dessouky family, as in lowtime, with these changes):

1. *Convex piecewise-linear costs.* Each (stage, kind) uses the lower convex hull of its
   measured Pareto options in (t, c) (:mod:`perseus.solver.cost_model`) instead of an
   exponential fit, so the relaxation is exact at every hull vertex and its optimum is the LP
   floor (:mod:`perseus.solver.lp_bound`).
2. *Start at the cheapest plan and shorten.* Every op starts at its slowest hull vertex. A
   step finds the critical sub-DAG, and the minimum cut of it in which a forward op costs the
   slope of its next-faster segment (∞ at the fastest vertex) and a backward op saves the slope
   of its next-slower segment (:mod:`perseus.solver.cut_network`); every critical path crosses the
   cut once more forwards than backwards, so shortening forward ops and lengthening backward ops
   by δ shortens the iteration by δ at the least marginal cost.
3. *Exact step lengths instead of one quantum.* The cut stays optimal until an op reaches a
   hull vertex or a non-critical path becomes critical. The first bound is read off the hull;
   the second is found by a few Newton steps on the (convex, piecewise-linear) makespan along
   the step direction, each one longest-path pass plus the binding path's slope. So the
   number of iterations is the number of LP breakpoints, not ``(T* − T_min)/quantum``.
4. *Fast, warm-started cuts, compiled.* The whole loop runs in numba
   (:mod:`perseus.solver.compiled`): longest paths over CSR adjacency, and one cut network
   over all ops whose flow is kept from one iteration to the next. An iteration changes only
   a few capacities: a changed lower bound moves flow between an op's arc and its terminal
   arcs (lower bounds are folded into terminal arcs, no feasible-circulation phase), flow above
   a lowered capacity is cancelled back to the terminals, and search trees kept from the last
   cut (Boykov–Kolmogorov) re-augment from there. The reference loop (``method="reference"``: numpy, Python and
   scipy's max flow, 10–40x slower; :mod:`perseus.solver.check`) is its test oracle.
5. *Fewer breakpoints.* Hull vertices closer than ``hull_gap_fraction`` (default 2 %) of an
   op's fastest time are merged; the relaxation gets slightly coarser but real plans still use
   every measured clock, so on the bundled profiles savings are unchanged and iterations drop.
6. *Real plans only.* Along the way, at target times at least ``min_gap_fraction·T_min``
   apart (at every breakpoint when that fraction is 0), the fractional plan is rounded twice:
   each op to the slowest real option no slower than its fractional duration (never later
   than the target), and each op to the next slower option, then sped up critical op by
   critical op until it meets the first rounding's time (``tighten_kernel``). Slack is
   reclaimed (:mod:`perseus.solver.reclaim`) and the plans are evaluated by the exact
   evaluator. The baselines (all-max, each global clock, per-stage, EnvPipe) are added as
   reclaimed seeds, so the frontier dominates every one of them. With two clocks per op
   (a job with ``layers_per_stage``) the real options include every two-clock op between
   neighbouring hull vertices (:mod:`perseus.solver.cost_model`), so the same rounding
   realises each fractional op to within one layer of the hull instead of one whole clock,
   and the fractional plan at the all-max time is always rounded: the no-slowdown plan
   lands within 0.1 point of the LP limit on the bundled profiles.
7. *Gap filling.* Rounded plans leave gaps in time between them; a Pareto local search over
   one-option moves (:mod:`perseus.solver.pareto_search`, budgeted to about half a second:
   it converges on jobs up to a few hundred ops and expands the largest gaps first on larger
   ones) fills them with real plans; on tiny jobs (≤ 16 ops) it also tries two-op moves
   (exchanges), where rounding a handful of fractional ops decides the result. A final Pareto filter keeps strictly improving points;
   emitted figures *are* the evaluator's.
8. *Folding long jobs.* Beyond ``FOLD_ABOVE_OPS`` ops the walk runs on the same schedule with
   ``stages + 8`` microbatches and its plans are lifted to the full job
   (:mod:`perseus.solver.fold`); the lifted plans are reclaimed and evaluated on the full job
   like any other candidate, so points stay exact, but they are no longer the full job's
   relaxation optimum (``FrontierTrace.folded_microbatches`` says so). 32×512 takes under a
   minute instead of hours.

**Complexity.** With B breakpoints, N ops and E edges: each iteration costs O(N + E) compiled
steps for 2–4 longest-path passes and the capacity update, plus the re-augmentation of the
cut network (Boykov–Kolmogorov, whose trees are kept between iterations: on pipeline DAGs
it re-searches a few hundred nodes per iteration). So the walk is O(B·(N + E)) in practice, with
B ≈ 2–30 per op. Emission costs O(N·W) per candidate (W options per op) plus one compiled
reclaim pass and one exact evaluation per candidate. Memory is O(N·(W + H) + E) plus the
candidates, filtered to their Pareto set batch by batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag.evaluate import PlanArg, evaluate_durations, evaluate_many, op_costs
from perseus.errors import ConfigError
from perseus.job import PlanningJob
from perseus.plan import Frontier, PlanPoint
from perseus.profile.pareto import pareto_indices
from perseus.solver.cost_model import CostModel, build_cost_model
from perseus.solver.fold import FOLD_ABOVE_OPS, fold_job
from perseus.solver.pareto_search import search_neighbours
from perseus.solver.paths import build_topology
from perseus.solver.reclaim import reclaim_slack
from perseus.solver.walk import METHODS, Lifter, Progress

__all__ = ["DEFAULT_HULL_GAP_FRACTION", "FrontierTrace", "trace", "trace_frontier"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Default hull thinning: vertices closer than this fraction of an op's fastest time merge
#: (fewer breakpoints, ~1.5x faster on the bundled profiles with the same savings, because
#: rounding and reclaiming still use every real clock; 0.05 is ~2.5x faster but loses 0.3-0.6
#: points of saving on A40).
DEFAULT_HULL_GAP_FRACTION = 0.02
#: A folded walk emits points at least this far apart (fraction of T_min), even when asked for
#: every breakpoint: every lifted plan is a full-size array.
_FOLD_MIN_GAP_FRACTION = 1e-4


@dataclass(frozen=True)
class FrontierTrace:
    """A traced frontier and how it was found.

    Attributes:
        frontier: The frontier (exact, sorted, strictly Pareto).
        iterations: Min-cut iterations (LP breakpoints visited), summed over the walks (small
            jobs are walked twice, see :mod:`perseus.solver.walk`).
        candidates: Real plans evaluated before Pareto filtering.
        lp_time_s, lp_energy_j: The traced relaxation's optimum at each breakpoint, time
            descending, linear in between. Each op mixes two neighbouring hull vertices; with
            ``hull_gap_fraction=0`` this is the LP floor, otherwise a slightly higher curve.
        stop_reason: ``"fastest"`` when the walk reached the relaxation's fastest plan;
            ``"stalled"`` or ``"no-step"`` when numerical trouble ended it early. The frontier
            is still exact and dominates the baselines, but between the last traced point
            and the fastest baseline it is only as good as those baselines.
        folded_microbatches: When the job was folded (:mod:`perseus.solver.fold`), the
            microbatch count of the job actually walked; ``iterations`` and ``lp_*`` then
            describe that job, and the points are its plans lifted to this one.
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
            ConfigError: if the job was folded: the traced relaxation is then the folded
                job's, not this one's (use :func:`perseus.solver.lp_bound.lp_energy_floor_j`).
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
        job: The planning job (any schedule the core supports).
        time_quantum_s: Minimum step (lowtime's quantum). Default: none, i.e. exact steps from
            breakpoint to breakpoint. With a quantum, a step shorter than it runs on to one
            quantum, shortened ops continuing onto their next hull segment; measured on the
            bundled profiles this *adds* iterations and loses optimality, so it is only a knob.
        min_gap_fraction: Round the walk's fractional plans this fraction of the fastest time
            apart (0: at every breakpoint), and keep output points at least that far apart
            (both ends and the no-slowdown plan always kept).
        all_points: Keep every Pareto point found instead of thinning the output. The search
            is the same either way, so the default frontier is a subset of this one and
            their no-slowdown plans are the same plan.
        progress: Called with the fraction done in [0, 1] now and then.

    Returns:
        ``job.frontier(points)``: points sorted by time, time strictly increasing and energy
        strictly decreasing; the fastest is no slower and no costlier than all-max.

    Raises:
        ConfigError: if ``time_quantum_s`` or ``min_gap_fraction`` is not a finite number > 0
            (≥ 0 for the gap).

    Complexity: see the module docstring.
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
    method: str = "compiled",
    fold: bool | None = None,
    max_clocks_per_op: int | None = None,
) -> FrontierTrace:
    """Like :func:`trace_frontier`, also returning iteration counts and the traced relaxation.

    ``hull_gap_fraction`` thins each op's convex hull (see :func:`build_cost_model`); with 0
    the traced relaxation is exactly the LP floor of :mod:`perseus.solver.lp_bound`.
    ``None`` (default) means :data:`DEFAULT_HULL_GAP_FRACTION` for one-clock plans and 0 for
    two-clock plans (whose rounding follows the true hull, so thinning it would cost
    0.05–0.1 point of saving on A40).
    ``method`` picks the walk: ``"compiled"`` (numba, the default) or ``"reference"`` (the
    same algorithm in numpy/Python on scipy's max flow; slow, kept to cross-check).
    ``fold`` walks a job with fewer microbatches and lifts its plans
    (:mod:`perseus.solver.fold`): ``None`` (default) folds jobs of more than
    ``FOLD_ABOVE_OPS`` ops, ``True`` folds whenever the schedule allows, ``False`` never.
    ``max_clocks_per_op`` is 1 (one clock per op), 2 (two-clock ops switching at a layer
    boundary, :mod:`perseus.profile.two_clock`) or up to 4 phases per op; ``None`` (default)
    means 2 when the job has ``layers_per_stage`` and 1 otherwise. When switches cost more than
    their latency (``switch_stall_s`` or ``switch_energy_j``), the one-clock frontier is traced
    first and its plans seed this one, so no point is worse than one clock per op.
    """
    max_clocks_per_op, hull_gap_fraction = _checked(
        job, time_quantum_s, min_gap_fraction, hull_gap_fraction, method, max_clocks_per_op
    )
    if fold is None:
        fold = job.graph.num_nodes > FOLD_ABOVE_OPS
    one_clock: list[PlanArg] = []
    if max_clocks_per_op >= 2 and (job.spec.switch_stall_s > 0 or job.spec.switch_energy_j > 0):
        # Switches that cost more than their latency put phased options above the hull, where
        # rounding may take a switch that does not pay; the one-clock frontier's plans, as
        # seeds, keep every point at least as good as one clock per op.
        ones = trace(
            job,
            time_quantum_s=time_quantum_s,
            min_gap_fraction=min_gap_fraction,
            all_points=all_points,
            method=method,
            fold=fold,
            max_clocks_per_op=1,
        ).frontier.points
        one_clock = [job.flat(p) for p in ones]
    model = build_cost_model(job, hull_gap_fraction, max_clocks_per_op)
    return _impl(
        job,
        model,
        time_quantum_s,
        min_gap_fraction,
        all_points,
        progress,
        method,
        fold,
        hull_gap_fraction,
        max_clocks_per_op,
        one_clock,
    )


def _checked(
    job: PlanningJob,
    time_quantum_s: float | None,
    min_gap_fraction: float,
    hull_gap_fraction: float | None,
    method: str,
    max_clocks_per_op: int | None,
) -> tuple[int, float]:
    """:func:`trace`'s arguments checked; returns the clocks per op and hull gap to use."""
    if method not in METHODS:
        raise ConfigError(f"unknown solver method {method!r}; use one of {sorted(METHODS)}")
    if time_quantum_s is not None and not (math.isfinite(time_quantum_s) and time_quantum_s > 0):
        raise ConfigError(
            f"time quantum must be a finite number of seconds > 0, got {time_quantum_s}"
        )
    if not (math.isfinite(min_gap_fraction) and min_gap_fraction >= 0):
        raise ConfigError(
            f"minimum gap fraction must be a finite number >= 0, got {min_gap_fraction}"
        )
    if max_clocks_per_op is None:
        max_clocks_per_op = 1 if job.spec.layers_per_stage is None else 2
    if hull_gap_fraction is None:
        hull_gap_fraction = DEFAULT_HULL_GAP_FRACTION if max_clocks_per_op == 1 else 0.0
    if not (math.isfinite(hull_gap_fraction) and 0 <= hull_gap_fraction < 1):
        raise ConfigError(f"hull gap fraction must be in [0, 1), got {hull_gap_fraction}")
    return max_clocks_per_op, hull_gap_fraction


def _impl(
    job: PlanningJob,
    model: CostModel,
    time_quantum_s: float | None,
    min_gap_fraction: float,
    all_points: bool,
    progress: Progress | None,
    method: str,
    fold: bool,
    hull_gap_fraction: float,
    max_clocks_per_op: int,
    extra_seeds: list[PlanArg] | None = None,
) -> FrontierTrace:
    # Imported here: baselines use the reclaim pass and the cost model too.
    from perseus.solver.baselines import baseline_freq_plans

    topo = build_topology(job.graph)
    allmax_time = float(job.evaluate(job.allmax()).time_s)
    tol = 1e-9 * allmax_time
    quantum = time_quantum_s if time_quantum_s is not None else 0.0
    fastest = model.hull_time_s[model.node_type, 0]
    t_min_lp = float(topo.forward(fastest)[1].max())
    # The walk samples fractional plans ``gap`` apart whatever is kept; ``all_points`` only
    # drops the thinning of the output, so keeping more points never changes the search.
    gap = min_gap_fraction * t_min_lp

    seeds = [_to_options(job, model, f) for f in baseline_freq_plans(job)]
    seeds += [_to_options(job, model, f) for f in extra_seeds or ()]
    core = METHODS[method]
    folded = fold_job(job, model, hull_gap_fraction, max_clocks_per_op) if fold else None
    if folded is None:
        cand, iterations, lp_t, lp_e, reason = core(
            job, model, topo, tol, quantum, gap, gap == 0.0, progress, None
        )
    else:
        # Walk the folded job (points 4x denser than asked: each lifted plan lands at its
        # own time on the full job) and lift its plans as they come; _select reclaims them
        # on this job.
        small, small_model = folded.job, folded.model
        small_topo = build_topology(small.graph)
        small_ht = small_model.hull_time_s[small_model.node_type, 0]
        small_t_min = float(small_topo.forward(small_ht)[1].max())
        small_gap = max(min_gap_fraction, _FOLD_MIN_GAP_FRACTION) * small_t_min / 4
        small_tol = 1e-9 * float(small.evaluate(small.allmax()).time_s)
        lifter = Lifter(job, model, topo, folded, allmax_time)
        cand, iterations, lp_t, lp_e, reason = core(
            small, small_model, small_topo, small_tol, quantum, small_gap, False, progress, lifter
        )
        cand.extend(lifter.flush())
    cand.extend(reclaim_slack(model, topo, np.stack(seeds)))
    points = _select(job, model, cand, 0.0 if all_points else gap, allmax_time)
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


def _to_options(job: PlanningJob, model: CostModel, freqs_mhz: PlanArg) -> IntArray:
    """Each node's slowest Pareto option no slower than its clock in ``freqs_mhz``.

    Some Pareto option is no slower and no costlier than any clock, and the slowest one that
    is no slower is the cheapest of those, so the mapped plan is at least as good in time and
    energy.
    """
    time_s, _ = op_costs(job.graph, job.profile, freqs_mhz)
    table = model.opt_time_s[model.node_type]
    idx: IntArray = np.maximum((table <= time_s[:, None]).sum(axis=1) - 1, 0).astype(np.int64)
    return idx


def _select(
    job: PlanningJob, model: CostModel, cand: list[IntArray], gap: float, allmax_time_s: float
) -> list[PlanPoint]:
    """Evaluate, Pareto-filter and thin (reclaimed) candidates; return exact plan points.

    Thinning keeps points at least ``gap`` apart in time, but always keeps the fastest, the
    cheapest, and the cheapest no slower than all-max: the plan deployed to remove intrinsic
    bloat at no slowdown must not be lost to spacing.
    """
    topo = build_topology(job.graph)
    types = model.node_type
    # Not reclaimed again: every walk returns them reclaimed (and reclaiming is idempotent).
    rec = np.unique(np.stack(cand), axis=0)
    rec = search_neighbours(model, topo, job.graph.num_ranks, rec)
    power = model.blocking_power_w
    times, energies = _evaluate_rows(job, model, rec)
    kept = pareto_indices(times, energies).tolist()
    if gap > 0 and len(kept) > 2:
        within = [i for i in kept if times[i] <= allmax_time_s * (1 + 1e-12)]
        anchors = {kept[0], kept[-1], *within[-1:]}
        thinned = [kept[0]]
        for i in kept[1:]:
            if i not in anchors and times[i] < times[thinned[-1]] + gap:
                continue
            if i in anchors and thinned[-1] not in anchors and times[i] < times[thinned[-1]] + gap:
                thinned.pop()  # an anchor displaces a point too close before it
            thinned.append(i)
        kept = thinned
    points: list[PlanPoint] = []
    for i in kept:
        idx = rec[i]
        ev = evaluate_durations(
            job.graph,
            model.opt_time_s[types, idx],
            model.opt_energy_j[types, idx],
            blocking_power_w=power,
        )
        points.append(
            PlanPoint(
                time_s=ev.time_s, energy_j=ev.energy_j, freqs_mhz=job.nested(model.plan_ops(idx))
            )
        )
    return _strict_pareto(points)


def _evaluate_rows(
    job: PlanningJob, model: CostModel, rows: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Exact time and energy of each row of option indices (64 plans at a time: memory)."""
    types = model.node_type
    times = np.empty(len(rows))
    energies = np.empty(len(rows))
    for lo in range(0, len(rows), 64):
        chunk = rows[lo : lo + 64]
        t, e = evaluate_many(
            job.graph,
            model.opt_time_s[types, chunk],
            model.opt_energy_j[types, chunk],
            model.blocking_power_w,
        )
        times[lo : lo + 64], energies[lo : lo + 64] = t, e
    return times, energies


def _strict_pareto(points: list[PlanPoint]) -> list[PlanPoint]:
    """Drop points not strictly better in energy than every faster one (exact figures)."""
    keep = pareto_indices([p.time_s for p in points], [p.energy_j for p in points], 0.0)
    return [points[i] for i in keep.tolist()]
