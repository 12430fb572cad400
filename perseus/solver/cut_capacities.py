"""The frontier walk's cut network, priced: per op, its hull segment's cost and slopes; from
them the capacities of the critical sub-DAG's network (:mod:`perseus.solver.cut_network`), its
min cut, and the ops that cut moves. Compiled with numba as part of
:func:`perseus.solver.compiled.walk_kernel` (whose complexity notes cover these steps).
"""

from __future__ import annotations

import numpy as np

from perseus.solver.aot import jit as _jit
from perseus.solver.aot import jit_inline as _jit_inline
from perseus.solver.aot import jit_noalloc as _jit_noalloc
from perseus.solver.cut_network import INF_CAP as _INF_CAP
from perseus.solver.cut_network import augment as _augment
from perseus.solver.cut_network import keep_balanced as _keep_balanced
from perseus.solver.cut_network import search_arrays as _search_arrays
from perseus.solver.cut_network import set_capacity as _set_capacity

__all__: list[str] = []

_BUDGET = 2.0**52


@_jit_noalloc
def _vertex_at_or_below(ht, v, x):
    """Index of the last hull vertex of node ``v`` with time ≤ x (-1 if none)."""
    a = -1
    for j in range(ht.shape[1]):
        if ht[v, j] <= x:
            a = j
        else:
            break
    return a


@_jit_inline
def _op_cost(ht, hs, hc, v, x):
    """The relaxation's cost of op ``v`` at fractional duration ``x`` (on its hull)."""
    a = max(_vertex_at_or_below(ht, v, x), 0)
    return hc[v, a] - hs[v, a] * (x - ht[v, a])


@_jit_noalloc  # called from two places: compiled once
def _price_op(v, dv, seg_v, hull, tol, prices):
    """Price op ``v`` at duration ``dv``: the next-faster segment's slope (``upper``, inf at the
    fastest vertex) and room, the next-slower one's (``lower``, 0 at the slowest)."""
    ht, hs, nh = hull[0], hull[1], hull[3]
    upper, lower, room_red, room_len = prices
    a = max(seg_v, 0)
    at_v = (dv - ht[v, a]) <= tol
    lower_v = a - 1 if at_v else a
    if lower_v >= 0:
        upper[v] = hs[v, lower_v]
        room_red[v] = dv - ht[v, lower_v]
    else:
        upper[v] = np.inf
        room_red[v] = 0.0
    if at_v and a >= nh[v] - 1:
        lower[v] = 0.0
        room_len[v] = 0.0
    else:
        lower[v] = hs[v, min(a, hs.shape[1] - 1)]
        room_len[v] = ht[v, min(a + 1, ht.shape[1] - 1)] - dv


@_jit_inline
def _update_network(topo, paths, crit, deadline, tol, scale, tie_units, prices, stale, flow):
    """Mark the critical ops; give the cut network their prices (next-faster slope: upper,
    next-slower: lower) as capacities, ``tie_units`` more per moved op (ties go to cuts moving
    fewer ops). Only ops whose capacities may have changed are looked at: those whose
    criticality changed, moved last step (``stale``, cleared here) or that start or end the
    DAG; the calls made are those of a pass over every op, in the same order. ``stale[n]``
    asks for every op and edge (after a failed update). False when a cancellation overflowed
    its stack (restart from zero)."""
    pred_ptr, succ_ptr = topo[1], topo[4]
    end, late_finish = paths[1], paths[3]
    crit_tol = 100.0 * tol
    n = crit.size
    full = stale[n]
    ok = True
    for v in range(n):
        was = crit[v]
        crit[v] = (late_finish[v] - end[v]) <= crit_tol
        # Bitwise, not short-circuit: fewer branches to mispredict.
        stale[v] = (
            stale[v]
            | full
            | (crit[v] != was)
            | (pred_ptr[v] == pred_ptr[v + 1])
            | (succ_ptr[v] == succ_ptr[v + 1])
        )
        if stale[v]:
            ok &= _set_op_capacities(
                v, topo, paths, crit, deadline, crit_tol, scale, tie_units, prices, flow
            )
        stale[v] = crit[v] | was  # until cleared: its dependency arcs may carry capacity
    ok &= _set_edge_capacities(topo, paths, crit, crit_tol, stale, full, flow)
    for v in range(n):
        stale[v] = False
    stale[n] = not ok
    return ok


@_jit_noalloc
def _set_op_capacities(v, topo, paths, crit, deadline, crit_tol, scale, tie_units, prices, flow):
    """Op ``v``'s arcs get their capacities from its prices (none unless critical); False when
    a cancellation overflowed its stack."""
    pred_ptr, succ_ptr = topo[1], topo[4]
    start, end = paths[0], paths[1]
    upper, lower = prices[0], prices[1]
    capa, res, changed = flow[1], flow[2], flow[5]
    fs, rs = flow[0][6], flow[0][7]
    n = crit.size
    n_edges = capa.size - 5 * n
    ok = True
    op_cap = term_cap = src_cap = snk_cap = np.int64(0)
    if crit[v]:
        term_cap = np.int64(np.rint(lower[v] * scale))
        tie = np.int64(tie_units)
        if term_cap > tie:
            term_cap -= tie
            tie *= 2
        op_cap = _INF_CAP
        if upper[v] != np.inf:
            op_cap = np.int64(np.rint((upper[v] - lower[v]) * scale)) + tie
        if pred_ptr[v] == pred_ptr[v + 1] and start[v] <= crit_tol:
            src_cap = _INF_CAP
        if succ_ptr[v] == succ_ptr[v + 1] and end[v] >= deadline - crit_tol:
            snk_cap = _INF_CAP
    if capa[v] != op_cap or capa[n + v] != term_cap:
        _keep_balanced(v, n, op_cap, term_cap, capa, fs, rs, res, changed)
    arcs = ((v, op_cap), (n + v, term_cap), (2 * n + v, term_cap))  # op, 2 terminals
    for k, new in (*arcs, (3 * n + n_edges + v, src_cap), (4 * n + n_edges + v, snk_cap)):
        if capa[k] != new:
            ok &= _set_capacity(k, new, flow)
    return ok


@_jit_inline
def _set_edge_capacities(topo, paths, crit, crit_tol, was_crit, full, flow):
    """Dependency arcs: infinite where both ops are critical and the edge is tight, else
    none (those of ops neither critical nor ``was_crit`` already have none, unless ``full``);
    False when a cancellation overflowed its stack."""
    succ_ptr, succ_idx, succ_lat = topo[4], topo[5], topo[6]
    end, late_start = paths[1], paths[2]
    capa = flow[1]
    n = crit.size
    ok = True
    for v in range(n):
        if not (was_crit[v] or full):
            continue
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[e]
            c = np.int64(0)
            if crit[v] & crit[w] & (late_start[w] - (end[v] + succ_lat[e]) <= crit_tol):
                c = _INF_CAP
            if capa[3 * n + e] != c:
                ok &= _set_capacity(3 * n + e, c, flow)
    return ok


@_jit_inline
def _read_cut(side, crit, dur, ht, prices, move, mark, room_of):
    """The ops the cut shortens (``move[0]``, marked 1) and lengthens (``move[1]``, rooms in
    ``move[2]``, marked 2); returns ``(n_fwd, n_bwd, cut_value, exact, step_max)``: the
    marginal cost, the longest step before an op reaches a hull vertex, and its fastest."""
    upper, lower, room_red, room_len = prices
    fwd, bwd, bwd_room = move
    # np.int64, not a literal 0: numba would compile a literal specialisation of callees.
    n_fwd = np.int64(0)
    n_bwd = np.int64(0)
    cut_value = 0.0
    exact = np.inf
    step_max = np.inf
    for v in range(dur.size):
        if not crit[v]:
            continue
        if side[2 * v] and not side[2 * v + 1]:
            fwd[n_fwd] = v
            n_fwd += 1
            cut_value += upper[v]
            exact = min(exact, room_red[v])
            step_max = min(step_max, dur[v] - ht[v, 0])
            mark[v] = 1
        elif side[2 * v + 1] and not side[2 * v] and lower[v] > 0:
            bwd[n_bwd] = v
            bwd_room[n_bwd] = room_len[v]
            n_bwd += 1
            cut_value -= lower[v]
            exact = min(exact, room_len[v])
            mark[v] = 2
            room_of[v] = room_len[v]
    return n_fwd, n_bwd, cut_value, exact, step_max


@_jit
def _op_state(hull, dur, tol, prices):
    """Per op, its relaxation cost and prices (at its hull segment: the last vertex at or
    below its duration + ``tol``), kept between iterations; returns the costs."""
    ht, hs, hc = hull[0], hull[1], hull[2]
    op_cost = np.empty(dur.size)
    for v in range(dur.size):
        op_cost[v] = _op_cost(ht, hs, hc, v, dur[v])
        _price_op(v, dur[v], _vertex_at_or_below(ht, v, dur[v] + tol), hull, tol, prices)
    return op_cost


@_jit
def _capacity_scale(hs):
    """One capacity scale for the whole walk (so kept flows stay valid); every finite
    capacity is at most an op's steepest slope."""
    total = 0.0
    for v in range(hs.shape[0]):
        total += 3.0 * hs[v, 0]
    return _BUDGET / total if total > 0 else 1.0


@_jit
def _flow_arrays(net, n):
    """Zero flow on the cut network ``net``, and empty search trees for it."""
    m_arcs = net[0].size
    n_net = 2 * n + 2
    capa = np.zeros(m_arcs, dtype=np.int64)
    res = np.zeros(2 * m_arcs, dtype=np.int64)
    stack_n = np.empty(4 * m_arcs, dtype=np.int64)
    stack_a = np.empty(4 * m_arcs, dtype=np.int64)
    return capa, res, stack_n, stack_a, _search_arrays(n_net, res.size)


@_jit_inline
def _min_cut(net, capa, res, ok, trees, side):
    """Re-augment the kept flow to a maximum one (from zero when ``ok`` is False) and fill
    ``side``; False when no finite cut exists (the fastest plan is reached)."""
    ptr, to, twin, fs = net[2], net[3], net[4], net[6]
    if not ok:  # cancellation overflowed its stack: start this cut from zero flow
        for k in range(res.size):
            res[k] = 0
        for k in range(capa.size):
            res[fs[k]] = capa[k]
        trees[-1][0] = -1  # every slot changed
    n_net = ptr.size - 1  # _augment writes every entry of side
    return _augment(n_net - 2, n_net - 1, ptr, to, twin, res, trees, side)
