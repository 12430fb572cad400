"""The frontier walk in numpy/Python on scipy's max flow: the reference for the compiled walk.

Same algorithm as :func:`perseus.solver.compiled.walk_kernel` (see :mod:`perseus.solver.frontier`
for the method), written for reading and for cross-checking the compiled loop
(``trace(..., method="reference")``), 10–40x slower. Each iteration builds the min-cut network
of the critical sub-DAG from scratch and solves it with
:func:`perseus.solver.check.maxflow.min_cut_with_lower_bounds`.

Complexity: O(B·(N + E)) Python steps for B breakpoints, plus one scipy max flow per
breakpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.job import PlanningJob
from perseus.solver.check.maxflow import min_cut_with_lower_bounds, reaches
from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["walk_reference"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Progress = Callable[[float], None]

_MAX_NEWTON = 64
_MAX_STALL = 200


def walk_reference(
    job: PlanningJob,
    model: CostModel,
    topo: Topology,
    tol: float,
    quantum: float,
    gap: float,
    every_breakpoint: bool,
    progress: Progress | None,
) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """The Phillips–Dessouky loop. Returns candidates (option indices), iterations, LP curve
    and why it stopped."""
    types = model.node_type
    rows = np.arange(topo.num_nodes)
    d = model.hull_time_s[types][rows, model.num_hull[types] - 1].copy()
    power_ranks = model.blocking_power_w * job.graph.num_ranks
    em = _Emitter(model, tol, gap, power_ranks)
    lp_t: list[float] = []
    lp_e: list[float] = []
    watch = _Watch(progress, float(topo.forward(model.hull_time_s[types][rows, 0])[1].max()))
    # Paths this close to critical join the cut network: without it, float noise from snapping
    # can leave a path a hair short of critical and the walk crawls in ~tol-sized steps.
    crit_tol = 100 * tol
    iterations = 0
    reason = "fastest"
    while True:
        start, end = topo.forward(d)
        deadline = float(end.max())
        lf = topo.backward(d, deadline)
        lp_t.append(deadline)
        lp_e.append(float(_hull_cost(model, types, d).sum()) + power_ranks * deadline)
        if watch.stalled(deadline, tol):  # the walk must keep shortening the iteration
            reason = "stalled"
            break
        crit = (lf - end) <= crit_tol
        c = np.flatnonzero(crit)
        prices = _prices(model, c, d, tol)
        side = _min_cut(job, topo, c, crit, (start, end, lf, deadline), d, crit_tol, prices)
        if side is None:
            break
        iterations += 1
        move, cut_value, exact, total_room = _read_cut(side, c, prices)
        step_max = min(max(exact, quantum), total_room)
        step = _step_length(topo, d, move, deadline, step_max, exact, crit_tol)[0]
        if step <= 0.0:  # a cut whose move cannot shorten the iteration would repeat forever
            reason = "no-step"
            break
        em.along(d, move, deadline, step, cut_value)
        d = move.apply(d, step)
        _snap(d, model.hull_time_s[types], tol)
        if every_breakpoint and em.emitting:
            em.emit(d)
    em.emit(d)
    return em.cand, iterations, lp_t, lp_e, reason


_Prices = tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]
_Times = tuple[FloatArray, FloatArray, FloatArray, float]


def _prices(model: CostModel, c: IntArray, d: FloatArray, tol: float) -> _Prices:
    """The critical ops' durations and fastest times, their next-faster slope and room
    (``upper``, inf at the fastest vertex) and next-slower (``lower``, 0 at the slowest)."""
    types = model.node_type[c]
    dc, htc, hsc = d[c], model.hull_time_s[types], model.hull_slope[types]
    k = np.arange(c.size)
    a = (htc <= (dc + tol)[:, None]).sum(axis=1) - 1
    at_v = (dc - htc[k, a]) <= tol
    lower_v = np.where(at_v, a - 1, a)  # vertex we move towards when shortening
    upper = np.where(lower_v >= 0, hsc[k, np.maximum(lower_v, 0)], np.inf)
    upper = np.where(at_v & (a == 0), np.inf, upper)
    room_red = dc - htc[k, np.maximum(lower_v, 0)]
    can_len = ~(at_v & (a >= model.num_hull[types] - 1))
    lower = np.where(can_len, hsc[k, np.minimum(a, hsc.shape[1] - 1)], 0.0)
    room_len = np.where(can_len, htc[k, np.minimum(a + 1, htc.shape[1] - 1)] - dc, 0.0)
    return dc, htc[:, 0], upper, lower, room_red, room_len


def _min_cut(job: PlanningJob, topo: Topology, c: IntArray, crit: BoolArray, times: _Times, d: FloatArray, crit_tol: float, prices: _Prices) -> BoolArray | None:  # fmt: skip
    """The source side of the minimum cut of the critical sub-DAG (``times``: earliest
    start and finish, latest finish, deadline); None when no finite cut exists."""
    start, end, lf, deadline = times
    upper, lower = prices[2], prices[3]
    n = topo.num_nodes
    src_node, snk_node = 2 * n, 2 * n + 1
    edge_src, edge_dst, edge_lat = job.graph.edge_src, job.graph.edge_dst, job.graph.edge_latency_s
    # Criticality of dependency edges: the successor's latest start is the predecessor's
    # earliest finish plus latency.
    e_float = (lf[edge_dst] - d[edge_dst]) - (end[edge_src] + edge_lat)
    ce = np.flatnonzero((e_float <= crit_tol) & crit[edge_src] & crit[edge_dst])
    cs = c[topo.is_source[c] & (start[c] <= crit_tol)]
    ck = c[topo.is_sink[c] & (end[c] >= deadline - crit_tol)]
    arc_src = np.concatenate([2 * c, 2 * edge_src[ce] + 1, np.full(cs.size, src_node), 2 * ck + 1])
    arc_dst = np.concatenate([2 * c + 1, 2 * edge_dst[ce], 2 * cs, np.full(ck.size, snk_node)])
    m_other = ce.size + cs.size + ck.size
    arc_up = np.concatenate([upper, np.full(m_other, np.inf)])
    arc_lo = np.concatenate([lower, np.zeros(m_other)])
    inf_arc = ~np.isfinite(arc_up)
    if reaches(2 * n + 2, arc_src[inf_arc], arc_dst[inf_arc], src_node, snk_node):
        return None
    return min_cut_with_lower_bounds(
        2 * n + 2, arc_src, arc_dst, arc_up, arc_lo, src_node, snk_node
    )


def _read_cut(side: BoolArray, c: IntArray, prices: _Prices) -> tuple[_Move, float, float, float]:
    """The cut's move, its marginal cost, the longest step before an op reaches a hull
    vertex, and before one reaches its fastest."""
    dc, fastest, upper, lower, room_red, room_len = prices
    fwd = side[2 * c] & ~side[2 * c + 1]
    bwd = ~side[2 * c] & side[2 * c + 1] & (lower > 0)
    cut_value = float(upper[fwd].sum() - lower[bwd].sum())
    exact = float(min(room_red[fwd].min(initial=np.inf), room_len[bwd].min(initial=np.inf)))
    # Past the first vertex a shortened op just continues on its next (steeper) segment,
    # so a step may run on to one quantum; it can never pass an op's fastest vertex.
    total_room = float((dc[fwd] - fastest[fwd]).min(initial=np.inf))
    return _Move(c[fwd], c[bwd], room_len[bwd]), cut_value, exact, total_room


class _Emitter:
    """The walk's candidates: the fractional plans it passes, rounded (:func:`_round`)."""

    def __init__(self, model: CostModel, tol: float, gap: float, power_ranks: float) -> None:
        self._figures = (model, tol, gap, power_ranks)
        self.cand: list[IntArray] = []
        self.emitting = False
        self._last = math.inf

    def emit(self, d: FloatArray) -> None:
        self.cand.append(_round(self._figures[0], d, self._figures[1]))

    def along(
        self, d: FloatArray, move: _Move, deadline: float, step: float, cut_value: float
    ) -> None:
        """Emit the plans a step passes: the first once the cut's cost reaches half the
        blocking power, then one every ``gap`` seconds."""
        _, _, gap, power_ranks = self._figures
        if not self.emitting and cut_value >= 0.5 * power_ranks:
            self.emitting = True
            self.emit(d)
            self._last = deadline
        target = self._last - gap
        while self.emitting and gap > 0 and target >= deadline - step:
            self.emit(move.apply(d, deadline - target))
            self._last = target
            target -= gap


class _Watch:
    """Progress reports (every 1 %) and the stall guard: no shortening beyond ``tol`` for
    ``_MAX_STALL`` iterations."""

    def __init__(self, progress: Progress | None, t_min: float) -> None:
        self._progress, self._t_min = progress, t_min
        self._first = -1.0
        self._reported = -1.0
        self._best = math.inf
        self._stalled = 0

    def stalled(self, deadline: float, tol: float) -> bool:
        if deadline < self._best - tol:
            self._best, self._stalled = deadline, 0
        else:
            self._stalled += 1
            if self._stalled > _MAX_STALL:
                return True
        if self._first < 0:
            self._first = deadline
        if self._progress is not None and self._first > self._t_min:
            frac = min(1.0, (self._first - deadline) / (self._first - self._t_min))
            if frac - self._reported >= 0.01:
                self._progress(0.99 * frac)
                self._reported = frac
        return False


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
        path = _binding_path(topo, trial, end)
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


def _binding_path(topo: Topology, time_s: FloatArray, end_s: FloatArray) -> list[int]:
    """Nodes of one longest path ending at the latest-finishing node (sink first)."""
    node = int(np.argmax(end_s))
    t = time_s.tolist()
    end = end_s.tolist()
    path = [node]
    start = end[node] - t[node]
    ptr, idx, lat = topo.pred_ptr.tolist(), topo.pred_idx.tolist(), topo.pred_lat_csr.tolist()
    while True:
        best_u, best = -1, -np.inf
        for k in range(ptr[node], ptr[node + 1]):  # first maximum, like argmax
            r = end[idx[k]] + lat[k]
            if r > best:
                best_u, best = idx[k], r
        if best_u < 0 or best < start - 1e-12 * max(1.0, abs(start)):
            return path  # starts at 0: no predecessor is binding
        node = best_u
        path.append(node)
        start = end[node] - t[node]
