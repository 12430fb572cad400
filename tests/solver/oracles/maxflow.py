"""The minimal source side of a minimum s-t cut with int64 capacities, on scipy's max flow.

The walk's cut minimises ``Σ_forward u − Σ_backward l``; since ``u·x_a(1−x_b) − l·(1−x_a)x_b
= (u−l)·[a→b forward] + l·x_a − l·x_b``, the op arc gets ``u − l`` and ``l`` goes on terminal
arcs ``a→t`` and ``s→b``: an ordinary min cut. Its minimal source side is the same for every
maximum flow. scipy takes int32 capacities only, so the flow is found in capacity-scaling
phases (capacities shifted right below 2**30), the last one exact. Complexity: two or three
scipy max flows (Dinic) and O(E log E) numpy per cut.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from perseus.dag.graph import BoolArray, IntArray
from perseus.solver.cut_network import INF_CAP

__all__ = ["minimal_source_side"]

#: Capacities of one scipy phase stay below this (its int32 flows then cannot overflow).
_PHASE_BITS = 30


def minimal_source_side(
    num_nodes: int, src: IntArray, dst: IntArray, cap: IntArray, source: int, sink: int
) -> BoolArray | None:
    """The minimal source side of a minimum cut, or None when no finite cut exists.

    Args:
        num_nodes: Nodes are ``0 .. num_nodes-1``.
        src, dst: Arc endpoints; no two arcs join the same pair of nodes, either way round.
        cap: Per-arc capacity (int64, > 0); ``INF_CAP`` (2**62) cannot be cut, the finite
            ones sum to less than 2**62.

    Returns:
        Boolean mask of the nodes the source reaches in the residual graph of a maximum flow.
    """
    finite_total = int(cap[cap < INF_CAP].sum())
    res = _Residual(num_nodes, src, dst, cap)
    # Infinite arcs count as finite_total + 1 (phases cap every room at the flow still
    # missing): a flow above finite_total then means an all-infinite source-sink path.
    missing = finite_total + 1
    found_total = 0
    while missing > 0:
        shift = max(0, missing.bit_length() - _PHASE_BITS)
        found = res.phase(missing, shift, source, sink)
        found_total += found
        if shift == 0:
            break
        missing = res.still_missing(missing - found, shift)
    if found_total > finite_total:
        return None
    return res.reached(source, res.room())


class _Residual:
    """The residual graph of a flow, each arc forwards (room) and backwards (flow), as one CSR
    layout sorted by tail then head."""

    def __init__(self, num_nodes: int, src: IntArray, dst: IntArray, cap: IntArray) -> None:
        tail, head = np.concatenate([src, dst]), np.concatenate([dst, src])
        self._order = np.argsort(tail * num_nodes + head)
        self._tail, self._head = tail[self._order], head[self._order].astype(np.int32)
        self._ptr = np.zeros(num_nodes + 1, dtype=np.int32)
        np.cumsum(np.bincount(tail, minlength=num_nodes), out=self._ptr[1:])
        self._cap = np.concatenate([cap, np.zeros_like(cap)])[self._order]
        self._flow = np.zeros(tail.size, dtype=np.int64)  # antisymmetric, per residual arc
        self._n = num_nodes

    def room(self) -> IntArray:
        out: IntArray = self._cap - self._flow
        return out

    def phase(self, missing: int, shift: int, source: int, sink: int) -> int:
        """Add one max flow of the residual graph, its rooms capped at ``missing`` and shifted
        right by ``shift`` bits; returns the flow added."""
        room = (np.minimum(self.room(), missing) >> shift).astype(np.int32)
        graph = sp.csr_array((room, self._head, self._ptr), shape=(self._n, self._n))
        result = maximum_flow(graph, source, sink)
        got = result.flow
        if np.array_equal(got.indptr, self._ptr) and np.array_equal(got.indices, self._head):
            found = got.data.astype(np.int64)
        else:  # scipy laid its flow out otherwise
            found = np.asarray(got[self._tail, self._head]).astype(np.int64).ravel()
        self._flow += found << shift
        return int(result.flow_value) << shift

    def reached(self, source: int, room: IntArray) -> BoolArray:
        """The nodes ``source`` reaches along arcs with room."""
        keep = room > 0
        ptr = np.zeros(self._n + 1, dtype=np.int32)
        np.cumsum(np.bincount(self._tail[keep], minlength=self._n), out=ptr[1:])
        graph = sp.csr_array(
            (np.ones(int(keep.sum()), dtype=np.int8), self._head[keep], ptr),
            shape=(self._n, self._n),
        )
        side = np.zeros(self._n, dtype=np.bool_)
        side[breadth_first_order(graph, source, return_predecessors=False)] = True
        return side

    def still_missing(self, left: int, shift: int) -> int:
        """A bound on the flow still missing after a phase at ``shift`` (``left``: the last
        bound less the flow found): unless ``left`` < ``2**shift``, every arc across the
        phase's minimum cut has less than ``2**shift`` room, so those rooms bound it."""
        if left < 1 << shift:
            return left
        room = self.room()
        return min(left, int(room[(room > 0) & (room < 1 << shift)].sum()))
