"""Longest-path passes over an :class:`~perseus.dag.OpGraph` for the solver's inner loops.

A :class:`Topology` holds the DAG as CSR predecessor/successor lists over a topological order;
its passes are the compiled ones (:mod:`perseus.solver.plan_kernels`), which add and compare the
same floats in the same order as the exact evaluator (:mod:`perseus.dag.evaluate`), so results
are identical. Complexity: O(N + E) per pass for N nodes and E edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.dag.graph import FloatArray, IntArray, OpGraph

__all__ = ["Topology", "build_topology"]


@dataclass(frozen=True, eq=False)
class Topology:
    """A DAG's CSR adjacency over a topological order.

    Attributes:
        num_nodes: N.
        order_array: All nodes in topological order (the generations concatenated).
        pred_ptr, pred_idx, pred_lat_csr: Node ``v``'s predecessors are
            ``pred_idx[pred_ptr[v]:pred_ptr[v+1]]``, with the edge latencies alongside.
        succ_ptr, succ_idx, succ_lat_csr: The successor lists, likewise.
    """

    num_nodes: int
    order_array: IntArray
    pred_ptr: IntArray
    pred_idx: IntArray
    pred_lat_csr: FloatArray
    succ_ptr: IntArray
    succ_idx: IntArray
    succ_lat_csr: FloatArray

    def csr(
        self,
    ) -> tuple[IntArray, IntArray, IntArray, FloatArray, IntArray, IntArray, FloatArray]:
        """``(order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat)``: the
        arguments the compiled loops (:mod:`perseus.solver.plan_kernels`) take first."""
        return (
            self.order_array,
            self.pred_ptr,
            self.pred_idx,
            self.pred_lat_csr,
            self.succ_ptr,
            self.succ_idx,
            self.succ_lat_csr,
        )

    def forward(self, time_s: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Earliest start and finish of every node (``time_s`` of shape (N,))."""
        from perseus.solver.plan_kernels import forward_pass

        start = np.empty(self.num_nodes)
        end = np.empty(self.num_nodes)
        t = np.ascontiguousarray(time_s, dtype=np.float64)
        forward_pass(*self.csr()[:4], t, start, end)
        return start, end

    def backward(self, time_s: FloatArray, deadline_s: float) -> FloatArray:
        """Latest finish of every node so that everything ends by ``deadline_s``."""
        from perseus.solver.plan_kernels import backward_pass

        late_start = np.empty(self.num_nodes)
        late_finish = np.empty(self.num_nodes)
        t = np.ascontiguousarray(time_s, dtype=np.float64)
        backward_pass(
            self.order_array, *self.csr()[4:], t, float(deadline_s), late_start, late_finish
        )
        return late_finish


def _csr(
    n: int, key: IntArray, other: IntArray, lat: FloatArray
) -> tuple[IntArray, IntArray, FloatArray]:
    """Per node ``v``, the ``other`` ends (and latencies) of the edges whose ``key`` end is
    ``v``, in edge order."""
    order = np.argsort(key, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=n), out=ptr[1:])
    return ptr, other[order], lat[order]


def build_topology(graph: OpGraph) -> Topology:
    """The CSR adjacency of ``graph``. Complexity: O(N + E log E)."""
    n, src, dst, lat = graph.num_nodes, graph.edge_src, graph.edge_dst, graph.edge_latency_s
    order = np.concatenate([np.zeros(0, dtype=np.int64), *graph.generations])
    return Topology(n, order, *_csr(n, dst, src, lat), *_csr(n, src, dst, lat))
