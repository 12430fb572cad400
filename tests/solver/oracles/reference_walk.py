"""The frontier walk in numpy on scipy's max flow: the compiled walk's oracle.

:func:`walk_chunk` takes the arguments of :func:`perseus.solver.compiled.walk_kernel` and
returns what it returns, step for step: the same capacities on the same cut network, the same
cut (the minimal source side of a minimum cut, unique over maximum flows, found here by
:func:`tests.solver.oracles.maxflow.minimal_source_side`), the same Newton step length and the
same emitted plans, so both walks give the same frontier point for point.

Complexity: O(B·(N + E)) numpy steps for B breakpoints, plus two or three scipy max flows
per breakpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.dag.graph import BoolArray, FloatArray, IntArray
from perseus.solver.compiled import (
    _MAX_NEWTON,
    _MAX_STALL,
    DONE_FASTEST,
    DONE_NO_STEP,
    DONE_STALLED,
    S_BEST_DEADLINE,
    S_DONE,
    S_EMITTING,
    S_LAST_EMIT,
    S_STALLED,
)
from perseus.solver.cut_capacities import _BUDGET
from perseus.solver.cut_network import INF_CAP
from perseus.solver.paths import Topology
from tests.solver.oracles.maxflow import minimal_source_side

__all__ = ["walk_chunk"]

_Move = tuple[IntArray, IntArray, FloatArray]  # shortened ops, lengthened ops, their rooms


def walk_chunk(*args: Any) -> tuple[npt.NDArray[np.int16], FloatArray, FloatArray, int]:
    """:func:`perseus.solver.compiled.walk_kernel`, in numpy."""
    topo, hull, node_type, opt_t, dur, state, limits, net = args
    tol, quantum, gap, every_breakpoint, power_ranks, max_iterations, tie_units, anchor_s = limits
    walk = _Walk(topo, hull, dur, tol, tie_units, net)
    em = _Emitter(node_type, opt_t, tol)
    lp_t: list[float] = []
    lp_e: list[float] = []
    iterations = 0
    while iterations < max_iterations:
        start, end = walk.topo.forward(dur)
        deadline = float(end.max())
        late_finish = walk.topo.backward(dur, deadline)
        lp_t.append(deadline)
        lp_e.append(walk.cost() + power_ranks * deadline)
        stalled = _stalled(state, deadline, tol)
        side = None if stalled else walk.min_cut(start, end, late_finish, deadline)
        if side is None:
            em.emit(dur)
            state[S_DONE] = DONE_STALLED if stalled else DONE_FASTEST
            break
        move, cut_value, exact, step_max = walk.read_cut(side)
        iterations += 1
        step = _step_length(walk, move, deadline, min(max(exact, quantum), step_max), exact)
        if step <= 0.0:
            em.emit(dur)
            state[S_DONE] = DONE_NO_STEP
            break
        em.along(dur, move, (deadline, step, cut_value), state, (gap, power_ranks, anchor_s))
        walk.advance(move, step)
        if every_breakpoint and state[S_EMITTING] != 0.0:
            em.emit(dur)
    return em.rows(dur.size), np.array(lp_t), np.array(lp_e), iterations


def _stalled(state: FloatArray, deadline: float, tol: float) -> bool:
    """Record the best deadline so far; True once the walk made no progress for too long."""
    if deadline < state[S_BEST_DEADLINE] - tol:
        state[S_BEST_DEADLINE] = deadline
        state[S_STALLED] = 0.0
        return False
    state[S_STALLED] += 1.0
    return bool(state[S_STALLED] > _MAX_STALL)


class _Walk:
    """The fractional plan ``dur`` and what the walk reads off it each iteration."""

    def __init__(
        self,
        topo: tuple[Any, ...],
        hull: tuple[Any, ...],
        dur: FloatArray,
        tol: float,
        tie_units: int,
        net: tuple[Any, ...],
    ) -> None:
        self.topo, self.hull, self.dur, self.tol = Topology(dur.size, *topo), hull, dur, tol
        self._tie_units = tie_units
        self._arcs = net[0], net[1]
        hs = hull[1]
        # One capacity scale for the whole walk, summed in op order as the kernel does.
        total = float(np.cumsum(3.0 * hs[:, 0])[-1]) if hs.shape[0] else 0.0
        self._scale = _BUDGET / total if total > 0 else 1.0
        self._rows = np.arange(dur.size)
        self._prices: tuple[FloatArray, ...] = ()
        self._crit = np.zeros(dur.size, dtype=np.bool_)

    def cost(self) -> float:
        """The relaxation's cost of ``dur``, summed in op order."""
        ht, hs, hc, _ = self.hull
        r, x = self._rows, self.dur
        a = np.maximum((ht <= x[:, None]).sum(axis=1) - 1, 0)
        op_cost = hc[r, a] - hs[r, a] * (x - ht[r, a])
        return float(np.cumsum(op_cost)[-1]) if op_cost.size else 0.0

    def _price(self, end: FloatArray, late_finish: FloatArray) -> None:
        """The critical ops and their prices (as ``cut_capacities._update_network`` marks them and
        ``cut_capacities._price_op`` prices them)."""
        ht, hs, _, nh = self.hull
        r, dv, tol = self._rows, self.dur, self.tol
        self._crit = (late_finish - end) <= 100.0 * tol
        # Per op, its last hull vertex at or below its duration + ``tol``.
        a = np.maximum((ht <= (dv + tol)[:, None]).sum(axis=1) - 1, 0)
        at_v = (dv - ht[r, a]) <= tol
        lower_v = np.where(at_v, a - 1, a)
        faster = np.maximum(lower_v, 0)
        upper = np.where(lower_v >= 0, hs[r, faster], np.inf)
        room_red = np.where(lower_v >= 0, dv - ht[r, faster], 0.0)
        slowest = at_v & (a >= nh - 1)
        lower = np.where(slowest, 0.0, hs[r, np.minimum(a, hs.shape[1] - 1)])
        room_len = np.where(slowest, 0.0, ht[r, np.minimum(a + 1, ht.shape[1] - 1)] - dv)
        self._prices = upper, lower, room_red, room_len

    def min_cut(
        self, start: FloatArray, end: FloatArray, late_finish: FloatArray, deadline: float
    ) -> BoolArray | None:
        """The minimal source side of this plan's minimum cut (None when no finite cut exists:
        the fastest plan is reached)."""
        self._price(end, late_finish)
        n = self.dur.size
        cap = self._capacities(start, end, late_finish, deadline)
        used = cap > 0
        return minimal_source_side(
            2 * n + 2, self._arcs[0][used], self._arcs[1][used], cap[used], 2 * n, 2 * n + 1
        )

    def _capacities(
        self, start: FloatArray, end: FloatArray, late_finish: FloatArray, deadline: float
    ) -> IntArray:
        """Per arc of the network (``build_network``'s layout), the kernel's capacity."""
        _, pred_ptr, _, _, succ_ptr, succ_idx, succ_lat = self.topo.csr()
        upper, lower = self._prices[0], self._prices[1]
        crit, crit_tol, inf = self._crit, 100.0 * self.tol, INF_CAP
        term = np.where(crit, np.rint(lower * self._scale), 0.0).astype(np.int64)
        tie = np.full(term.size, self._tie_units, dtype=np.int64)
        more = term > tie  # the tie moves from the terminal arcs onto the op arc
        term[more] -= tie[more]
        tie[more] *= 2
        finite = np.where(np.isinf(upper), 0.0, (upper - lower) * self._scale)
        op = np.where(np.isinf(upper), inf, np.rint(finite).astype(np.int64) + tie)
        op[~crit] = 0
        first = crit & (np.diff(pred_ptr) == 0) & (start <= crit_tol)
        last = crit & (np.diff(succ_ptr) == 0) & (end >= deadline - crit_tol)
        edge_from = np.repeat(self._rows, np.diff(succ_ptr))
        tight = (late_finish[succ_idx] - self.dur[succ_idx]) - (
            end[edge_from] + succ_lat
        ) <= crit_tol
        edge = np.where(crit[edge_from] & crit[succ_idx] & tight, inf, np.int64(0))
        return np.concatenate(
            [op, term, term, edge, np.where(first, inf, 0), np.where(last, inf, 0)]
        ).astype(np.int64)

    def read_cut(self, side: BoolArray) -> tuple[_Move, float, float, float]:
        """The cut's move, its marginal cost, the longest step before an op reaches a hull
        vertex, and before one reaches its fastest."""
        upper, lower, room_red, room_len = self._prices
        s_start, s_end = side[0:-2:2], side[1:-2:2]
        fwd = self._crit & s_start & ~s_end
        bwd = self._crit & s_end & ~s_start & (lower > 0)
        moved = fwd | bwd
        signed = np.where(fwd, upper, -lower)[moved]
        cut_value = float(np.cumsum(signed)[-1]) if signed.size else 0.0
        exact = min(room_red[fwd].min(initial=np.inf), room_len[bwd].min(initial=np.inf))
        step_max = (self.dur[fwd] - self.hull[0][fwd, 0]).min(initial=np.inf)
        bwd_idx = np.flatnonzero(bwd)
        move = (np.flatnonzero(fwd), bwd_idx, room_len[bwd_idx])
        return move, cut_value, float(exact), float(step_max)

    def advance(self, move: _Move, step: float) -> None:
        """Take the step in place, snapping each moved op within ``tol`` of a hull vertex
        onto it."""
        ht, nh = self.hull[0], self.hull[3]
        trial = _apply(self.dur, move, step)
        moved = np.concatenate([move[0], move[1]])
        x = trial[moved]
        near = (np.abs(ht[moved] - x[:, None]) <= self.tol) & (
            np.arange(ht.shape[1]) < nh[moved][:, None]
        )
        snap = near.any(axis=1)
        first = near.argmax(axis=1)
        x[snap] = ht[moved[snap], first[snap]]
        trial[moved] = x
        self.dur[:] = trial


def _apply(dur: FloatArray, move: _Move, step: float) -> FloatArray:
    """``dur`` with the move's ops shortened (lengthened up to their room) by ``step``."""
    out = dur.copy()
    out[move[0]] -= step
    out[move[1]] += np.minimum(step, move[2])
    return out


def _step_length(walk: _Walk, move: _Move, deadline: float, step_max: float, exact: float) -> float:
    """Largest step ≤ ``step_max`` whose move shortens the iteration by the full step.

    While the makespan after a trial step is above ``deadline − δ``, a non-critical path has
    overtaken; the intersection of its tangent line with ``deadline − δ`` is the next, smaller
    candidate (path lengths are concave in δ, so the tangent never overshoots).
    """
    tol = walk.tol
    step = step_max
    for _ in range(_MAX_NEWTON):
        trial = _apply(walk.dur, move, step)
        end = walk.topo.forward(trial)[1]
        makespan = float(end.max())
        if makespan <= deadline - step + tol:
            break
        slope = _slope_on(_binding_path(walk.topo, trial, end), move, step)
        if slope <= -1.0:  # a critical path cut short by a clamp: retreat to the exact bound
            if step <= exact:
                break
            step = exact
            continue
        base = makespan - slope * step
        new = (deadline - base) / (slope + 1.0)
        if not new < step:
            break
        # Beyond the exact bound clamps bend the paths, so never undershoot it from above:
        # up to it every path length is linear in δ and the tangent step is exact.
        step = max(new, exact) if step > exact else max(new, 0.0)
    return step


def _slope_on(path: list[int], move: _Move, step: float) -> float:
    """Left derivative of the path length in δ at ``step`` (a supergradient: lengths are
    concave in δ because lengthening stops at its room)."""
    on = np.asarray(path, dtype=np.int64)
    k = -float(np.isin(move[0], on).sum())
    k += float(np.isin(move[1][move[2] >= step], on).sum())
    return k


def _binding_path(topo: Topology, time_s: FloatArray, end_s: FloatArray) -> list[int]:
    """Nodes of one longest path ending at the first latest-finishing node (sink first)."""
    node = int(np.argmax(end_s))
    t, end = time_s.tolist(), end_s.tolist()
    ptr, idx, lat = topo.pred_ptr.tolist(), topo.pred_idx.tolist(), topo.pred_lat_csr.tolist()
    path = [node]
    start = end[node] - t[node]
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


class _Emitter:
    """The walk's emitted plans: pairs of roundings of the fractional plans it passes."""

    def __init__(self, node_type: IntArray, opt_t: FloatArray, tol: float) -> None:
        self._table = opt_t[node_type]
        self._tol = tol
        self._rows: list[npt.NDArray[np.int16]] = []
        self._last: IntArray | None = None

    def emit(self, x: FloatArray) -> None:
        """Append the two roundings of ``x`` (each op's slowest option no slower, then the next
        slower where that is faster than ``x``) unless the first repeats the last."""
        table, slack = self._table, self._tol * 1e-3
        floor = np.maximum((table <= (x + slack)[:, None]).sum(axis=1) - 1, 0)
        if self._last is not None and np.array_equal(floor, self._last):
            return
        rows = np.arange(x.size)
        nxt = np.minimum(floor + 1, table.shape[1] - 1)
        up = (
            (table[rows, floor] < x - slack)
            & (floor + 1 < table.shape[1])
            & np.isfinite(table[rows, nxt])
        )
        self._rows += [floor.astype(np.int16), (floor + up).astype(np.int16)]
        self._last = floor

    def along(
        self,
        dur: FloatArray,
        move: _Move,
        step: tuple[float, float, float],
        state: FloatArray,
        targets: tuple[float, float, float],
    ) -> None:
        """Emit the plans a step passes: the first once the cut's cost reaches half the
        blocking power, then one every ``gap`` seconds, and the one at ``anchor_s``."""
        deadline, length, cut_value = step
        gap, power_ranks, anchor_s = targets
        if state[S_EMITTING] == 0.0 and cut_value >= 0.5 * power_ranks:
            state[S_EMITTING] = 1.0
            self.emit(dur)
            state[S_LAST_EMIT] = deadline
        if state[S_EMITTING] != 0.0 and gap > 0:
            target = state[S_LAST_EMIT] - gap
            while target >= deadline - length:
                self.emit(_apply(dur, move, deadline - target))
                state[S_LAST_EMIT] = target
                target -= gap
        if deadline > anchor_s >= deadline - length:
            self.emit(_apply(dur, move, deadline - anchor_s))

    def rows(self, n: int) -> npt.NDArray[np.int16]:
        if not self._rows:
            return np.empty((0, n), dtype=np.int16)
        return np.stack(self._rows)
