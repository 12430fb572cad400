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
   of its next-slower segment (:mod:`perseus.solver.maxflow`); every critical path crosses the
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
   a lowered capacity is cancelled back to the terminals, and Dinic's phases re-augment from
   there, usually one or two. The reference loop (``method="reference"``: numpy, Python and
   scipy's max flow, 10–40x slower) is kept to cross-check it.
5. *Fewer breakpoints.* Hull vertices closer than ``hull_gap_fraction`` (default 2 %) of an
   op's fastest time are merged; the relaxation gets slightly coarser but real plans still use
   every measured clock, so on the bundled profiles savings are unchanged and iterations drop.
6. *Real plans only.* Along the way, at target times at least ``min_gap_fraction·T_min``
   apart (or at every breakpoint with ``all_points``), the fractional plan is rounded — each
   op to the slowest real option no slower than its fractional duration, so time never
   exceeds the target (extra nearest/slower roundings closed lowtime coverage gaps but made
   the emulated straggler switch overrun, so they were dropped) — slack is reclaimed
   (:mod:`perseus.solver.reclaim`), and the plans are evaluated by the exact evaluator. The
   baselines (all-max, each global clock, per-stage, EnvPipe) are added as reclaimed seeds, so
   the frontier dominates every one of them. A final Pareto filter keeps strictly improving
   points; emitted figures *are* the evaluator's. On tiny jobs (≤ 16 ops), where a few
   fractional ops decide everything, candidates also get a greedy descent and a pairwise
   exchange search (:mod:`perseus.solver.local_search`).

**Complexity.** With B breakpoints, N ops and E edges: each iteration costs O(N + E) compiled
steps for 2–4 longest-path passes and the capacity update, plus the re-augmentation of the
cut network (Dinic, O(V²E) worst case; on pipeline DAGs one or two phases, each a search of
the part reachable from the source). So the walk is O(B·(N + E)) in practice, with
B ≈ 2–30 per op. Emission costs O(N·W) per candidate (W options per op) plus one compiled
reclaim pass and one exact evaluation per candidate. Memory is O(N·(W + H) + E) plus the
candidates, filtered to their Pareto set batch by batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag.evaluate import evaluate_durations, evaluate_many, op_costs
from perseus.errors import ConfigError
from perseus.job import PlanningJob
from perseus.plan import Frontier, PlanPoint
from perseus.solver.cost_model import CostModel, build_cost_model
from perseus.solver.local_search import descend_greedy, improve_pairwise
from perseus.solver.maxflow import min_cut_with_lower_bounds, reaches
from perseus.solver.paths import Topology, build_topology
from perseus.solver.reclaim import reclaim_slack

__all__ = ["DEFAULT_HULL_GAP_FRACTION", "FrontierTrace", "trace", "trace_frontier"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Progress = Callable[[float], None]

_MAX_NEWTON = 64
_MAX_STALL = 200
#: Default hull thinning: vertices closer than this fraction of an op's fastest time merge
#: (fewer breakpoints, ~1.5x faster on the bundled profiles with the same savings, because
#: rounding and reclaiming still use every real clock; 0.05 is ~2.5x faster but loses 0.3-0.6
#: points of saving on A40).
DEFAULT_HULL_GAP_FRACTION = 0.02
#: Jobs up to this many ops get a pairwise local search on every candidate (O(N²) longest-path
#: passes per round: cheap for small jobs, where rounding a few fractional ops costs the most).
_LOCAL_SEARCH_MAX_NODES = 16


@dataclass(frozen=True)
class FrontierTrace:
    """A traced frontier and how it was found.

    Attributes:
        frontier: The frontier (exact, sorted, strictly Pareto).
        iterations: Min-cut iterations (LP breakpoints visited).
        candidates: Real plans evaluated before Pareto filtering.
        lp_time_s, lp_energy_j: The traced relaxation's optimum at each breakpoint, time
            descending, linear in between. Each op mixes two neighbouring hull vertices; with
            ``hull_gap_fraction=0`` this is the LP floor, otherwise a slightly higher curve.
        stop_reason: ``"fastest"`` when the walk reached the relaxation's fastest plan;
            ``"stalled"`` or ``"no-step"`` when numerical trouble ended it early. The frontier
            is still exact and dominates the baselines, but between the last traced point
            and the fastest baseline it is only as good as those baselines.
    """

    frontier: Frontier
    iterations: int
    candidates: int
    lp_time_s: FloatArray
    lp_energy_j: FloatArray
    stop_reason: str = "fastest"

    @property
    def complete(self) -> bool:
        """Whether the walk reached the fastest plan of the relaxation."""
        return self.stop_reason == "fastest"

    def lp_floor_j(self, time_s: float) -> float:
        """The LP floor at deadline ``time_s`` (``inf`` below its fastest time)."""
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
        min_gap_fraction: Keep points at least this fraction of the fastest time apart (both
            ends always kept). Ignored with ``all_points``.
        all_points: Emit a plan at every breakpoint and keep every Pareto point.
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
    hull_gap_fraction: float = DEFAULT_HULL_GAP_FRACTION,
    method: str = "compiled",
) -> FrontierTrace:
    """Like :func:`trace_frontier`, also returning iteration counts and the traced relaxation.

    ``hull_gap_fraction`` thins each op's convex hull (see :func:`build_cost_model`); with 0
    the traced relaxation is exactly the LP floor of :mod:`perseus.solver.lp_bound`.
    ``method`` picks the walk: ``"compiled"`` (numba, the default) or ``"reference"`` (the
    same algorithm in numpy/Python on scipy's max flow; slow, kept to cross-check).
    """
    if method not in _METHODS:
        raise ConfigError(f"unknown solver method {method!r}; use one of {sorted(_METHODS)}")
    if time_quantum_s is not None and not (math.isfinite(time_quantum_s) and time_quantum_s > 0):
        raise ConfigError(
            f"time quantum must be a finite number of seconds > 0, got {time_quantum_s}"
        )
    if not (math.isfinite(min_gap_fraction) and min_gap_fraction >= 0):
        raise ConfigError(
            f"minimum gap fraction must be a finite number >= 0, got {min_gap_fraction}"
        )
    if not (math.isfinite(hull_gap_fraction) and 0 <= hull_gap_fraction < 1):
        raise ConfigError(f"hull gap fraction must be in [0, 1), got {hull_gap_fraction}")
    return _impl(
        job, time_quantum_s, min_gap_fraction, all_points, progress, hull_gap_fraction, method
    )


def _impl(
    job: PlanningJob,
    time_quantum_s: float | None,
    min_gap_fraction: float,
    all_points: bool,
    progress: Progress | None,
    hull_gap_fraction: float,
    method: str,
) -> FrontierTrace:
    # Imported here: baselines use the reclaim pass and the cost model too.
    from perseus.solver.baselines import baseline_freq_plans

    model = build_cost_model(job, hull_gap_fraction)
    topo = build_topology(job.graph)
    allmax_time = float(job.evaluate(job.allmax()).time_s)
    tol = 1e-9 * allmax_time
    quantum = time_quantum_s if time_quantum_s is not None else 0.0
    fastest = model.hull_time_s[model.node_type, 0]
    t_min_lp = float(topo.forward(fastest)[1].max())
    gap = 0.0 if all_points else min_gap_fraction * t_min_lp

    seeds = [_to_options(job, model, f) for f in baseline_freq_plans(job)]
    core = _METHODS[method]
    cand, iterations, lp_t, lp_e, reason = core(
        job, model, topo, tol, quantum, gap, all_points, progress
    )
    cand.extend(_reclaim_all(model, topo, np.stack(seeds)))
    points = _select(job, model, cand, gap)
    if progress is not None:
        progress(1.0)
    return FrontierTrace(
        frontier=job.frontier(points),
        iterations=iterations,
        candidates=len(cand),
        lp_time_s=np.array(lp_t),
        lp_energy_j=np.array(lp_e),
        stop_reason=reason,
    )


def _to_options(job: PlanningJob, model: CostModel, freqs_mhz: IntArray) -> IntArray:
    """Each node's slowest Pareto option no slower than its clock in ``freqs_mhz``.

    Some Pareto option is no slower and no costlier than any clock, and the slowest one that
    is no slower is the cheapest of those, so the mapped plan is at least as good in time and
    energy.
    """
    time_s, _ = op_costs(job.graph, job.profile, freqs_mhz)
    table = model.opt_time_s[model.node_type]
    idx: IntArray = np.maximum((table <= time_s[:, None]).sum(axis=1) - 1, 0).astype(np.int64)
    return idx


#: Walk iterations per compiled call (between progress reports).
_CHUNK_ITERATIONS = 2000


def _core_compiled(
    job: PlanningJob,
    model: CostModel,
    topo: Topology,
    tol: float,
    quantum: float,
    gap: float,
    all_points: bool,
    progress: Progress | None,
) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """The Phillips–Dessouky loop, compiled (:func:`perseus.solver.compiled.walk_kernel`)."""
    from perseus.solver import compiled

    types = model.node_type
    ht = np.ascontiguousarray(model.hull_time_s[types])
    hs = np.ascontiguousarray(model.hull_slope[types])
    hc = np.ascontiguousarray(model.hull_cost_j[types])
    nh = np.ascontiguousarray(model.num_hull[types])
    rows = np.arange(topo.num_nodes)
    d = ht[rows, nh - 1].copy()
    t_min = float(topo.forward(ht[rows, 0])[1].max())
    state = np.zeros(compiled.STATE_SIZE)
    state[compiled.S_BEST_DEADLINE] = math.inf
    power_ranks = model.blocking_power_w * job.graph.num_ranks
    cand: list[IntArray] = []
    lp_t: list[float] = []
    lp_e: list[float] = []
    iterations = 0
    while state[compiled.S_DONE] == 0.0:
        emitted, chunk_t, chunk_e, done = compiled.walk_kernel(
            *topo.csr(),
            ht,
            hs,
            hc,
            nh,
            types,
            model.opt_time_s,
            d,
            state,
            tol,
            quantum,
            gap,
            all_points,
            power_ranks,
            _CHUNK_ITERATIONS,
        )
        iterations += int(done)
        if len(emitted):
            cand.extend(_pareto_within(job, model, topo, np.asarray(emitted, dtype=np.int64)))
        lp_t.extend(chunk_t.tolist())
        lp_e.extend(chunk_e.tolist())
        if progress is not None and lp_t and lp_t[0] > t_min:
            progress(0.99 * min(1.0, (lp_t[0] - lp_t[-1]) / (lp_t[0] - t_min)))
    reason = {
        compiled.DONE_FASTEST: "fastest",
        compiled.DONE_STALLED: "stalled",
        compiled.DONE_NO_STEP: "no-step",
    }[float(state[compiled.S_DONE])]
    return cand, iterations, lp_t, lp_e, reason


def _core(
    job: PlanningJob,
    model: CostModel,
    topo: Topology,
    tol: float,
    quantum: float,
    gap: float,
    all_points: bool,
    progress: Progress | None,
) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """The Phillips–Dessouky loop. Returns candidates (option indices), iterations, LP curve
    and why it stopped."""
    n = topo.num_nodes
    types = model.node_type
    ht = model.hull_time_s[types]  # (N, H)
    hs = model.hull_slope[types]
    nh = model.num_hull[types]
    power_ranks = model.blocking_power_w * job.graph.num_ranks
    rows = np.arange(n)
    d = ht[rows, nh - 1].copy()
    src_node, snk_node = 2 * n, 2 * n + 1
    edge_src, edge_dst, edge_lat = job.graph.edge_src, job.graph.edge_dst, job.graph.edge_latency_s

    cand: list[IntArray] = []
    lp_t: list[float] = []
    lp_e: list[float] = []
    emitting = False
    last_emit = math.inf
    start_t = -1.0
    t_min = float(topo.forward(ht[rows, 0])[1].max())
    last_report = -1.0
    iterations = 0

    def emit(dur: FloatArray) -> None:
        cand.append(_round(model, dur, tol))

    # Paths this close to critical join the cut network: without it, float noise from snapping
    # can leave a path a hair short of critical and the walk crawls in ~tol-sized steps.
    crit_tol = 100 * tol
    best_deadline = math.inf
    stalled = 0
    reason = "fastest"
    while True:
        start, end = topo.forward(d)
        deadline = float(end.max())
        lf = topo.backward(d, deadline)
        cost = float(_hull_cost(model, types, d).sum())
        lp_t.append(deadline)
        lp_e.append(cost + power_ranks * deadline)
        # Guard against numerical stalls: the walk must keep shortening the iteration.
        if deadline < best_deadline - tol:
            best_deadline, stalled = deadline, 0
        else:
            stalled += 1
            if stalled > _MAX_STALL:
                emit(d)
                reason = "stalled"
                break
        if start_t < 0:
            start_t = deadline
        if progress is not None and start_t > t_min:
            frac = min(1.0, (start_t - deadline) / (start_t - t_min))
            if frac - last_report >= 0.01:
                progress(0.99 * frac)
                last_report = frac
        crit = (lf - end) <= crit_tol
        c = np.flatnonzero(crit)
        # Criticality of dependency edges: the successor's latest start is the predecessor's
        # earliest finish plus latency.
        e_float = (lf[edge_dst] - d[edge_dst]) - (end[edge_src] + edge_lat)
        ce = np.flatnonzero((e_float <= crit_tol) & crit[edge_src] & crit[edge_dst])
        cs = c[topo.is_source[c] & (start[c] <= crit_tol)]
        ck = c[topo.is_sink[c] & (end[c] >= deadline - crit_tol)]

        dc = d[c]
        htc, hsc, nhc = ht[c], hs[c], nh[c]
        a = (htc <= (dc + tol)[:, None]).sum(axis=1) - 1
        at_v = (dc - htc[np.arange(c.size), a]) <= tol
        lower_v = np.where(at_v, a - 1, a)  # vertex we move towards when shortening
        upper = np.where(lower_v >= 0, hsc[np.arange(c.size), np.maximum(lower_v, 0)], np.inf)
        upper = np.where(at_v & (a == 0), np.inf, upper)
        room_red = dc - htc[np.arange(c.size), np.maximum(lower_v, 0)]
        can_len = ~(at_v & (a >= nhc - 1))
        lower = np.where(can_len, hsc[np.arange(c.size), np.minimum(a, hsc.shape[1] - 1)], 0.0)
        nxt = np.minimum(a + 1, htc.shape[1] - 1)
        room_len = np.where(can_len, htc[np.arange(c.size), nxt] - dc, 0.0)

        arc_src = np.concatenate(
            [2 * c, 2 * edge_src[ce] + 1, np.full(cs.size, src_node), 2 * ck + 1]
        )
        arc_dst = np.concatenate([2 * c + 1, 2 * edge_dst[ce], 2 * cs, np.full(ck.size, snk_node)])
        m_other = ce.size + cs.size + ck.size
        arc_up = np.concatenate([upper, np.full(m_other, np.inf)])
        arc_lo = np.concatenate([lower, np.zeros(m_other)])
        inf_arc = ~np.isfinite(arc_up)
        if reaches(2 * n + 2, arc_src[inf_arc], arc_dst[inf_arc], src_node, snk_node):
            emit(d)
            break
        side = min_cut_with_lower_bounds(
            2 * n + 2, arc_src, arc_dst, arc_up, arc_lo, src_node, snk_node
        )
        fwd = side[2 * c] & ~side[2 * c + 1]
        bwd = ~side[2 * c] & side[2 * c + 1] & (lower > 0)
        cut_value = float(upper[fwd].sum() - lower[bwd].sum())
        iterations += 1
        move = _Move(c[fwd], c[bwd], room_len[bwd])
        exact = float(min(room_red[fwd].min(initial=np.inf), room_len[bwd].min(initial=np.inf)))
        # Past the first vertex a shortened op just continues on its next (steeper) segment,
        # so a step may run on to one quantum; it can never pass an op's fastest vertex.
        total_room = dc[fwd] - htc[np.arange(c.size)[fwd], 0]
        step_max = min(max(exact, quantum), float(total_room.min(initial=np.inf)))
        step, start, end = _step_length(topo, d, move, deadline, step_max, exact, crit_tol)
        if step <= 0.0:
            # Guard (added by the torch-integration helper, see its report): a cut whose move
            # cannot shorten the iteration would repeat forever; stop tracing here.
            emit(d)
            reason = "no-step"
            break
        if not emitting and cut_value >= 0.5 * power_ranks:
            emitting = True
            emit(d)
            last_emit = deadline
        if emitting:
            target = last_emit - gap
            while gap > 0 and target >= deadline - step:
                emit(move.apply(d, deadline - target))
                last_emit = target
                target -= gap
        d = move.apply(d, step)
        _snap(d, ht, tol)
        if all_points and emitting:
            emit(d)
    return cand, iterations, lp_t, lp_e, reason


_CoreFn = Callable[
    [PlanningJob, CostModel, Topology, float, float, float, bool, "Progress | None"],
    tuple[list[IntArray], int, list[float], list[float], str],
]
_METHODS: dict[str, _CoreFn] = {"compiled": _core_compiled, "reference": _core}


def _hull_cost(model: CostModel, types: IntArray, d: FloatArray) -> FloatArray:
    """Per-node effective cost of fractional durations on the hull (linear interpolation)."""
    ht = model.hull_time_s[types]
    hc = model.hull_cost_j[types]
    hs = model.hull_slope[types]
    rows = np.arange(d.size)
    a = np.maximum((ht <= d[:, None]).sum(axis=1) - 1, 0)
    out: FloatArray = hc[rows, a] - hs[rows, a] * (d - ht[rows, a])
    return out


def _snap(d: FloatArray, ht: FloatArray, tol: float) -> None:
    """Snap durations within ``tol`` of a hull vertex onto it (in place)."""
    diff = np.abs(ht - d[:, None])
    j = diff.argmin(axis=1)
    close = diff[np.arange(d.size), j] <= tol
    d[close] = ht[np.arange(d.size), j][close]


@dataclass(frozen=True)
class _Move:
    """A cut's move: shorten ``fwd`` ops by δ, lengthen ``bwd`` ops by δ up to ``bwd_room``."""

    fwd: IntArray
    bwd: IntArray
    bwd_room: FloatArray

    def apply(self, d: FloatArray, step: float) -> FloatArray:
        out = d.copy()
        out[self.fwd] -= step
        out[self.bwd] += np.minimum(step, self.bwd_room)
        return out

    def slope_on(self, path: list[int], step: float) -> float:
        """Left derivative of the path length in δ at ``step`` (a supergradient: lengths are
        concave in δ because lengthening stops at ``bwd_room``)."""
        on = np.zeros(0, dtype=np.int64) if not path else np.asarray(path)
        k = -float(np.isin(self.fwd, on).sum())
        k += float(np.isin(self.bwd[self.bwd_room >= step], on).sum())
        return k


def _step_length(
    topo: Topology,
    d: FloatArray,
    move: _Move,
    deadline: float,
    step_max: float,
    exact: float,
    tol: float,
) -> tuple[float, FloatArray, FloatArray]:
    """Largest step ≤ ``step_max`` whose move shortens the iteration by the full step.

    While the makespan after a trial step is above ``deadline − δ``, a non-critical path has
    overtaken; the intersection of its tangent line with ``deadline − δ`` is the next, smaller
    candidate (path lengths are concave in δ, so the tangent never overshoots).

    Returns:
        The step and the earliest start/finish times after it (reused by the caller).
    """
    step = step_max
    for _ in range(_MAX_NEWTON):
        trial = move.apply(d, step)
        start, end = topo.forward(trial)
        makespan = float(end.max())
        if makespan <= deadline - step + tol:
            return step, start, end
        path = topo.binding_path(trial, end)
        slope = move.slope_on(path, step)
        if slope <= -1.0:  # a critical path cut short by a clamp: retreat to the exact bound
            if step <= exact:
                return step, start, end
            step = exact
            continue
        base = makespan - slope * step
        new = (deadline - base) / (slope + 1.0)
        if not new < step:
            return step, start, end
        # Beyond the exact bound clamps bend the paths, so never undershoot it from above:
        # up to it every path length is linear in δ and the tangent step is exact.
        step = max(new, exact) if step > exact else max(new, 0.0)
    trial = move.apply(d, step)
    start, end = topo.forward(trial)
    return step, start, end


def _round(model: CostModel, d: FloatArray, tol: float) -> IntArray:
    """Per node, the slowest Pareto option whose time is at most its fractional duration."""
    table = model.opt_time_s[model.node_type]
    idx: IntArray = np.maximum((table <= (d + tol * 1e-3)[:, None]).sum(axis=1) - 1, 0)
    return idx.astype(np.int64)


def _select(
    job: PlanningJob, model: CostModel, cand: list[IntArray], gap: float
) -> list[PlanPoint]:
    """Reclaim, evaluate, Pareto-filter and thin candidates; return exact plan points."""
    topo = build_topology(job.graph)
    types = model.node_type
    rec = np.unique(_reclaim_all(model, topo, np.stack(cand)), axis=0)
    if topo.num_nodes <= _LOCAL_SEARCH_MAX_NODES:
        walked = [
            w for r in rec for ps in (True, False) for w in descend_greedy(model, topo, r, ps)
        ]
        walked = [reclaim_slack(model, topo, w) for w in walked]
        rec = np.unique(
            np.stack([improve_pairwise(model, topo, r) for r in [*rec, *walked]]), axis=0
        )
    power = model.blocking_power_w
    times, energies = _evaluate_rows(job, model, rec)
    order = np.lexsort((energies, times))
    kept: list[int] = []
    best = math.inf
    for i in order:
        if energies[i] < best * (1 - 1e-12):
            kept.append(int(i))
            best = float(energies[i])
    if gap > 0 and len(kept) > 2:
        thinned = [kept[0]]
        for i in kept[1:-1]:
            if times[i] >= times[thinned[-1]] + gap:
                thinned.append(i)
        if times[kept[-1]] - times[thinned[-1]] < gap and len(thinned) > 1:
            thinned.pop()
        thinned.append(kept[-1])
        kept = thinned
    points: list[PlanPoint] = []
    for i in kept:
        idx = rec[i]
        ev = evaluate_durations(
            job.graph, model.opt_time_s[types, idx], model.opt_energy_j[types, idx], power
        )
        freqs = model.opt_freq_mhz[types, idx]
        points.append(
            PlanPoint(time_s=ev.time_s, energy_j=ev.energy_j, freqs_mhz=job.nested(freqs))
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


def _pareto_within(
    job: PlanningJob, model: CostModel, topo: Topology, plans: IntArray
) -> list[IntArray]:
    """The reclaimed plans of one batch that no other plan of the batch dominates.

    Dropping them early is safe (dominated within the batch means dominated overall) and
    keeps memory flat with ``all_points`` on large jobs, where the walk emits hundreds of
    thousands of plans.
    """
    rec = np.unique(_reclaim_all(model, topo, plans), axis=0)
    times, energies = _evaluate_rows(job, model, rec)
    kept: list[IntArray] = []
    best = math.inf
    for i in np.lexsort((energies, times)):
        if energies[i] < best:
            kept.append(rec[i])
            best = float(energies[i])
    return kept


def _reclaim_all(model: CostModel, topo: Topology, plans: IntArray) -> IntArray:
    """:func:`reclaim_slack` of every row of ``plans``, compiled (identical results)."""
    from perseus.solver.compiled import reclaim_kernel

    out: IntArray = reclaim_kernel(
        *topo.csr(),
        model.node_type,
        model.opt_time_s,
        np.ascontiguousarray(plans, dtype=np.int64),
    )
    return out


def _strict_pareto(points: list[PlanPoint]) -> list[PlanPoint]:
    """Drop points not strictly better in energy than every faster one (exact figures)."""
    out: list[PlanPoint] = []
    for p in sorted(points, key=lambda p: (p.time_s, p.energy_j)):
        if out and p.time_s <= out[-1].time_s:
            continue
        if out and p.energy_j >= out[-1].energy_j:
            continue
        out.append(p)
    return out
