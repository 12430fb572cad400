"""The frontier tracer's inner loops, compiled with numba.

The Phillips–Dessouky walk visits every breakpoint of the relaxation: thousands to hundreds of
thousands of iterations, each a few longest-path passes, a min cut of the critical sub-DAG and
a step-length search. In Python each iteration costs milliseconds of interpreter and call
overhead (scipy's ``maximum_flow`` alone spends half its time validating its input); compiled,
it costs microseconds to tens of microseconds. Everything here works on plain arrays:

* the DAG as CSR predecessor/successor lists plus a topological order;
* per-node hull tables ``ht`` (vertex times, ``inf``-padded) and ``hs`` (segment slopes);
* per-type option tables for rounding and slack reclaiming.

The min cut is a max flow on one network over all ops (:func:`_build_network`), with int64
capacities on one scale for the whole walk (every finite capacity is a slope or a difference
of slopes, so their sum stays below 2**52; infinite arcs are 2**62, and a bottleneck that large
means no finite cut, i.e. the fastest plan is reached). Lower bounds are folded into terminal
arcs exactly as in :mod:`perseus.solver.maxflow`. The flow is kept between iterations: when an
op's lower bound changes, flow moves between its arc and its terminal arcs; flow above a
lowered capacity is cancelled back to the terminals (:func:`_set_capacity`); then Dinic's
phases re-augment (:func:`_augment`). The cut found is re-priced in floating point, so the
integer scale can only pick a marginally sub-optimal cut, never a wrong price.

Compiled functions are cached on disk by numba (``cache=True``): the first use in a fresh
environment compiles for about 15 s, later processes load the cache in well under a second.
This module is imported lazily by the solver so that ``import perseus.solver`` stays light.

Complexity per walk iteration: O(N + E) for each longest-path pass (2–4 per iteration) and
for the capacity update, O(N·H) for the relaxation's cost (H hull vertices per op), and the
re-augmentation (Dinic, O(V²E) worst case; one or two phases on pipeline DAGs).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["reclaim_kernel", "walk_kernel"]

_INF_CAP = np.int64(2**62)
_BIG = np.int64(2**63 - 1)
_BUDGET = 2.0**52
_MAX_NEWTON = 64
_MAX_STALL = 200
# Roundings of each fractional plan (see emit in walk_kernel): 0 towards faster clocks, 1 to the
# nearest clock, 2 to the next slower one. Only 0 is on: 1 and 2 closed most remaining lowtime
# coverage gaps but gave plans that overran in the straggler emulation test (see issue 3 note).
_ROUNDINGS = (0,)

# Layout of the walk's persistent scalar state (a float64 array, so a walk can be resumed).
S_EMITTING, S_LAST_EMIT, S_BEST_DEADLINE, S_STALLED, S_DONE = 0, 1, 2, 3, 4
STATE_SIZE = 5
# Why a walk ended (the value of ``state[S_DONE]``).
DONE_FASTEST, DONE_STALLED, DONE_NO_STEP = 1.0, 2.0, 3.0

_jit: Any = numba.njit(cache=True, nogil=True)


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
def _round_into(dur, node_type, opt_t, tol, nearest, out):
    """Per node, the slowest option no slower than its fractional duration (or, with
    ``nearest``, whichever neighbouring option is closer in time)."""
    for v in range(dur.size):
        row = node_type[v]
        x = dur[v] + tol * 1e-3
        k = 0
        for j in range(opt_t.shape[1]):
            if opt_t[row, j] <= x:
                k = j
            else:
                break
        if nearest == 1 and k + 1 < opt_t.shape[1] and opt_t[row, k + 1] - x < x - opt_t[row, k]:
            k += 1
        if (
            nearest == 2
            and k + 1 < opt_t.shape[1]
            and opt_t[row, k + 1] < np.inf
            and x - opt_t[row, k] > tol
        ):
            k += 1
        out[v] = k


@_jit
def _build_network(n, pred_ptr, succ_ptr, succ_idx):
    """The fixed arc layout of the cut network over all N ops (capacities set per iteration).

    Nodes: ``2v`` (op v's start), ``2v+1`` (its end), source ``2N``, sink ``2N+1``. Arcs ``k``
    (forward slot ``fs[k]`` holding the residual, twin ``rs[k]`` holding the flow): ``v`` op arc, ``N+v`` start→sink,
    ``2N+v`` source→end (the lower-bound terminal arcs), ``3N+e`` dependency edge ``e`` (in
    CSR successor order), ``3N+E+v`` source→start, ``4N+E+v`` end→sink. Source→start and
    end→sink arcs of inner ops never carry capacity and are left out of the adjacency.
    """
    n_edges = succ_idx.size
    m = 5 * n + n_edges
    src_node, snk_node = 2 * n, 2 * n + 1
    a_src = np.empty(m, dtype=np.int64)
    a_dst = np.empty(m, dtype=np.int64)
    for v in range(n):
        a_src[v], a_dst[v] = 2 * v, 2 * v + 1
        a_src[n + v], a_dst[n + v] = 2 * v, snk_node
        a_src[2 * n + v], a_dst[2 * n + v] = src_node, 2 * v + 1
        a_src[3 * n + n_edges + v], a_dst[3 * n + n_edges + v] = src_node, 2 * v
        a_src[4 * n + n_edges + v], a_dst[4 * n + n_edges + v] = 2 * v + 1, snk_node
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            a_src[3 * n + e], a_dst[3 * n + e] = 2 * v + 1, 2 * succ_idx[e]
    n_nodes = 2 * n + 2
    used = np.ones(m, dtype=np.bool_)
    for v in range(n):
        used[3 * n + n_edges + v] = pred_ptr[v] == pred_ptr[v + 1]
        used[4 * n + n_edges + v] = succ_ptr[v] == succ_ptr[v + 1]
    # Arc slots in CSR order, so that scanning a node's arcs reads contiguous memory.
    ptr = np.zeros(n_nodes + 1, dtype=np.int64)
    for k in range(m):
        if used[k]:
            ptr[a_src[k] + 1] += 1
            ptr[a_dst[k] + 1] += 1
    for v in range(n_nodes):
        ptr[v + 1] += ptr[v]
    fill = ptr[:-1].copy()
    spare = ptr[n_nodes]  # unused arcs get slots past every node's range
    to = np.empty(2 * m, dtype=np.int64)
    twin = np.empty(2 * m, dtype=np.int64)
    is_fwd = np.zeros(2 * m, dtype=np.bool_)
    fs = np.empty(m, dtype=np.int64)
    rs = np.empty(m, dtype=np.int64)
    for k in range(m):
        if used[k]:
            f = fill[a_src[k]]
            fill[a_src[k]] += 1
            r = fill[a_dst[k]]
            fill[a_dst[k]] += 1
        else:
            f, r = spare, spare + 1
            spare += 2
        fs[k], rs[k] = f, r
        to[f], to[r] = a_dst[k], a_src[k]
        twin[f], twin[r] = r, f
        is_fwd[f] = True
    return a_src, a_dst, ptr, to, twin, is_fwd, fs, rs


@_jit
def _cancel(x, amount, toward_sink, sink_or_source, ptr, to, twin, is_fwd, res, stack_n, stack_a):
    """Remove ``amount`` of flow passing through ``x`` on its way to the sink (or from the
    source), following arcs that carry flow. The flow is acyclic (the network is a DAG), so
    this ends at the terminal. A forward slot holds its arc's residual, the twin its flow."""
    stack_n[0], stack_a[0] = x, amount
    top = 1
    while top > 0:
        top -= 1
        v, r = stack_n[top], stack_a[top]
        if v == sink_or_source:
            continue
        for a in range(ptr[v], ptr[v + 1]):
            if r == 0:
                break
            # Toward the sink: forward arcs out of v carrying flow. Toward the source: forward
            # arcs into v, seen here as their twins (whose residual is that flow).
            if toward_sink:
                if not is_fwd[a] or res[twin[a]] == 0:
                    continue
                fa = a
            else:
                if is_fwd[a] or res[a] == 0:
                    continue
                fa = twin[a]
            t = min(res[twin[fa]], r)
            res[twin[fa]] -= t
            res[fa] += t
            r -= t
            if top == stack_n.size:
                return False
            stack_n[top], stack_a[top] = to[a], t
            top += 1
    return True


@_jit
def _set_capacity(
    k,
    new_cap,
    a_src,
    a_dst,
    capa,
    ptr,
    to,
    twin,
    is_fwd,
    fs,
    rs,
    res,
    source,
    sink,
    stack_n,
    stack_a,
):
    """Give forward arc ``k`` capacity ``new_cap``, first cancelling any flow above it."""
    flow = res[rs[k]]
    if flow > new_cap:
        over = flow - new_cap
        res[rs[k]] -= over
        res[fs[k]] += over
        if not _cancel(a_src[k], over, False, source, ptr, to, twin, is_fwd, res, stack_n, stack_a):
            return False
        if not _cancel(a_dst[k], over, True, sink, ptr, to, twin, is_fwd, res, stack_n, stack_a):
            return False
        flow = res[rs[k]]
    capa[k] = new_cap
    res[fs[k]] = new_cap - flow
    return True


@_jit
def _augment(source, sink, ptr, to, twin, res, level, it, queue, path, side):
    """Dinic's phases from the current flow until it is maximum; fills ``side`` with the
    source side of a minimum cut. Returns False if an all-infinite source→sink path exists
    (seen as a bottleneck above every finite total); the flow is then left inconsistent.

    ``level`` must be all -1 on entry and is left so; only visited nodes are touched.
    """
    n_seen = 0
    while True:
        for i in range(n_seen):
            level[queue[i]] = -1
        level[source] = 0
        head, tail = 0, 1
        queue[0] = source
        while head < tail:
            v = queue[head]
            head += 1
            if level[sink] >= 0 and level[v] >= level[sink]:
                continue
            for a in range(ptr[v], ptr[v + 1]):
                w = to[a]
                if res[a] > 0 and level[w] < 0:
                    level[w] = level[v] + 1
                    queue[tail] = w
                    tail += 1
        n_seen = tail
        if level[sink] < 0:
            break
        for i in range(n_seen):
            it[queue[i]] = ptr[queue[i]]
        depth = 0
        v = source
        while True:
            if v == sink:
                b = _BIG
                for i in range(depth):
                    if res[path[i]] < b:
                        b = res[path[i]]
                if b >= _INF_CAP // 2:
                    for i in range(n_seen):
                        level[queue[i]] = -1
                    return False
                first = depth
                for i in range(depth):
                    a = path[i]
                    res[a] -= b
                    res[twin[a]] += b
                    if res[a] == 0 and first == depth:
                        first = i
                depth = first
                v = source if depth == 0 else to[path[depth - 1]]
                continue
            advanced = False
            while it[v] < ptr[v + 1]:
                a = it[v]
                w = to[a]
                if res[a] > 0 and level[w] == level[v] + 1:
                    path[depth] = a
                    depth += 1
                    v = w
                    advanced = True
                    break
                it[v] += 1
            if not advanced:
                if depth == 0:
                    break
                level[v] = -2  # dead end for the rest of this phase (still "seen")
                depth -= 1
                v = to[twin[path[depth]]]
                it[v] += 1
    for i in range(n_seen):
        side[queue[i]] = True
        level[queue[i]] = -1
    return True


@_jit
def _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, out):
    for v in range(dur.size):
        out[v] = dur[v]
    for i in range(n_fwd):
        out[fwd[i]] -= step
    for i in range(n_bwd):
        out[bwd[i]] += min(step, bwd_room[i])


@_jit
def _binding_slope(pred_ptr, pred_idx, pred_lat, trial, end, makespan, mark, room, step):
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
    all_points,
    power_ranks,
    max_iterations,
):
    """Run up to ``max_iterations`` Phillips–Dessouky steps from ``dur`` (updated in place).

    Returns ``(emitted option indices (K, N) int16, lp_time_s, lp_energy_j, iterations)``;
    ``state[S_DONE]`` becomes 1 when the walk reached the fastest plan (or stalled).
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
    rounded = np.empty(n, dtype=np.int16)
    last_rounded = np.full(n, -1, dtype=np.int16)
    emitted = np.empty((16, n), dtype=np.int16)
    n_emitted = 0
    lp_t = np.empty(max_iterations + 1)
    lp_e = np.empty(max_iterations + 1)
    n_lp = 0
    crit_tol = 100.0 * tol
    iterations = 0

    def emit(x, emitted, n_emitted):
        # Two real plans per fractional one: rounded towards faster clocks (never slower than
        # the relaxation) and to the nearest clock (a little slower or faster, cheaper), so
        # the exact frontier also gets points between the relaxation's breakpoints.
        _round_into(x, node_type, opt_t, tol, 0, rounded)
        same = True
        for v in range(n):
            if rounded[v] != last_rounded[v]:
                same = False
                break
        if same:
            return emitted, n_emitted
        last_rounded[:] = rounded
        for nearest in _ROUNDINGS:
            if nearest:
                _round_into(x, node_type, opt_t, tol, nearest, rounded)
            if n_emitted == emitted.shape[0]:
                grown = np.empty((2 * emitted.shape[0], n), dtype=np.int16)
                grown[:n_emitted] = emitted[:n_emitted]
                emitted = grown
            emitted[n_emitted] = rounded
            n_emitted += 1
        return emitted, n_emitted

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
                emitted, n_emitted = emit(dur, emitted, n_emitted)
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
                if upper[v] == np.inf:
                    op_cap = _INF_CAP
                else:
                    op_cap = np.int64(np.rint((upper[v] - lower[v]) * scale))
                term_cap = np.int64(np.rint(lower[v] * scale))
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
            if capa[v] != op_cap:
                ok &= _set_capacity(
                    v, op_cap, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    net_source, net_sink, stack_n, stack_a,
                )  # fmt: skip
            if capa[n + v] != term_cap:
                ok &= _set_capacity(
                    n + v, term_cap, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    net_source, net_sink, stack_n, stack_a,
                )  # fmt: skip
            if capa[2 * n + v] != term_cap:
                ok &= _set_capacity(
                    2 * n + v, term_cap, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    net_source, net_sink, stack_n, stack_a,
                )  # fmt: skip
            if capa[src_base + v] != src_cap:
                ok &= _set_capacity(
                    src_base + v, src_cap, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    net_source, net_sink, stack_n, stack_a,
                )  # fmt: skip
            if capa[snk_base + v] != snk_cap:
                ok &= _set_capacity(
                    snk_base + v, snk_cap, a_src, a_dst, capa, ptr, to, twin, is_fwd, fs, rs, res,
                    net_source, net_sink, stack_n, stack_a,
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
            res[:] = 0
            for k in range(m_arcs):
                res[fs[k]] = capa[k]
        side[:] = False
        if not _augment(net_source, net_sink, ptr, to, twin, res, level, itp, queue, path, side):
            emitted, n_emitted = emit(dur, emitted, n_emitted)
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

        # Step length: Newton on the makespan along the move (see frontier._step_length).
        step = step_max
        for _ in range(_MAX_NEWTON):
            _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, step, trial)
            makespan = _forward(order, pred_ptr, pred_idx, pred_lat, trial, start, end)
            if makespan <= deadline - step + tol:
                break
            slope = _binding_slope(
                pred_ptr, pred_idx, pred_lat, trial, end, makespan, mark, room_of, step
            )
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
            emitted, n_emitted = emit(dur, emitted, n_emitted)
            state[S_DONE] = DONE_NO_STEP
            break
        if state[S_EMITTING] == 0.0 and cut_value >= 0.5 * power_ranks:
            state[S_EMITTING] = 1.0
            emitted, n_emitted = emit(dur, emitted, n_emitted)
            state[S_LAST_EMIT] = deadline
        if state[S_EMITTING] != 0.0 and gap > 0:
            target = state[S_LAST_EMIT] - gap
            while target >= deadline - step:
                _apply(dur, fwd, n_fwd, bwd, n_bwd, bwd_room, deadline - target, trial)
                emitted, n_emitted = emit(trial, emitted, n_emitted)
                state[S_LAST_EMIT] = target
                target -= gap
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
        if all_points and state[S_EMITTING] != 0.0:
            emitted, n_emitted = emit(dur, emitted, n_emitted)
    return emitted[:n_emitted].copy(), lp_t[:n_lp].copy(), lp_e[:n_lp].copy(), iterations


@_jit
def reclaim_kernel(
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat, node_type, opt_t, plans
):
    """Slack reclaiming (see :mod:`perseus.solver.reclaim`) of every row of ``plans`` (K, N)."""
    k_plans, n = plans.shape
    out = plans.copy()
    start = np.empty(n)
    end = np.empty(n)
    dur = np.empty(n)
    late_start = np.empty(n)
    for p in range(k_plans):
        for v in range(n):
            dur[v] = opt_t[node_type[v], out[p, v]]
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
            row = node_type[v]
            fits = -1
            for j in range(opt_t.shape[1]):
                if opt_t[row, j] <= window:
                    fits = j
                else:
                    break
            new = max(out[p, v], fits)
            out[p, v] = new
            late_start[v] = lf - max(opt_t[row, new], 0.0)
    return out
