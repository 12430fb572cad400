"""The frontier tracer's inner loops, compiled with numba.

The Phillips–Dessouky walk visits every breakpoint of the relaxation: thousands to hundreds of
thousands of iterations, each a few longest-path passes, a min cut of the critical sub-DAG and
a step-length search. In Python each iteration costs milliseconds of interpreter and call
overhead (scipy's ``maximum_flow`` alone spends half its time validating its input); compiled,
it costs microseconds to tens of microseconds. Everything here works on plain arrays:

* the DAG as CSR predecessor/successor lists plus a topological order;
* per-node hull tables ``ht`` (vertex times, ``inf``-padded) and ``hs`` (segment slopes);
* per-type option tables for rounding and slack reclaiming.

The min cut is a max flow on one network over all ops whose flow is kept from one iteration
to the next (:mod:`perseus.solver.cut_network`).

Compiled functions are cached on disk by numba (``cache=True``): the first use in a fresh
environment compiles for about 15 s, later processes load the cache in well under a second.
This module is imported lazily by the solver so that ``import perseus.solver`` stays light.

Complexity per walk iteration: O(N + E) for each longest-path pass (2–4 per iteration) and
for the capacity update, O(N·H) for the relaxation's cost (H hull vertices per op), and the
re-augmentation (Dinic, O(V²E) worst case; one or two phases on pipeline DAGs).
"""

from __future__ import annotations

import numpy as np

from perseus.solver.cut_network import INF_CAP as _INF_CAP
from perseus.solver.cut_network import augment as _augment
from perseus.solver.cut_network import build_network as _build_network
from perseus.solver.cut_network import jit as _jit
from perseus.solver.cut_network import set_capacity as _set_capacity

__all__ = [
    "TIE_UNITS",
    "backward_pass",
    "evaluate_kernel",
    "forward_pass",
    "neighbour_kernel",
    "reclaim_kernel",
    "tighten_kernel",
    "walk_kernel",
]

_BUDGET = 2.0**52
#: Tie-break cost per moved op, in capacity units (~1e-7 of an op's steepest slope; enough to
#: outweigh the rounding of a few dozen capacities to integers).
TIE_UNITS = 64
_MAX_NEWTON = 64
_MAX_STALL = 200

# Layout of the walk's persistent scalar state (a float64 array, so a walk can be resumed).
S_EMITTING, S_LAST_EMIT, S_BEST_DEADLINE, S_STALLED, S_DONE = 0, 1, 2, 3, 4
STATE_SIZE = 5
# Why a walk ended (the value of ``state[S_DONE]``).
DONE_FASTEST, DONE_STALLED, DONE_NO_STEP = 1.0, 2.0, 3.0


@_jit
def _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end):
    """Earliest start/finish in place; returns the makespan."""
    makespan = 0.0
    for v in order:
        s = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            r = end[pred_idx[k]] + pred_lat[k]
            if r > s:
                s = r
        start[v] = s
        e = s + dur[v]
        end[v] = e
        if e > makespan:
            makespan = e
    return makespan


@_jit
def _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, late_start, late_finish):
    """Latest finish in place so that everything ends by ``deadline``."""
    for i in range(order.size - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            r = late_start[succ_idx[k]] - succ_lat[k]
            if r < lf:
                lf = r
        late_finish[v] = lf
        late_start[v] = lf - dur[v]


#: The longest-path passes for callers outside the kernels (:class:`perseus.solver.paths.Topology`).
forward_pass = _forward
backward_pass = _backward


@_jit
def _vertex_at_or_below(ht, v, x):
    """Index of the last hull vertex of node ``v`` with time ≤ x (-1 if none)."""
    a = -1
    for j in range(ht.shape[1]):
        if ht[v, j] <= x:
            a = j
        else:
            break
    return a


@_jit
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


@_jit
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


@_jit
def _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, out):
    for v in range(dur.size):
        out[v] = dur[v]
    for i in range(n_fwd):
        out[fwd[i]] -= step
    for i in range(n_bwd):
        out[bwd[i]] += min(step, bwd_room[i])


@_jit
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

    A function of its own rather than a closure in :func:`walk_kernel`: numba would inline
    a closure at each of its call sites, which tripled the walk's compile time.
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


@_jit
def walk_kernel(
    order,
    pred_ptr,
    pred_idx,
    pred_lat,
    succ_ptr,
    succ_idx,
    succ_lat,
    ht,
    hs,
    hc,
    nh,
    node_type,
    opt_t,
    dur,
    state,
    tol,
    quantum,
    gap,
    every_breakpoint,
    power_ranks,
    max_iterations,
    tie_units,
    anchor_s,
):
    """Run up to ``max_iterations`` Phillips–Dessouky steps from ``dur`` (updated in place).

    Returns ``(emitted option indices (K, N) int16, lp_time_s, lp_energy_j, iterations)``;
    emitted rows come in pairs per fractional plan: each op rounded to its slowest option no
    slower than its duration, then each to the next slower option where it was fractional.
    ``tie_units`` (0 or :data:`TIE_UNITS`) breaks ties between equally cheap cuts towards
    moving fewer ops; with 0 Dinic's cut nearest the source wins.
    ``state[S_DONE]`` becomes 1 when the walk reached the fastest plan (or stalled).
    The fractional plan at ``anchor_s`` (the all-max time: the no-slowdown plan) is always
    emitted when the walk passes it.
    """
    n = dur.size
    n_edges = succ_idx.size
    start = np.empty(n)
    end = np.empty(n)
    late_start = np.empty(n)
    late_finish = np.empty(n)
    trial = np.empty(n)
    crit = np.zeros(n, dtype=np.bool_)
    upper = np.zeros(n)
    lower = np.zeros(n)
    room_red = np.zeros(n)
    room_len = np.zeros(n)
    fwd = np.empty(n, dtype=np.int64)
    bwd = np.empty(n, dtype=np.int64)
    bwd_room = np.empty(n)
    mark = np.zeros(n, dtype=np.int8)
    room_of = np.zeros(n)
    # The cut network over all ops, its flow kept from one iteration to the next (warm start):
    # between iterations only a few capacities change, so a few augmentations restore a
    # maximum flow.
    a_src, a_dst, ptr, to, twin, is_fwd, fs, rs = _build_network(n, pred_ptr, succ_ptr, succ_idx)
    m_arcs = a_src.size
    n_net = 2 * n + 2
    net_source, net_sink = 2 * n, 2 * n + 1
    capa = np.zeros(m_arcs, dtype=np.int64)
    res = np.zeros(2 * m_arcs, dtype=np.int64)
    level = np.full(n_net, -1, dtype=np.int64)
    itp = np.empty(n_net, dtype=np.int64)
    queue = np.empty(n_net, dtype=np.int64)
    path = np.empty(n_net, dtype=np.int64)
    side = np.zeros(n_net, dtype=np.bool_)
    stack_n = np.empty(4 * m_arcs, dtype=np.int64)
    stack_a = np.empty(4 * m_arcs, dtype=np.int64)
    # One capacity scale for the whole walk (so kept flows stay valid): every finite capacity
    # is a slope difference or a slope, at most each op's steepest slope.
    total = 0.0
    for v in range(n):
        total += 3.0 * hs[v, 0]
    scale = _BUDGET / total if total > 0 else 1.0
    src_base = 3 * n + n_edges
    snk_base = 4 * n + n_edges
    op_arc = np.empty(5, dtype=np.int64)  # an op's arcs: op, 2 terminals, source, sink
    op_new = np.empty(5, dtype=np.int64)
    rounded = np.empty(n, dtype=np.int16)
    rounded_up = np.empty(n, dtype=np.int16)
    last_rounded = np.full(n, -1, dtype=np.int16)
    emitted = np.empty((16, n), dtype=np.int16)
    n_emitted = 0
    lp_t = np.empty(max_iterations + 1)
    lp_e = np.empty(max_iterations + 1)
    n_lp = 0
    crit_tol = 100.0 * tol
    iterations = 0

    while iterations < max_iterations:
        deadline = _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end)
        _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, late_start, late_finish)
        cost = 0.0
        for v in range(n):
            a = max(_vertex_at_or_below(ht, v, dur[v]), 0)
            cost += hc[v, a] - hs[v, a] * (dur[v] - ht[v, a])
        lp_t[n_lp] = deadline
        lp_e[n_lp] = cost + power_ranks * deadline
        n_lp += 1
        # Progress is any shortening beyond float noise: on large jobs (10^4+ ops) the
        # breakpoints lie closer together than the criticality tolerance.
        if deadline < state[S_BEST_DEADLINE] - tol:
            state[S_BEST_DEADLINE] = deadline
            state[S_STALLED] = 0.0
        else:
            state[S_STALLED] += 1.0
            if state[S_STALLED] > _MAX_STALL:
                emitted, n_emitted = _emit(
                    dur,
                    node_type,
                    opt_t,
                    tol,
                    rounded,
                    rounded_up,
                    last_rounded,
                    emitted,
                    n_emitted,
                )
                state[S_DONE] = DONE_STALLED
                break

        # Critical nodes and their cut prices, as capacities of the cut network.
        ok = True
        for v in range(n):
            crit[v] = (late_finish[v] - end[v]) <= crit_tol
        for v in range(n):
            op_cap = np.int64(0)
            term_cap = np.int64(0)
            src_cap = np.int64(0)
            snk_cap = np.int64(0)
            if crit[v]:
                dv = dur[v]
                a = max(_vertex_at_or_below(ht, v, dv + tol), 0)
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
                # Ties between cuts are broken towards moving fewer ops: each moved op costs
                # tie_units more (shortening) or saves that much less (lengthening).
                # Without it, two ops just off their vertices on one path can swap in turn,
                # each cut as cheap as the other, and the walk crawls in steps of that offset.
                term_cap = np.int64(np.rint(lower[v] * scale))
                tie = np.int64(tie_units)
                if term_cap > tie:
                    term_cap -= tie
                    tie *= 2
                if upper[v] == np.inf:
                    op_cap = _INF_CAP
                else:
                    op_cap = np.int64(np.rint((upper[v] - lower[v]) * scale)) + tie
                if pred_ptr[v] == pred_ptr[v + 1] and start[v] <= crit_tol:
                    src_cap = _INF_CAP
                if succ_ptr[v] == succ_ptr[v + 1] and end[v] >= deadline - crit_tol:
                    snk_cap = _INF_CAP
            # A changed lower bound moves capacity between the op arc and its two terminal
            # arcs; moving the same amount of flow along keeps every node balanced, so the
            # common case needs no cancelling and no re-augmenting.
            if capa[v] != op_cap or capa[n + v] != term_cap:
                f_op, f_t, f_s = res[rs[v]], res[rs[n + v]], res[rs[2 * n + v]]
                lo = max(f_op - op_cap, -f_t, -f_s)
                hi = min(f_op, term_cap - f_t, term_cap - f_s)
                theta = min(max(np.int64(0), lo), hi) if lo <= hi else np.int64(0)
                if theta != 0:
                    res[rs[v]] -= theta
                    res[fs[v]] += theta
                    res[rs[n + v]] += theta
                    res[fs[n + v]] -= theta
                    res[rs[2 * n + v]] += theta
                    res[fs[2 * n + v]] -= theta
            op_arc[0], op_arc[1], op_arc[2] = v, n + v, 2 * n + v
            op_arc[3], op_arc[4] = src_base + v, snk_base + v
            op_new[0], op_new[1], op_new[2] = op_cap, term_cap, term_cap
            op_new[3], op_new[4] = src_cap, snk_cap
            for j in range(5):
                if capa[op_arc[j]] != op_new[j]:
                    ok &= _set_capacity(
                        op_arc[j], op_new[j], a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs,
                        res, net_source, net_sink, stack_n, stack_a,
                    )  # fmt: skip
            for e in range(succ_ptr[v], succ_ptr[v + 1]):
                w = succ_idx[e]
                c = np.int64(0)
                if (
                    crit[v]
                    and crit[w]
                    and (late_finish[w] - dur[w]) - (end[v] + succ_lat[e]) <= crit_tol
                ):
                    c = _INF_CAP
                if capa[3 * n + e] != c:
                    ok &= _set_capacity(
                        3 * n + e, c, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                        net_source, net_sink, stack_n, stack_a,
                    )  # fmt: skip
        if not ok:  # cancellation overflowed its stack: start this cut from zero flow
            for k in range(res.size):
                res[k] = 0
            for k in range(m_arcs):
                res[fs[k]] = capa[k]
        for k in range(n_net):
            side[k] = False
        if not _augment(net_source, net_sink, ptr, to, twin, res, level, itp, queue, path, side):
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
            state[S_DONE] = DONE_FASTEST
            break
        n_fwd = 0
        n_bwd = 0
        cut_value = 0.0
        exact = np.inf
        step_max = np.inf
        for v in range(n):
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
        iterations += 1
        step_max = min(max(exact, quantum), step_max)

        # Step length: Newton on the makespan along the move (see reference_walk._step_length).
        step = step_max
        for _ in range(_MAX_NEWTON):
            _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, trial)
            makespan = _forward(order, pred_ptr, pred_idx, pred_lat, trial, start, end)
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
        if step <= 0.0:
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
            state[S_DONE] = DONE_NO_STEP
            break
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
                    trial,
                    node_type,
                    opt_t,
                    tol,
                    rounded,
                    rounded_up,
                    last_rounded,
                    emitted,
                    n_emitted,
                )
                state[S_LAST_EMIT] = target
                target -= gap
        if deadline > anchor_s >= deadline - step:
            _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - anchor_s, trial)
            emitted, n_emitted = _emit(
                trial, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
        _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, trial)
        # Snap moved ops within tol of a hull vertex onto it.
        for i in range(n_fwd + n_bwd):
            v = fwd[i] if i < n_fwd else bwd[i - n_fwd]
            x = trial[v]
            for j in range(nh[v]):
                if abs(ht[v, j] - x) <= tol:
                    x = ht[v, j]
                    break
            trial[v] = x
        for v in range(n):
            dur[v] = trial[v]
        if every_breakpoint and state[S_EMITTING] != 0.0:
            emitted, n_emitted = _emit(
                dur, node_type, opt_t, tol, rounded, rounded_up, last_rounded, emitted, n_emitted
            )
    return emitted[:n_emitted].copy(), lp_t[:n_lp].copy(), lp_e[:n_lp].copy(), iterations


@_jit
def _reclaim_row(
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat, node_type, opt_t, row, work
):
    """Slack reclaiming (see :mod:`perseus.solver.reclaim`) of one plan, in place.

    ``work`` is a (4, N) scratch array. Returns the plan's makespan (unchanged by reclaiming).
    """
    n = row.size
    start, end, dur, late_start = work[0], work[1], work[2], work[3]
    for v in range(n):
        dur[v] = opt_t[node_type[v], row[v]]
    deadline = _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end)
    margin = 8 * np.finfo(np.float64).eps * max(deadline, 1.0)
    for i in range(n - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            r = late_start[succ_idx[k]] - succ_lat[k]
            if r < lf:
                lf = r
        window = lf - start[v] - margin
        t = node_type[v]
        # Options are sorted by time (inf-padded): binary search, as two-clock tables are wide.
        fits = np.searchsorted(opt_t[t], window, side="right") - 1
        new = max(row[v], fits)
        row[v] = new
        late_start[v] = lf - max(opt_t[t, new], 0.0)
    return deadline


@_jit
def reclaim_kernel(
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat, node_type, opt_t, plans
):
    """Slack reclaiming (see :mod:`perseus.solver.reclaim`) of every row of ``plans`` (K, N)."""
    out = plans.copy()
    work = np.empty((4, plans.shape[1]))
    for p in range(plans.shape[0]):
        _reclaim_row(
            order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat, node_type, opt_t,
            out[p], work,
        )  # fmt: skip
    return out


@_jit
def tighten_kernel(
    order,
    pred_ptr,
    pred_idx,
    pred_lat,
    succ_ptr,
    succ_idx,
    succ_lat,
    node_type,
    opt_t,
    plans,
    targets_s,
):
    """Each row of ``plans`` (K, N), sped up until it finishes by ``targets_s[k]``.

    A round moves every critical op not at its fastest option one option faster; rounds
    repeat until the plan meets its target or no critical op can go faster. Blunt (it may
    speed up more ops than the cheapest cut would), so the result goes through the reclaim
    pass. Used on plans rounded towards slower clocks (brought back to the time of the
    faster rounding) and on lifted plans (:mod:`perseus.solver.fold`) whose ends lag in the
    full job.
    """
    k_plans, n = plans.shape
    out = plans.copy()
    start = np.empty(n)
    end = np.empty(n)
    dur = np.empty(n)
    late_start = np.empty(n)
    late_finish = np.empty(n)
    for p in range(k_plans):
        while True:
            for v in range(n):
                dur[v] = opt_t[node_type[v], out[p, v]]
            deadline = _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end)
            if deadline <= targets_s[p]:
                break
            _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, late_start, late_finish)
            eps = 1e-9 * deadline
            moved = False
            for v in range(n):
                if late_finish[v] - end[v] <= eps and out[p, v] > 0:
                    out[p, v] -= 1
                    moved = True
            if not moved:
                break
    return out


@_jit
def _time_and_energy(
    order, pred_ptr, pred_idx, pred_lat, node_type, opt_t, opt_c, power_ranks, row, work
):
    """Makespan and energy (``Σ effective cost + P·R·T``) of one plan; ``work`` is (3+, N)."""
    cost = 0.0
    dur = work[2]
    for v in range(row.size):
        dur[v] = opt_t[node_type[v], row[v]]
        cost += opt_c[node_type[v], row[v]]
    t = _forward(order, pred_ptr, pred_idx, pred_lat, dur, work[0], work[1])
    return t, cost + power_ranks * t


@_jit
def evaluate_kernel(
    order, pred_ptr, pred_idx, pred_lat, node_type, opt_t, opt_c, power_ranks, plans
):
    """Makespan and energy (``Σ effective cost + P·R·T``) of every row of ``plans`` (K, N)."""
    k_plans, n = plans.shape
    time_s = np.empty(k_plans)
    energy_j = np.empty(k_plans)
    work = np.empty((3, n))
    for p in range(k_plans):
        time_s[p], energy_j[p] = _time_and_energy(
            order, pred_ptr, pred_idx, pred_lat, node_type, opt_t, opt_c, power_ranks,
            plans[p], work,
        )  # fmt: skip
    return time_s, energy_j


@_jit
def neighbour_kernel(
    order,
    pred_ptr,
    pred_idx,
    pred_lat,
    succ_ptr,
    succ_idx,
    succ_lat,
    node_type,
    opt_t,
    opt_c,
    num_opts,
    power_ranks,
    plans,
    archive_t,
    archive_e,
    pairs,
):
    """Every plan one move away from a row of ``plans``, reclaimed, that the archive does not
    dominate.

    A move shifts one op one option faster or slower; with ``pairs`` also two ops at once,
    one faster and one slower (the exchanges that keep a path's length while moving energy
    between its ops, which one-op moves cannot reach on tiny jobs). A neighbour is
    reclaimed and kept unless an archive point is no slower and no costlier (to a relative
    1e-12). ``archive_t`` (ascending) and ``archive_e`` (descending) are a Pareto set.
    Returns ``(plans, time_s, energy_j)`` of the kept neighbours (duplicates possible).
    """
    k_plans, n = plans.shape
    out = np.empty((64, n), dtype=np.int64)
    out_t = np.empty(64)
    out_e = np.empty(64)
    n_out = 0
    row = np.empty(n, dtype=np.int64)
    work = np.empty((4, n))
    second = n if pairs else 0
    for p in range(k_plans):
        for i in range(n):
            for step in (-1, 1):
                k = plans[p, i] + step
                if k < 0 or k >= num_opts[node_type[i]]:
                    continue
                # j == -1: the one-op move; j >= i + 1: a pair (each unordered pair once).
                for j in range(-1, second):
                    if j != -1 and j <= i:
                        continue
                    for step_j in (-1, 1):
                        if (j == -1 and step_j == 1) or (j != -1 and step_j == step):
                            continue
                        if j != -1:
                            kj = plans[p, j] + step_j
                            if kj < 0 or kj >= num_opts[node_type[j]]:
                                continue
                        for v in range(n):
                            row[v] = plans[p, v]
                        row[i] = k
                        if j != -1:
                            row[j] = plans[p, j] + step_j
                        _reclaim_row(
                            order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat,
                            node_type, opt_t, row, work,
                        )  # fmt: skip
                        t, e = _time_and_energy(
                            order, pred_ptr, pred_idx, pred_lat, node_type, opt_t, opt_c,
                            power_ranks, row, work,
                        )  # fmt: skip
                        a = np.searchsorted(archive_t, t * (1 + 1e-12), side="right") - 1
                        if a >= 0 and archive_e[a] <= e * (1 + 1e-12):
                            continue
                        if n_out == out.shape[0]:
                            out, out_t, out_e = _grown(out, out_t, out_e)
                        for v in range(n):
                            out[n_out, v] = row[v]
                        out_t[n_out] = t
                        out_e[n_out] = e
                        n_out += 1
    return out[:n_out].copy(), out_t[:n_out].copy(), out_e[:n_out].copy()


@_jit
def _grown(out, out_t, out_e):
    """``out`` (K, N) and ``out_t``, ``out_e`` (K,) copied into arrays twice as long.

    Element loops, not slice assignments: numba compiles a broadcasting setitem's shape
    error message for about 15 s.
    """
    k, n = out.shape
    bigger = np.empty((2 * k, n), dtype=np.int64)
    bigger_t = np.empty(2 * k)
    bigger_e = np.empty(2 * k)
    for r in range(k):
        bigger_t[r] = out_t[r]
        bigger_e[r] = out_e[r]
        for v in range(n):
            bigger[r, v] = out[r, v]
    return bigger, bigger_t, bigger_e
