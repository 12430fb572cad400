"""Minimum s-t cut with lower bounds, on scipy's compiled max-flow (Dinic).

The Phillips–Dessouky step needs the s-t cut minimising ``Σ_forward u − Σ_backward l`` where
each arc has an upper bound ``u`` (cost per second of shortening it) and a lower bound ``l``
(cost saved per second of lengthening it), ``0 ≤ l ≤ u ≤ ∞``. Writing ``x_v = 1`` for ``v`` on
the source side, an arc contributes ``u·x_a(1−x_b) − l·(1−x_a)x_b``, and since
``(1−x_a)x_b = x_b − x_a + x_a(1−x_b)`` this is ``(u−l)·[a→b forward] + l·x_a − l·x_b``. The
linear terms become terminal arcs (``v→t`` for a positive node weight, ``s→v`` for a negative
one plus a constant), leaving an ordinary min cut with non-negative capacities — no feasible
circulation needed, unlike the textbook lower-bound reduction lowtime uses.

scipy's ``maximum_flow`` takes int32 capacities, so finite capacities are scaled so their sum
stays below ``2**29`` and rounded; infinite ones become ``2**30``. Callers must make sure a
finite cut exists (no all-infinite s-t path), which keeps every flow below ``2**30``. The cut
is then re-priced in floating point by the caller, so rounding can only pick a marginally
sub-optimal cut, never a wrong price.

Complexity: Dinic's O(V²E) worst case; on the near-series-parallel critical sub-DAGs of
pipeline schedules it behaves close to linear.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

__all__ = ["INFINITE_CAPACITY", "min_cut_with_lower_bounds", "reaches"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Integer capacity standing for "cannot be cut".
INFINITE_CAPACITY = 2**30
_FINITE_BUDGET = 2**29


def reaches(num_nodes: int, src: IntArray, dst: IntArray, source: int, sink: int) -> bool:
    """Whether ``sink`` is reachable from ``source`` along the given arcs. O(V + E)."""
    if src.size == 0:
        return source == sink
    # CSR built directly (rows grouped by a stable sort, duplicates harmless for reachability):
    # much cheaper than scipy's COO-to-CSR conversion for these small graphs.
    by_row = np.argsort(src, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int32)
    np.cumsum(np.bincount(src, minlength=num_nodes), out=indptr[1:])
    g = sp.csr_array(
        (np.ones(src.size, dtype=np.int8), dst[by_row].astype(np.int32), indptr),
        shape=(num_nodes, num_nodes),
    )
    order = breadth_first_order(g, source, directed=True, return_predecessors=False)
    return bool(np.any(order == sink))


def min_cut_with_lower_bounds(
    num_nodes: int,
    src: IntArray,
    dst: IntArray,
    upper: FloatArray,
    lower: FloatArray,
    source: int,
    sink: int,
) -> BoolArray:
    """The source side of a minimum cut of ``Σ_fwd upper − Σ_bwd lower``.

    Args:
        num_nodes: Nodes are ``0 .. num_nodes-1``.
        src, dst: Arc endpoints (no duplicate pairs, no arcs into ``source`` or out of ``sink``).
        upper: Per-arc upper bound, ``inf`` for uncuttable arcs.
        lower: Per-arc lower bound, finite, ``0 ≤ lower ≤ upper``.
        source, sink: Terminals; a finite cut must exist.

    Returns:
        Boolean mask of nodes on the source side.
    """
    # Work on the nodes the arcs touch only (the critical sub-DAG is a fraction of the DAG).
    used, local = np.unique(np.concatenate([src, dst, [source, sink]]), return_inverse=True)
    k = src.size
    side_local = _min_cut_local(
        used.size,
        local[:k],
        local[k : 2 * k],
        upper,
        lower,
        int(local[2 * k]),
        int(local[2 * k + 1]),
    )
    side = np.zeros(num_nodes, dtype=np.bool_)
    side[used[side_local]] = True
    return side


def _min_cut_local(
    num_nodes: int,
    src: IntArray,
    dst: IntArray,
    upper: FloatArray,
    lower: FloatArray,
    source: int,
    sink: int,
) -> BoolArray:
    finite = np.isfinite(upper)
    residual_cap = np.where(finite, upper - lower, 0.0)
    # One bincount adds in the same order as ``np.add.at`` over src then dst, much faster.
    weight = np.bincount(
        np.concatenate([src, dst]), weights=np.concatenate([lower, -lower]), minlength=num_nodes
    )
    weight[source] = weight[sink] = 0.0
    total = float(residual_cap[finite].sum() + np.abs(weight).sum())
    scale = _FINITE_BUDGET / total if total > 0 else 1.0

    pos = np.flatnonzero(weight > 0)
    neg = np.flatnonzero(weight < 0)
    all_src = np.concatenate([src, pos, np.full(neg.size, source)])
    all_dst = np.concatenate([dst, np.full(pos.size, sink), neg])
    caps = np.concatenate(
        [
            np.where(finite, np.rint(residual_cap * scale), INFINITE_CAPACITY),
            np.rint(weight[pos] * scale),
            np.rint(-weight[neg] * scale),
        ]
    ).astype(np.int32)
    keep = caps > 0
    all_src, all_dst, caps = all_src[keep], all_dst[keep], caps[keep]
    graph = sp.csr_array((caps, (all_src, all_dst)), shape=(num_nodes, num_nodes))
    graph.sum_duplicates()
    flow = maximum_flow(graph, source, sink).flow
    residual = (graph - flow).tocsr()
    residual.eliminate_zeros()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    order = breadth_first_order(residual, source, directed=True, return_predecessors=False)
    side = np.zeros(num_nodes, dtype=np.bool_)
    side[order] = True
    return side
