"""The min-cut network of the compiled frontier walk, with its flow kept between iterations.

One network over all ops (:func:`build_network`), int64 capacities on one scale (finite ones
sum below 2**52; infinite arcs 2**62, a bottleneck that large meaning the fastest plan is
reached), lower bounds folded into terminal arcs as in the tests' oracle
(tests/solver/oracles/maxflow.py). Between iterations flow follows changed capacities
(:func:`keep_balanced`, :func:`set_capacity`) and :func:`augment` re-augments with
Boykov–Kolmogorov search trees, also kept. Complexity:
building O((N + E) log(N + E)); a capacity change O(1) plus the flow it cancels; an
augmentation a few hundred nodes per iteration on pipeline DAGs (no useful polynomial bound).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perseus.solver.aot import jit, jit_inline, jit_noalloc

__all__ = [
    "INF_CAP",
    "augment",
    "build_network",
    "keep_balanced",
    "search_arrays",
    "set_capacity",
]

#: Capacity of arcs that cannot be cut; finite capacities sum to less than 2**52.
INF_CAP = np.int64(2**62)

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
    out of the adjacency. Returns ``(a_src, a_dst, ptr, to, twin, is_fwd, fs, rs)``
    (numpy: it runs once per walk, and compiling it cost seconds).
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


@jit_inline
def _log_change(k, changed):
    """Note that slot ``k``'s residual changed outside :func:`augment` (``changed[0]``: how
    many noted, -1 once they no longer fit: every slot is then looked at)."""
    count = changed[0]
    if count >= 0:
        if count + 1 < changed.size:
            changed[count + 1] = k
            changed[0] = count + 1
        else:
            changed[0] = -1


@jit_noalloc
def _cancel(
    x, amount, toward_sink, sink_or_source, ptr, to, twin, is_fwd, res, stack_n, stack_a, changed
):
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
            _log_change(twin[fa], changed)
            _log_change(fa, changed)
            r -= t
            if top == stack_n.size:
                return False
            stack_n[top], stack_a[top] = to[a], t
            top += 1
    return True


@jit_noalloc
def set_capacity(k, new_cap, cut):
    """Give forward arc ``k`` capacity ``new_cap``, first cancelling any flow above it; False
    when a cancellation overflowed its stack. ``cut``: ``(network, capa, res, stack_n,
    stack_a, changed)``, the network :func:`build_network`'s, the slots changed noted in
    ``changed`` (:func:`search_arrays`' last)."""
    net, capa, res, stack_n, stack_a, changed = cut
    a_src, a_dst, ptr, to, twin, is_fwd, fs, rs = net
    source, sink = ptr.size - 3, ptr.size - 2  # 2n and 2n + 1: the network has 2n + 2 nodes
    flow = res[rs[k]]
    if flow > new_cap:
        over = flow - new_cap
        res[rs[k]] -= over
        res[fs[k]] += over
        # A loop, not two calls with literal True/False: numba would compile _cancel twice.
        for toward_sink in (False, True):
            x, end = (a_dst[k], sink) if toward_sink else (a_src[k], source)
            if not _cancel(
                x, over, toward_sink, end, ptr, to, twin, is_fwd, res, stack_n, stack_a, changed
            ):
                return False
        flow = res[rs[k]]
    capa[k] = new_cap
    res[fs[k]] = new_cap - flow
    _log_change(fs[k], changed)
    _log_change(rs[k], changed)
    return True


@jit_inline
def keep_balanced(v, n, op_cap, term_cap, capa, fs, rs, res, changed):
    """Move flow between op ``v``'s arc and its terminal arcs as their capacities change
    (a changed lower bound), keeping every node balanced: no cancelling, no re-augmenting."""
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
        for k in (v, n + v, 2 * n + v):
            _log_change(fs[k], changed)
            _log_change(rs[k], changed)


_FREE, _S, _T = 0, 1, 2
_ROOT, _NONE = -1, -2


@jit
def search_arrays(n_nodes, n_slots):
    """Empty search trees of :func:`augment`, kept between its calls: ``(tree, parent, dist,
    stamp, queued, queue, orphans, seen_res, counters, changed)``. ``tree``: 0 free, 1 the
    source's, 2 the sink's; ``parent``: the slot of the arc to the parent; ``dist``/``stamp``:
    steps to the root and when last checked; ``seen_res``: the residuals the trees were built
    on; ``changed``: the slots changed since (:func:`_log_change`; none noted yet: all are
    new)."""
    tree = np.zeros(n_nodes, dtype=np.int8)
    parent = np.full(n_nodes, _NONE, dtype=np.int64)
    dist = np.zeros(n_nodes, dtype=np.int64)
    stamp = np.zeros(n_nodes, dtype=np.int64)
    queued = np.zeros(n_nodes, dtype=np.bool_)
    queue = np.empty(n_nodes + 1, dtype=np.int64)
    orphans = np.empty(n_nodes, dtype=np.int64)
    seen_res = np.full(n_slots, -1, dtype=np.int64)  # none seen yet: every slot is new
    counters = np.zeros(4, dtype=np.int64)  # queue head, queue tail, orphan count, time
    changed = np.empty(n_slots + 1, dtype=np.int64)
    changed[0] = -1
    return tree, parent, dist, stamp, queued, queue, orphans, seen_res, counters, changed


@jit_noalloc
def augment(source, sink, ptr, to, twin, res, search, side):
    """Augment the current flow until it is maximum; fill ``side`` with the minimal source
    side of a minimum cut. False if an all-infinite source→sink path exists (the flow is then
    left inconsistent).

    Boykov–Kolmogorov's search trees (``search``: :func:`search_arrays`) are kept from the
    last call: only the nodes at slots whose residual changed are looked at again (in slot
    order, those noted in ``changed``), so a call after a small capacity update costs about
    what it changes.
    """
    tree, parent, dist, stamp, queued, queue, orphans, seen_res, counters, changed = search
    if tree[source] != _S:
        tree[source], parent[source], tree[sink], parent[sink] = _S, _ROOT, _T, _ROOT
        _enqueue(source, queued, queue, counters)
        _enqueue(sink, queued, queue, counters)
    count = changed[0]
    if count > _MAX_NOTED:
        count = -1  # scanning every slot is cheaper than sorting so many
    _sort_noted(changed, count)
    for i in range(count if count >= 0 else res.size):
        k = changed[i + 1] if count >= 0 else i
        if res[k] != seen_res[k]:  # also skips repeats: touching updates seen_res
            _touch(k, to, twin, res, seen_res, tree, parent, queued, queue, orphans, counters)
    changed[0] = 0
    _adopt(ptr, to, twin, res, tree, parent, dist, stamp, queued, queue, orphans, counters)
    while True:
        bridge = _grow(ptr, to, twin, res, tree, parent, dist, stamp, queued, queue, counters)
        if bridge < 0:
            break
        if not _augment_path(bridge, to, twin, res, seen_res, tree, parent, orphans, counters):
            return False
        _adopt(ptr, to, twin, res, tree, parent, dist, stamp, queued, queue, orphans, counters)
    for v in range(tree.size):
        side[v] = tree[v] == _S
    return True


#: Noted slots sorted by insertion (a few dozen per walk iteration), beyond which all are scanned.
_MAX_NOTED = 256


@jit_inline
def _sort_noted(changed, count):
    """Sort ``changed[1 : count + 1]`` in place (insertion sort: numba's sort costs seconds of
    compilation on a first run)."""
    for i in range(2, count + 1):
        k = changed[i]
        j = i - 1
        while j >= 1 and changed[j] > k:
            changed[j + 1] = changed[j]
            j -= 1
        changed[j + 1] = k


@jit_inline
def _enqueue(v, queued, queue, counters):
    if not queued[v]:
        queued[v] = True
        queue[counters[1]] = v
        tail = counters[1] + 1
        counters[1] = tail if tail < queue.size else 0  # a ring (no division)


@jit_inline
def _orphan(v, parent, orphans, counters):
    parent[v] = _NONE
    orphans[counters[2]] = v
    counters[2] += 1


@jit_inline
def _touch(k, to, twin, res, seen_res, tree, parent, queued, queue, orphans, counters):
    """Slot ``k``'s residual changed since the last call: a tree arc left without residual
    orphans its child, and both ends are searched again."""
    w, u = to[k], to[twin[k]]  # slot k is the arc u -> w
    seen_res[k] = res[k]
    if res[k] == 0:
        if tree[w] == _S and parent[w] == k:
            _orphan(w, parent, orphans, counters)
        if tree[u] == _T and parent[u] == k:
            _orphan(u, parent, orphans, counters)
    for x in (u, w):
        if tree[x] != _FREE:
            _enqueue(x, queued, queue, counters)


@jit_inline
def _grow(ptr, to, twin, res, tree, parent, dist, stamp, queued, queue, counters):
    """Grow the trees from their active nodes until they meet; returns the slot of the arc
    from the source's tree into the sink's (-1 when neither tree can grow)."""
    while counters[0] != counters[1]:
        p = queue[counters[0]]
        t = tree[p]
        if t != _FREE:
            for a in range(ptr[p], ptr[p + 1]):
                q = to[a]
                # The arc away from the root: p -> q in the source's tree, q -> p in the sink's.
                arc = a if t == _S else twin[a]
                if res[arc] == 0:
                    continue
                if tree[q] == _FREE:
                    tree[q], parent[q] = t, arc
                    dist[q], stamp[q] = dist[p] + 1, stamp[p]
                    _enqueue(q, queued, queue, counters)
                elif tree[q] != t:
                    return arc  # p stays active: it may meet the other tree again
        queued[p] = False
        head = counters[0] + 1
        counters[0] = head if head < queue.size else 0
    return -1


@jit_inline
def _augment_path(bridge, to, twin, res, seen_res, tree, parent, orphans, counters):
    """Push the bottleneck along source tree -> ``bridge`` -> sink tree; the children of
    saturated tree arcs become orphans. False on a path whose every arc is infinite."""
    b = res[bridge]
    for side_tree in (_S, _T):
        v = to[twin[bridge]] if side_tree == _S else to[bridge]
        while parent[v] != _ROOT:
            b = min(b, res[parent[v]])
            v = to[twin[parent[v]]] if side_tree == _S else to[parent[v]]
    if b >= INF_CAP // 2:
        return False
    _move(bridge, b, res, seen_res, twin)
    for side_tree in (_S, _T):
        v = to[twin[bridge]] if side_tree == _S else to[bridge]
        while parent[v] != _ROOT:
            a = parent[v]
            _move(a, b, res, seen_res, twin)
            nxt = to[twin[a]] if side_tree == _S else to[a]
            if res[a] == 0:
                _orphan(v, parent, orphans, counters)
            v = nxt
    return True


@jit_inline
def _move(a, b, res, seen_res, twin):
    """Push ``b`` along slot ``a``, keeping ``seen_res`` in step (the trees know of it)."""
    res[a] -= b
    res[twin[a]] += b
    seen_res[a] = res[a]
    seen_res[twin[a]] = res[twin[a]]


@jit_inline
def _adopt(ptr, to, twin, res, tree, parent, dist, stamp, queued, queue, orphans, counters):
    """Give each orphan a new parent in its tree whose chain reaches the root along residual
    arcs (the nearest to the root), or free it: its tree neighbours that had an arc to it are
    searched again and its children become orphans."""
    counters[3] += 1
    now = counters[3]
    while counters[2] > 0:
        counters[2] -= 1
        v = orphans[counters[2]]
        t = tree[v]
        best, best_d = _NONE, np.int64(1) << 62
        for a in range(ptr[v], ptr[v + 1]):
            q = to[a]
            arc = twin[a] if t == _S else a  # q -> v in the source's tree, v -> q in the sink's
            if tree[q] != t or res[arc] == 0:
                continue
            d = _root_distance(q, now, to, twin, tree, parent, dist, stamp, t)
            if 0 <= d < best_d:
                best, best_d = arc, d
        if best != _NONE:
            parent[v], dist[v], stamp[v] = best, best_d + 1, now
            continue
        for a in range(ptr[v], ptr[v + 1]):
            q = to[a]
            if tree[q] != t:
                continue
            arc = twin[a] if t == _S else a
            if res[arc] > 0:
                _enqueue(q, queued, queue, counters)
            child_arc = a if t == _S else twin[a]  # v -> q (source's tree), q -> v (sink's)
            if parent[q] == child_arc:
                _orphan(q, parent, orphans, counters)
        tree[v] = _FREE


@jit_inline
def _root_distance(q, now, to, twin, tree, parent, dist, stamp, t):
    """Steps from ``q`` up its tree's parent arcs to the root, or -1 when the chain ends at an
    orphan; the nodes passed are stamped ``now`` with their distances."""
    d = np.int64(0)
    v = q
    while True:
        if stamp[v] == now:
            d += dist[v]
            break
        p = parent[v]
        if p == _ROOT:
            break
        if p == _NONE:
            return -1
        d += 1
        v = to[twin[p]] if t == _S else to[p]
    # Stamp the chain with its distances (from q down, d falls by one per step).
    v = q
    dd = d
    while stamp[v] != now:
        stamp[v], dist[v] = now, dd
        p = parent[v]
        if p == _ROOT:
            break
        dd -= 1
        v = to[twin[p]] if t == _S else to[p]
    return d
