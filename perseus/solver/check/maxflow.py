"""The minimal source side of a minimum s-t cut with int64 capacities, on scipy's max flow.

The compiled walk's cut network (:mod:`perseus.solver.cut_network`) has int64 capacities on
one scale of 2**52 (infinite arcs are 2**62); its min cut is the *minimal* source side, the
nodes the source reaches in the residual graph of a maximum flow: the same for every maximum
flow, so any exact max-flow algorithm finds the same cut. scipy's ``maximum_flow`` takes
int32 capacities only, so the flow is found in phases of capacity scaling: each phase solves
the residual graph with its capacities shifted right by ``k`` bits (below 2**30, capped at a
bound on the flow still missing) and adds that flow, shifted back, to the running one. A
phase leaves at most ``2**k`` missing per arc of its minimum cut, so two or three phases reach
``k = 0``, whose flow is exact.

Complexity: two or three scipy max flows (Dinic, O(V²E) worst case; close to linear on the
near-series-parallel critical sub-DAGs of pipeline schedules) and O(E log E) numpy per cut.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from perseus.solver.cut_network import INF_CAP

__all__ = ["minimal_source_side", "reaches"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Capacities of one scipy phase stay below this (its int32 flows then cannot overflow).
_PHASE_BITS = 30


def reaches(num_nodes: int, src: IntArray, dst: IntArray, source: int, sink: int) -> bool:
    """Whether ``sink`` is reachable from ``source`` along the given arcs. O(V + E)."""
    if src.size == 0:
        return source == sink
    order = breadth_first_order(_graph(num_nodes, src, dst), source, return_predecessors=False)
    return bool(np.any(order == sink))


def minimal_source_side(
    num_nodes: int, src: IntArray, dst: IntArray, cap: IntArray, source: int, sink: int
) -> BoolArray | None:
    """The minimal source side of a minimum cut, or None when no finite cut exists.

    Args:
        num_nodes: Nodes are ``0 .. num_nodes-1``.
        src, dst: Arc endpoints; no two arcs join the same pair of nodes, either way round.
        cap: Per-arc capacity (int64, > 0); ``INF_CAP`` (2**62) cannot be cut, the
            finite ones sum to less than 2**62.
        source, sink: Terminals.

    Returns:
        Boolean mask of the nodes the source reaches in the residual graph of a maximum flow.
    """
    infinite = cap >= INF_CAP
    if reaches(num_nodes, src[infinite], dst[infinite], source, sink):
        return None
    flow = np.zeros(cap.size, dtype=np.int64)
    missing = int(cap[~infinite].sum())  # at least the flow still missing
    while missing > 0:
        shift = max(0, missing.bit_length() - _PHASE_BITS)
        found, cut_arcs = _phase(num_nodes, src, dst, cap, flow, missing, shift, source, sink)
        if shift == 0:
            break
        # The phase's minimum cut still has less than 2**shift room per arc (an arc capped at
        # ``missing`` in it means at least ``missing - 2**shift`` was found).
        missing = min(missing - found, cut_arcs * ((1 << shift) - 1))
    room = np.concatenate([cap - flow, flow])
    keep = room > 0
    ends = np.concatenate([src, dst]), np.concatenate([dst, src])
    order = breadth_first_order(
        _graph(num_nodes, ends[0][keep], ends[1][keep]), source, return_predecessors=False
    )
    side = np.zeros(num_nodes, dtype=np.bool_)
    side[order] = True
    return side


def _phase(
    num_nodes: int,
    src: IntArray,
    dst: IntArray,
    cap: IntArray,
    flow: IntArray,
    missing: int,
    shift: int,
    source: int,
    sink: int,
) -> tuple[int, int]:
    """One scaled max flow on the residual graph, added to ``flow`` (in place).

    Returns the flow found and the number of residual arcs crossing the phase's minimum cut
    (each has less than ``2**shift`` room left once the flow is added).
    """
    # Residual arcs: each arc forwards (room left) and backwards (its flow), capped at the
    # flow still missing (a maximum flow without cycles never carries more on one arc).
    room = np.minimum(np.concatenate([cap - flow, flow]), missing) >> shift
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    keep = room > 0
    graph = sp.csr_array(
        (room[keep].astype(np.int32), (a[keep].astype(np.int32), b[keep].astype(np.int32))),
        shape=(num_nodes, num_nodes),
    )
    result = maximum_flow(graph, source, sink)
    net = result.flow.tocoo()
    key = net.row.astype(np.int64) * num_nodes + net.col
    by_key = np.argsort(key)
    key, found = key[by_key], net.data[by_key].astype(np.int64)
    at = np.minimum(np.searchsorted(key, src * num_nodes + dst), max(key.size - 1, 0))
    found_on = np.zeros(src.size, dtype=np.int64)  # net flow along each arc (< 0: backwards)
    if key.size:
        found_on = np.where(key[at] == src * num_nodes + dst, found[at], 0)
    before = np.concatenate([cap - flow, flow]) > 0
    flow += found_on << shift
    left = (room - np.concatenate([found_on, -found_on])) > 0
    reached = breadth_first_order(
        _graph(num_nodes, a[left], b[left]), source, return_predecessors=False
    )
    inside = np.zeros(num_nodes, dtype=np.bool_)
    inside[reached] = True
    cut_arcs = int(np.count_nonzero(inside[a] & ~inside[b] & before))
    return int(result.flow_value) << shift, cut_arcs


def _graph(num_nodes: int, src: IntArray, dst: IntArray) -> sp.csr_array:
    """The arcs as a sparse adjacency matrix (for scipy's graph searches)."""
    return sp.csr_array(
        (np.ones(src.size, dtype=np.int8), (src.astype(np.int32), dst.astype(np.int32))),
        shape=(num_nodes, num_nodes),
    )
