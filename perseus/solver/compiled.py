"""The frontier walk's inner loop, compiled with numba (cached on disk, imported lazily).

Each iteration is a few longest-path passes over CSR lists, a min cut of the critical
sub-DAG on a network whose flow is kept between iterations (:mod:`perseus.solver.cut_network`)
and a step-length search, on per-node hull tables ``ht`` (vertex times, ``inf``-padded) and
``hs`` (segment slopes). Complexity per iteration: O(N + E) for the backward pass and for
checking which capacities change; O(N) plus the ops whose finish changed for each forward
pass (1–3: only those are recomputed); O(M·H) to re-price the M ops moved (H hull vertices);
and a re-augmentation costing about what the update changed (only the ops that moved or
changed criticality get new capacities).
"""

from __future__ import annotations

import numpy as np

from perseus.solver.aot import ahead_of_time
from perseus.solver.aot import jit as _jit
from perseus.solver.aot import jit_inline as _jit_inline  # per-iteration helpers
from perseus.solver.aot import jit_noalloc as _jit_noalloc
from perseus.solver.cut_network import INF_CAP as _INF_CAP
from perseus.solver.cut_network import augment as _augment
from perseus.solver.cut_network import keep_balanced as _keep_balanced
from perseus.solver.cut_network import search_arrays as _search_arrays
from perseus.solver.cut_network import set_capacity as _set_capacity
from perseus.solver.plan_kernels import _backward, _earliest_start

__all__ = ["TIE_UNITS", "walk_kernel"]

_BUDGET = 2.0**52
#: Tie-break cost per moved op, in capacity units (outweighs rounding capacities to integers).
TIE_UNITS = 64
_MAX_NEWTON = 64
_MAX_STALL = 200

# Layout of the walk's persistent scalar state (a float64 array, so a walk can be resumed).
S_EMITTING, S_LAST_EMIT, S_BEST_DEADLINE, S_STALLED, S_DONE = 0, 1, 2, 3, 4
STATE_SIZE = 5
# Why a walk ended (the value of ``state[S_DONE]``).
DONE_FASTEST, DONE_STALLED, DONE_NO_STEP = 1.0, 2.0, 3.0


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


@_jit_noalloc
def _round_into(dur, node_type, opt_t, tol, out):
    """Per node, the slowest option no slower than its fractional duration."""
    for v in range(dur.size):
        row = node_type[v]
        x = dur[v] + tol * 1e-3
        k = 0
        for j in range(opt_t.shape[1]):
            if opt_t[row, j] <= x:
                k = j
            else:
                break
        out[v] = k


@_jit_noalloc
def _round_up_into(dur, node_type, opt_t, floor, tol, out):
    """Per node, the fastest option no faster than its fractional duration (``floor`` is
    :func:`_round_into`'s result)."""
    for v in range(dur.size):
        k = floor[v]
        row = node_type[v]
        if (
            opt_t[row, k] < dur[v] - tol * 1e-3
            and k + 1 < opt_t.shape[1]
            and np.isfinite(opt_t[row, k + 1])
        ):
            k += 1
        out[v] = k


@_jit_noalloc
def _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, out):
    for v in range(dur.size):
        out[v] = dur[v]
    for i in range(n_fwd):
        out[fwd[i]] -= step
    for i in range(n_bwd):
        out[bwd[i]] += min(step, bwd_room[i])


@_jit_noalloc
def _binding_slope(pred_ptr, pred_idx, pred_lat, trial, end, mark, room, step):
    """Left derivative in δ of one longest path of ``trial`` (sink first, first maximum)."""
    node = 0
    best = -np.inf
    for v in range(end.size):
        if end[v] > best:
            best = end[v]
            node = v
    slope = 0.0
    while True:
        if mark[node] == 1:
            slope -= 1.0
        elif mark[node] == 2 and room[node] >= step:
            slope += 1.0
        start = end[node] - trial[node]
        best_u = -1
        best = -np.inf
        for k in range(pred_ptr[node], pred_ptr[node + 1]):
            r = end[pred_idx[k]] + pred_lat[k]
            if r > best:
                best = r
                best_u = pred_idx[k]
        if best_u < 0 or best < start - 1e-12 * max(1.0, abs(start)):
            return slope
        node = best_u


@_jit
def _emit(x, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted):
    """Append the two roundings of fractional plan ``x`` to ``emitted`` (grown as needed)
    unless its floor rounding repeats the last one; returns ``(emitted, n_emitted)``.

    Not a closure in :func:`walk_kernel`: numba inlines closures at every call site.
    """
    n = x.size
    _round_into(x, node_type, opt_t, tol, rounded)
    same = True
    for v in range(n):
        if rounded[v] != last_rounded[v]:
            same = False
            break
    if same:
        return emitted, n_emitted
    # Element loops, not slice assignments (see _grown).
    if n_emitted + 2 > emitted.shape[0]:
        grown = np.empty((2 * emitted.shape[0], n), dtype=np.int16)
        for r in range(n_emitted):
            for v in range(n):
                grown[r, v] = emitted[r, v]
        emitted = grown
    _round_up_into(x, node_type, opt_t, rounded, tol, rounded_up)
    for v in range(n):
        emitted[n_emitted, v] = rounded[v]
        emitted[n_emitted + 1, v] = rounded_up[v]
        last_rounded[v] = rounded[v]
    return emitted, n_emitted + 2


@_jit_inline
def _op_cost(ht, hs, hc, v, x):
    """The relaxation's cost of op ``v`` at fractional duration ``x`` (on its hull)."""
    a = max(_vertex_at_or_below(ht, v, x), 0)
    return hc[v, a] - hs[v, a] * (x - ht[v, a])


@_jit_inline
def _relaxation_cost(op_cost):
    """The relaxation's cost: the kept per-op costs summed in op order (the same float as
    summing costs computed afresh)."""
    cost = 0.0
    for v in range(op_cost.size):
        cost += op_cost[v]
    return cost


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
            stale[v] | full | (crit[v] != was)
            | (pred_ptr[v] == pred_ptr[v + 1]) | (succ_ptr[v] == succ_ptr[v + 1])
        )  # fmt: skip
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


@_jit_noalloc
def _set_op_capacities(v, topo, paths, crit, deadline, crit_tol, scale, tie_units, prices, flow):  # fmt: skip
    """Op ``v``'s arcs get their capacities from its prices (none unless critical); False when
    a cancellation overflowed its stack."""
    pred_ptr, succ_ptr = topo[1], topo[4]
    start, end = paths[0], paths[1]
    upper, lower = prices[0], prices[1]
    net, capa, res, stack_n, stack_a, changed = flow
    a_src, a_dst, ptr, to, twin, is_fwd, fs, rs = net
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
            ok &= _set_capacity(
                k, new, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res, 2 * n, 2 * n + 1,
                stack_n, stack_a, changed,
            )  # fmt: skip
    return ok


@_jit_inline
def _set_edge_capacities(topo, paths, crit, crit_tol, was_crit, full, flow):
    """Dependency arcs: infinite where both ops are critical and the edge is tight, else
    none (those of ops neither critical nor ``was_crit`` already have none, unless ``full``);
    False when a cancellation overflowed its stack."""
    succ_ptr, succ_idx, succ_lat = topo[4], topo[5], topo[6]
    end, late_start = paths[1], paths[2]
    net, capa, res, stack_n, stack_a, changed = flow
    a_src, a_dst, ptr, to, twin, is_fwd, fs, rs = net
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
                ok &= _set_capacity(
                    3 * n + e, c, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    2 * n, 2 * n + 1, stack_n, stack_a, changed,
                )  # fmt: skip
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


@_jit_noalloc  # not inlined: called from two places, compiled once
def _forward_again(topo, x, start, end, kept):
    """Earliest start/finish of durations ``x`` in place (as ``plan_kernels._forward``, the
    same floats), recomputing only the ops whose duration or some predecessor's finish changed
    since the last call; returns the makespan. ``kept``: (position of each op in ``order``,
    the durations last seen (NaN: none), int8 scratch by position, all zero between calls)."""
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx = topo[:6]
    pos, seen, dirty = kept
    n = x.size
    first = n
    for v in range(n):
        if x[v] != seen[v]:
            seen[v] = x[v]
            dirty[pos[v]] = 1
            first = min(first, pos[v])
    for i in range(first, n):
        if dirty[i] == 0:
            continue
        dirty[i] = 0
        v = order[i]
        s = _earliest_start(v, pred_ptr, pred_idx, pred_lat, end)
        start[v] = s
        e = s + x[v]
        if e != end[v]:
            end[v] = e
            for k in range(succ_ptr[v], succ_ptr[v + 1]):
                dirty[pos[succ_idx[k]]] = 1
    makespan = 0.0
    for v in range(n):
        makespan = max(makespan, end[v])
    return makespan


@_jit_inline
def _step_length(topo, dur, move, n_fwd, n_bwd, deadline, step_max, exact, tol, work, kept):
    """Step length: Newton on the makespan along the move (as in the tests' oracle,
    tests/solver/oracles/reference_walk.py); ``work`` is (trial, start, end, mark, room_of),
    the marks cleared on return; ``kept``: :func:`_forward_again`'s."""
    pred_ptr, pred_idx, pred_lat = topo[1], topo[2], topo[3]
    fwd, bwd, bwd_room = move
    trial, start, end, mark, room_of = work
    step = step_max
    for _ in range(_MAX_NEWTON):
        _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, trial)
        makespan = _forward_again(topo, trial, start, end, kept)
        if makespan <= deadline - step + tol:
            break
        slope = _binding_slope(pred_ptr, pred_idx, pred_lat, trial, end, mark, room_of, step)
        if slope <= -1.0:
            if step <= exact:
                break
            step = exact
            continue
        base = makespan - slope * step
        new = (deadline - base) / (slope + 1.0)
        if not new < step:
            break
        step = max(new, exact) if step > exact else max(new, 0.0)
    for i in range(n_fwd):
        mark[fwd[i]] = 0
    for i in range(n_bwd):
        mark[bwd[i]] = 0
        room_of[bwd[i]] = 0.0
    return step


@_jit_inline
def _emit_along(
    dur, move, n_fwd, n_bwd, deadline, step, cut_value, state, gap, power_ranks, anchor_s, em
):
    """Emit the plans this step passes (as in the tests' oracle,
    tests/solver/oracles/reference_walk.py); ``em`` is ``_emit``'s arguments with ``trial``
    for ``x``; returns the new ``(emitted, n_emitted)``."""
    node_type, opt_t, tol, trial, rounded, rounded_up, last_rounded, emitted, n_emitted = em
    fwd, bwd, bwd_room = move
    if state[S_EMITTING] == 0.0 and cut_value >= 0.5 * power_ranks:
        state[S_EMITTING] = 1.0
        emitted, n_emitted = _emit(
            dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
        )
        state[S_LAST_EMIT] = deadline
    if state[S_EMITTING] != 0.0 and gap > 0:
        target = state[S_LAST_EMIT] - gap
        while target >= deadline - step:
            _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - target, trial)
            emitted, n_emitted = _emit(
                trial, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
            state[S_LAST_EMIT] = target
            target -= gap
    if deadline > anchor_s >= deadline - step:
        _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - anchor_s, trial)
        emitted, n_emitted = _emit(
            trial, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
        )
    return emitted, n_emitted


@_jit_inline
def _advance(dur, move, n_fwd, n_bwd, step, hull, tol, trial, op_cost, prices, stale):
    """Take the step in place, snapping moved ops within ``tol`` of a hull vertex onto it;
    update their costs and prices, and mark them ``stale``."""
    ht, hs, hc, nh = hull
    fwd, bwd, bwd_room = move
    _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, trial)
    for i in range(n_fwd + n_bwd):
        v = fwd[i] if i < n_fwd else bwd[i - n_fwd]
        x = trial[v]
        for j in range(nh[v]):
            if abs(ht[v, j] - x) <= tol:
                x = ht[v, j]
                break
        trial[v] = x
        op_cost[v] = _op_cost(ht, hs, hc, v, x)
        _price_op(v, x, _vertex_at_or_below(ht, v, x + tol), hull, tol, prices)
        stale[v] = True
    for v in range(dur.size):
        dur[v] = trial[v]


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


@_jit
def walk_kernel(
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat, ht, hs, hc, nh, node_type,
    opt_t, dur, state, tol, quantum, gap, every_breakpoint, power_ranks, max_iterations,
    tie_units, anchor_s, net,
):  # fmt: skip
    """Run up to ``max_iterations`` Phillips–Dessouky steps from ``dur`` (updated in place).

    Returns ``(emitted option indices (K, N) int16, lp_time_s, lp_energy_j, iterations)``;
    emitted rows come in pairs per fractional plan (rounded down, rounded up). ``tie_units``
    (0 or :data:`TIE_UNITS`) breaks ties between equally cheap cuts towards moving fewer ops.
    ``state[S_DONE]`` is set when the walk ends (``DONE_*``). The fractional plan at
    ``anchor_s`` (the no-slowdown time) is always emitted. ``net``: ``build_network``'s.
    """
    n = dur.size
    topo = (order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat)
    hull = (ht, hs, hc, nh)
    paths = (np.empty(n), np.empty(n), np.empty(n), np.empty(n))  # start, end, late s/f
    trial, room_of = np.empty(n), np.zeros(n)
    mark, crit = np.zeros(n, np.int8), np.zeros(n, np.bool_)
    prices = (np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))  # up, low, rooms red/len
    move = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n))
    # The cut network's flow is kept between iterations (few capacities change).
    capa, res, stack_n, stack_a, trees = _flow_arrays(net, n)
    op_cost = _op_state(hull, dur, tol, prices)
    stale = np.zeros(n + 1, np.bool_)  # see _update_network
    # The longest-path pass recomputes only what changed since the last one (_forward_again).
    pos = np.empty(n, dtype=np.int64)
    for i in range(n):
        pos[order[i]] = i
    kept = (pos, np.full(n, np.nan), np.zeros(n, np.int8))
    side = np.zeros(2 * n + 2, dtype=np.bool_)
    scale = _capacity_scale(hs)
    rounded, rounded_up = np.empty(n, dtype=np.int16), np.empty(n, dtype=np.int16)
    last_rounded = np.full(n, -1, dtype=np.int16)
    emitted = np.empty((16, n), dtype=np.int16)
    n_emitted = np.int64(0)  # not a literal: see _read_cut
    lp_t, lp_e = np.empty(max_iterations + 1), np.empty(max_iterations + 1)
    n_lp = iterations = 0
    while iterations < max_iterations:
        deadline = _forward_again(topo, dur, paths[0], paths[1], kept)
        _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, paths[2], paths[3])
        lp_t[n_lp] = deadline
        lp_e[n_lp] = _relaxation_cost(op_cost) + power_ranks * deadline
        n_lp += 1
        stalled = _stalled(state, deadline, tol)
        ok = stalled or _update_network(
            topo, paths, crit, deadline, tol, scale, tie_units, prices, stale,
            (net, capa, res, stack_n, stack_a, trees[-1]),
        )  # fmt: skip
        if stalled or not _min_cut(net, capa, res, ok, trees, side):
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
            state[S_DONE] = DONE_STALLED if stalled else DONE_FASTEST
            break
        n_fwd, n_bwd, cut_value, exact, step_max = _read_cut(
            side, crit, dur, ht, prices, move, mark, room_of
        )
        iterations += 1
        step_max = min(max(exact, quantum), step_max)
        step = _step_length(
            topo, dur, move, n_fwd, n_bwd, deadline, step_max, exact, tol,
            (trial, paths[0], paths[1], mark, room_of), kept,
        )  # fmt: skip
        if step <= 0.0:
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
            state[S_DONE] = DONE_NO_STEP
            break
        emitted, n_emitted = _emit_along(
            dur, move, n_fwd, n_bwd, deadline, step, cut_value, state, gap, power_ranks, anchor_s,
            (node_type, opt_t, tol, trial, rounded, rounded_up, last_rounded, emitted, n_emitted),
        )  # fmt: skip
        _advance(dur, move, n_fwd, n_bwd, step, hull, tol, trial, op_cost, prices, stale)
        if every_breakpoint and state[S_EMITTING] != 0.0:
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
    return emitted[:n_emitted].copy(), lp_t[:n_lp].copy(), lp_e[:n_lp].copy(), iterations


@_jit_inline
def _stalled(state, deadline, tol):
    """Record the best deadline so far; True once the walk made no progress (shortening
    beyond float noise) for too long."""
    if deadline < state[S_BEST_DEADLINE] - tol:
        state[S_BEST_DEADLINE] = deadline
        state[S_STALLED] = 0.0
        return False
    state[S_STALLED] += 1.0
    return state[S_STALLED] > _MAX_STALL


# Called from Python only: the native one where it was built (perseus.solver.aot).
walk_kernel = ahead_of_time("walk_kernel", walk_kernel)
