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
from perseus.solver.cut_capacities import (
    _capacity_scale,
    _flow_arrays,
    _min_cut,
    _op_cost,
    _op_state,
    _price_op,
    _read_cut,
    _update_network,
    _vertex_at_or_below,
)
from perseus.solver.plan_kernels import _backward, _earliest_start

__all__ = ["TIE_UNITS", "walk_kernel"]

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
def _emit(x, em, emitted, n_emitted):
    """Append the two roundings of fractional plan ``x`` to ``emitted`` (grown as needed)
    unless its floor rounding repeats the last one; returns ``(emitted, n_emitted)``. ``em``:
    ``(node_type, opt_t, tol, rounded, rounded_up, last_rounded)``, the last three scratch.

    Not a closure in :func:`walk_kernel`: numba inlines closures at every call site.
    """
    node_type, opt_t, tol, rounded, rounded_up, last_rounded = em
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
def _relaxation_cost(op_cost):
    """The relaxation's cost: the kept per-op costs summed in op order (the same float as
    summing costs computed afresh)."""
    cost = 0.0
    for v in range(op_cost.size):
        cost += op_cost[v]
    return cost


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
def _emit_along(dur, move, n_fwd, n_bwd, deadline, step, cut_value, state, limits, em, out):
    """Emit the plans this step passes (as in the tests' oracle,
    tests/solver/oracles/reference_walk.py); ``em`` is ``_emit``'s, ``out`` is ``(trial,
    emitted, n_emitted)``; returns the new ``(emitted, n_emitted)``."""
    gap, power_ranks, anchor_s = limits[2], limits[4], limits[7]
    trial, emitted, n_emitted = out
    fwd, bwd, bwd_room = move
    if state[S_EMITTING] == 0.0 and cut_value >= 0.5 * power_ranks:
        state[S_EMITTING] = 1.0
        emitted, n_emitted = _emit(dur, em, emitted, n_emitted)
        state[S_LAST_EMIT] = deadline
    if state[S_EMITTING] != 0.0 and gap > 0:
        target = state[S_LAST_EMIT] - gap
        while target >= deadline - step:
            _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - target, trial)
            emitted, n_emitted = _emit(trial, em, emitted, n_emitted)
            state[S_LAST_EMIT] = target
            target -= gap
    if deadline > anchor_s >= deadline - step:
        _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - anchor_s, trial)
        emitted, n_emitted = _emit(trial, em, emitted, n_emitted)
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
def walk_kernel(topo, hull, node_type, opt_t, dur, state, limits, net):
    """Run up to ``max_iterations`` Phillips–Dessouky steps from ``dur`` (updated in place).

    ``topo``: :meth:`~perseus.solver.paths.Topology.csr`; ``hull``: the per-op hull tables
    ``(ht, hs, hc, nh)``; ``limits``: ``(tol, quantum, gap, every_breakpoint, power_ranks,
    max_iterations, tie_units, anchor_s)``; ``net``: ``build_network``'s. Returns ``(emitted
    option indices (K, N) int16, lp_time_s, lp_energy_j, iterations)``; emitted rows come in
    pairs per fractional plan (rounded down, rounded up). ``tie_units`` (0 or
    :data:`TIE_UNITS`) breaks ties between equally cheap cuts towards moving fewer ops.
    ``state[S_DONE]`` is set when the walk ends (``DONE_*``). The fractional plan at
    ``anchor_s`` (the no-slowdown time) is always emitted.
    """
    n, order, max_iterations = dur.size, topo[0], limits[5]
    prices = (np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))  # up, low, rooms red/len
    op_cost = _op_state(hull, dur, limits[0], prices)
    # The longest-path pass recomputes only what changed since the last one (_forward_again).
    pos = np.empty(n, dtype=np.int64)
    for i in range(n):
        pos[order[i]] = i
    kept = (pos, np.full(n, np.nan), np.zeros(n, np.int8))
    rounded, rounded_up = np.empty(n, dtype=np.int16), np.empty(n, dtype=np.int16)
    em = (node_type, opt_t, limits[0], rounded, rounded_up, np.full(n, -1, dtype=np.int16))
    paths = (np.empty(n), np.empty(n), np.empty(n), np.empty(n))  # start, end, late s/f
    move = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n))
    # trial, room_of, mark, crit, side, stale (see _update_network)
    scratch = (np.empty(n), np.zeros(n), np.zeros(n, np.int8), np.zeros(n, np.bool_))
    work = (*scratch, np.zeros(2 * n + 2, dtype=np.bool_), np.zeros(n + 1, np.bool_))
    # The cut network's flow is kept between iterations (few capacities change).
    capa, res, stack_n, stack_a, trees = _flow_arrays(net, n)
    flow = (net, capa, res, stack_n, stack_a, trees[-1])
    lp = (np.empty(max_iterations + 1), np.empty(max_iterations + 1))
    costs = (op_cost, prices, _capacity_scale(hull[1]))
    return _walk(
        topo, hull, dur, state, costs, kept, em, limits, paths, move, work, flow, trees, lp
    )


@_jit_inline
def _walk(topo, hull, dur, state, costs, kept, em, limits, paths, move, work, flow, trees, lp):
    """:func:`walk_kernel`'s loop, on the arrays it made."""
    order, succ_ptr, succ_idx, succ_lat = topo[0], topo[4], topo[5], topo[6]
    tol, quantum, every_breakpoint, power_ranks, max_iterations = (
        limits[0],
        limits[1],
        limits[3],
        limits[4],
        limits[5],
    )
    op_cost, prices, scale = costs
    trial, room_of, mark, crit, side, stale = work
    net, capa, res = flow[0], flow[1], flow[2]
    lp_t, lp_e = lp
    emitted = np.empty((16, dur.size), dtype=np.int16)
    n_emitted = np.int64(0)  # not a literal: see _read_cut
    n_lp = iterations = 0
    while iterations < max_iterations:
        deadline = _forward_again(topo, dur, paths[0], paths[1], kept)
        _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, paths[2], paths[3])
        lp_t[n_lp] = deadline
        lp_e[n_lp] = _relaxation_cost(op_cost) + power_ranks * deadline
        n_lp += 1
        stalled = _stalled(state, deadline, tol)
        ok = stalled or _update_network(
            topo, paths, crit, deadline, tol, scale, limits[6], prices, stale, flow
        )
        if stalled or not _min_cut(net, capa, res, ok, trees, side):
            emitted, n_emitted = _emit(dur, em, emitted, n_emitted)
            state[S_DONE] = DONE_STALLED if stalled else DONE_FASTEST
            break
        n_fwd, n_bwd, cut_value, exact, step_max = _read_cut(
            side, crit, dur, hull[0], prices, move, mark, room_of
        )
        iterations += 1
        step_max = min(max(exact, quantum), step_max)
        step = _step_length(
            topo,
            dur,
            move,
            n_fwd,
            n_bwd,
            deadline,
            step_max,
            exact,
            tol,
            (trial, paths[0], paths[1], mark, room_of),
            kept,
        )
        if step <= 0.0:
            emitted, n_emitted = _emit(dur, em, emitted, n_emitted)
            state[S_DONE] = DONE_NO_STEP
            break
        emitted, n_emitted = _emit_along(
            dur,
            move,
            n_fwd,
            n_bwd,
            deadline,
            step,
            cut_value,
            state,
            limits,
            em,
            (trial, emitted, n_emitted),
        )
        _advance(dur, move, n_fwd, n_bwd, step, hull, tol, trial, op_cost, prices, stale)
        if every_breakpoint and state[S_EMITTING] != 0.0:
            emitted, n_emitted = _emit(dur, em, emitted, n_emitted)
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
