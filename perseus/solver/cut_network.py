"""The min-cut network of the compiled frontier walk, with its flow kept between iterations.

The min cut is a max flow on one network over all ops (:func:`build_network`), with int64
capacities on one scale for the whole walk (every finite capacity is a slope or a difference
of slopes, so their sum stays below 2**52; infinite arcs are 2**62, and a bottleneck that large
means no finite cut, i.e. the fastest plan is reached). Lower bounds are folded into terminal
arcs exactly as in :mod:`perseus.solver.check.maxflow`. The flow is kept between iterations: when an
op's lower bound changes, flow moves between its arc and its terminal arcs; flow above a
lowered capacity is cancelled back to the terminals (:func:`set_capacity`); then Dinic's
phases re-augment (:func:`augment`). The cut found is re-priced in floating point, so the
integer scale can only pick a marginally sub-optimal cut, never a wrong price.

Complexity: building is O((N + E) log(N + E)) (one sort); a capacity change costs O(1) plus
the flow it cancels; :func:`augment` is Dinic's (O(V²E) worst case; three or four phases per
walk iteration on pipeline DAGs, each a search of the part that reaches the sink, then one of
the part the source reaches).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["INF_CAP", "augment", "build_network", "jit", "keep_balanced", "set_capacity"]

#: Capacity of arcs that cannot be cut; finite capacities sum to less than 2**52.
INF_CAP = np.int64(2**62)
_BIG = np.int64(2**63 - 1)

#: numba's compiler, with the on-disk cache (shared with :mod:`perseus.solver.compiled`).
jit: Any = numba.njit(cache=True, nogil=True)
# Dinic's steps, inlined into augment (numba IR inlining): one compiled function, not five.
_jit_inline: Any = numba.njit(cache=True, nogil=True, inline="always")

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def build_network(
    n: int, pred_ptr: IntArray, succ_ptr: IntArray, succ_idx: IntArray
) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray, BoolArray, IntArray, IntArray]:
    """The fixed arc layout of the cut network over all N ops (capacities set per iteration).

    Nodes: ``2v`` (op v's start), ``2v+1`` (its end), source ``2N``, sink ``2N+1``. Arcs ``k``
    (forward slot ``fs[k]`` holding the residual, twin ``rs[k]`` holding the flow): ``v`` op
    arc, ``N+v`` start→sink, ``2N+v`` source→end (the lower-bound terminal arcs), ``3N+e``
    dependency edge ``e`` (in CSR successor order), ``3N+E+v`` source→start, ``4N+E+v``
    end→sink. Source→start and end→sink arcs of inner ops never carry capacity and are left
    out of the adjacency. Returns ``(a_src, a_dst, ptr, to, twin, is_fwd, fs, rs)``.

    numpy, not compiled: it runs once per walk, and compiling it took about 2.5 s of a first
    run.
    """
    v = np.arange(n, dtype=np.int64)
    src_node, snk_node = np.full(n, 2 * n), np.full(n, 2 * n + 1)
    edge_from = np.repeat(v, np.diff(succ_ptr))
    a_src = np.concatenate([2 * v, 2 * v, src_node, 2 * edge_from + 1, src_node, 2 * v + 1])
    a_dst = np.concatenate([2 * v + 1, snk_node, 2 * v + 1, 2 * succ_idx, 2 * v, snk_node])
    m = a_src.size
    used = np.ones(m, dtype=np.bool_)
    used[m - 2 * n : m - n] = np.diff(pred_ptr) == 0
    used[m - n :] = np.diff(succ_ptr) == 0
    # Arc slots in CSR order (per node, by arc), so scanning a node's arcs reads contiguous
    # memory; unused arcs get slots past every node's range.
    k_used = np.flatnonzero(used)
    ends = np.concatenate([a_src[k_used], a_dst[k_used]])
    slot = np.empty(ends.size, dtype=np.int64)
    slot[np.lexsort((np.concatenate([k_used, k_used]), ends))] = np.arange(ends.size)
    ptr = np.zeros(2 * n + 3, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(ends, minlength=2 * n + 2))
    fs = np.empty(m, dtype=np.int64)
    rs = np.empty(m, dtype=np.int64)
    fs[k_used], rs[k_used] = slot[: k_used.size], slot[k_used.size :]
    k_unused = np.flatnonzero(~used)
    fs[k_unused] = ptr[-1] + 2 * np.arange(k_unused.size)
    rs[k_unused] = fs[k_unused] + 1
    to = np.empty(2 * m, dtype=np.int64)
    twin = np.empty(2 * m, dtype=np.int64)
    is_fwd = np.zeros(2 * m, dtype=np.bool_)
    to[fs], to[rs] = a_dst, a_src
    twin[fs], twin[rs] = rs, fs
    is_fwd[fs] = True
    return a_src, a_dst, ptr, to, twin, is_fwd, fs, rs


@jit
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


@jit
def set_capacity(
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
        # A loop, not two calls with literal True/False: numba would compile _cancel twice.
        for toward_sink in (False, True):
            x, end = (a_dst[k], sink) if toward_sink else (a_src[k], source)
            if not _cancel(x, over, toward_sink, end, ptr, to, twin, is_fwd, res, stack_n, stack_a):
                return False
        flow = res[rs[k]]
    capa[k] = new_cap
    res[fs[k]] = new_cap - flow
    return True


@_jit_inline
def keep_balanced(v, n, op_cap, term_cap, capa, fs, rs, res):
    """Move flow between op ``v``'s arc and its terminal arcs before their capacities change.

    A changed lower bound moves capacity between the op arc and its two terminal arcs; moving
    the same amount of flow along keeps every node balanced, so the common case needs no
    cancelling and no re-augmenting.
    """
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


@jit
def augment(source, sink, ptr, to, twin, res, level, it, queue, path, side):
    """Dinic's phases from the current flow until it is maximum; fills ``side`` with the
    source side of a minimum cut. Returns False if an all-infinite source→sink path exists
    (seen as a bottleneck above every finite total); the flow is then left inconsistent.

    Each phase labels the nodes that reach the sink by their distance to it (breadth first
    from the sink, backwards), so its depth-first search from the source meets no dead ends
    off the shortest paths. The minimal source side is the same for every maximum flow: one
    last search forwards from the source reads it. ``level`` must be all -1 on entry and is
    left so; only visited nodes are touched.
    """
    n_seen = np.int64(0)  # not a literal 0: numba would compile _levels twice
    while True:
        n_seen = _levels(sink, source, True, ptr, to, twin, res, level, queue, n_seen)
        if level[source] < 0:
            break
        if not _blocking_flow(source, sink, ptr, to, twin, res, level, it, queue[:n_seen], path):
            for i in range(n_seen):
                level[queue[i]] = -1
            return False
    n_seen = _levels(source, sink, False, ptr, to, twin, res, level, queue, n_seen)
    for i in range(n_seen):
        side[queue[i]] = True
        level[queue[i]] = -1
    return True


@_jit_inline
def _levels(root, target, backward, ptr, to, twin, res, level, queue, n_seen):
    """Clear the last search's levels (of ``queue[:n_seen]``), then label breadth first from
    ``root`` along residual arcs (``backward``: arcs into each node), up to ``target``'s
    level; returns how many nodes it saw (they are ``queue[:n]``)."""
    for i in range(n_seen):
        level[queue[i]] = -1
    level[root] = 0
    head, tail = 0, 1
    queue[0] = root
    while head < tail:
        v = queue[head]
        head += 1
        if level[target] >= 0 and level[v] >= level[target]:
            continue
        for a in range(ptr[v], ptr[v + 1]):
            w = to[a]
            if res[twin[a] if backward else a] > 0 and level[w] < 0:
                level[w] = level[v] + 1
                queue[tail] = w
                tail += 1
    return tail


@_jit_inline
def _blocking_flow(source, sink, ptr, to, twin, res, level, it, seen, path):
    """One Dinic phase: augment along paths whose distance to the sink falls by one at each
    arc (depth first, arcs tried once) until none is left. Returns False on a path whose
    every arc is infinite."""
    for i in range(seen.size):
        it[seen[i]] = ptr[seen[i]]
    depth = 0
    v = source
    while True:
        if v == sink:
            depth = _push(path, depth, res, twin)
            if depth < 0:
                return False
            v = source if depth == 0 else to[path[depth - 1]]
            continue
        a = _next_arc(v, ptr, to, res, level, it)
        if a >= 0:
            path[depth] = a
            depth += 1
            v = to[a]
        elif depth == 0:
            return True
        else:
            level[v] = -2  # dead end for the rest of this phase (still "seen")
            depth -= 1
            v = to[twin[path[depth]]]
            it[v] += 1


@_jit_inline
def _next_arc(v, ptr, to, res, level, it):
    """The next arc out of ``v`` one level nearer the sink with residual left (-1 if
    none)."""
    while it[v] < ptr[v + 1]:
        a = it[v]
        if res[a] > 0 and level[to[a]] == level[v] - 1:
            return a
        it[v] += 1
    return -1


@_jit_inline
def _push(path, depth, res, twin):
    """Push the bottleneck along ``path[:depth]``; returns the index of its first saturated
    arc (where the search resumes), or -1 if every arc is infinite."""
    b = _BIG
    for i in range(depth):
        b = min(b, res[path[i]])
    if b >= INF_CAP // 2:
        return -1
    first = depth
    for i in range(depth):
        a = path[i]
        res[a] -= b
        res[twin[a]] += b
        if res[a] == 0 and first == depth:
            first = i
    return first
