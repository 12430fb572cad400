"""Longest-path passes over an :class:`~perseus.dag.OpGraph` for the solver's inner loops.

The exact evaluator (:mod:`perseus.dag.evaluate`) answers "what does this plan cost"; the
solver's loops need the same longest path on plain arrays, plus latest finish times (for slack
and criticality). A :class:`Topology` holds the DAG as CSR predecessor/successor lists over a
topological order; its passes are the compiled ones (:mod:`perseus.solver.plan_kernels`), which
add and compare the same floats in the same order as the evaluator, so results are identical.

Complexity: O(N + E) per pass for N nodes and E edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag.graph import OpGraph

__all__ = ["Topology", "build_topology"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Topology:
    """Padded adjacency of a DAG. Slot ``N`` is a dummy node used as padding.

    Attributes:
        num_nodes: N.
        generations: Topological generations (from the OpGraph).
        pred, pred_lat_s: (N, dp) predecessors and the edge latency; padding points at N.
        succ, succ_lat_s: (N, ds) successors and the edge latency; padding points at N.
        is_source, is_sink: Nodes without predecessors / successors.
        order: All nodes in topological order (the generations concatenated).
        pred_lists, succ_lists: Per node, ``(neighbour, latency)`` pairs in edge order.
        order_array: ``order`` as an array.
        pred_ptr, pred_idx, pred_lat_csr: The predecessor lists in CSR form (node ``v``'s are
            ``pred_idx[pred_ptr[v]:pred_ptr[v+1]]``), for the compiled loops.
        succ_ptr, succ_idx, succ_lat_csr: The successor lists in CSR form.
    """

    num_nodes: int
    generations: tuple[IntArray, ...]
    pred: IntArray
    pred_lat_s: FloatArray
    succ: IntArray
    succ_lat_s: FloatArray
    is_source: BoolArray
    is_sink: BoolArray
    order: tuple[int, ...]
    pred_lists: tuple[tuple[tuple[int, float], ...], ...]
    succ_lists: tuple[tuple[tuple[int, float], ...], ...]
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
        """Earliest start and finish of every node (``time_s`` of shape (N,)).

        The same recurrence as the exact evaluator's :func:`perseus.dag.evaluate.longest_path`,
        run by the compiled loop the walk uses (:mod:`perseus.solver.plan_kernels`).
        """
        from perseus.solver.plan_kernels import forward_pass

        start = np.empty(self.num_nodes)
        end = np.empty(self.num_nodes)
        t = np.ascontiguousarray(time_s, dtype=np.float64)
        forward_pass(
            self.order_array, self.pred_ptr, self.pred_idx, self.pred_lat_csr, t, start, end
        )
        return start, end

    def backward(self, time_s: FloatArray, deadline_s: float) -> FloatArray:
        """Latest finish of every node so that everything ends by ``deadline_s``."""
        from perseus.solver.plan_kernels import backward_pass

        late_start = np.empty(self.num_nodes)
        late_finish = np.empty(self.num_nodes)
        t = np.ascontiguousarray(time_s, dtype=np.float64)
        backward_pass(
            self.order_array, self.succ_ptr, self.succ_idx, self.succ_lat_csr, t,
            float(deadline_s), late_start, late_finish,
        )  # fmt: skip
        return late_finish


def _padded(lists: list[list[tuple[int, float]]], n: int) -> tuple[IntArray, FloatArray]:
    width = max(1, max((len(x) for x in lists), default=0))
    idx = np.full((n, width), n, dtype=np.int64)
    lat = np.zeros((n, width))
    for i, items in enumerate(lists):
        for j, (v, w) in enumerate(items):
            idx[i, j] = v
            lat[i, j] = w
    return idx, lat


def _csr(lists: list[list[tuple[int, float]]]) -> tuple[IntArray, IntArray, FloatArray]:
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    idx = np.array([v for items in lists for v, _ in items], dtype=np.int64)
    lat = np.array([w for items in lists for _, w in items], dtype=np.float64)
    return ptr, idx, lat


def build_topology(graph: OpGraph) -> Topology:
    """Padded predecessor/successor tables of ``graph``. Complexity: O(N + E)."""
    n = graph.num_nodes
    preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for u, v, w in zip(
        graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_latency_s.tolist(), strict=True
    ):
        preds[v].append((u, w))
        succs[u].append((v, w))
    pred, pred_lat = _padded(preds, n)
    succ, succ_lat = _padded(succs, n)
    order = tuple(int(v) for gen in graph.generations for v in gen.tolist())
    pred_ptr, pred_idx, pred_lat_csr = _csr(preds)
    succ_ptr, succ_idx, succ_lat_csr = _csr(succs)
    return Topology(
        num_nodes=n,
        generations=graph.generations,
        pred=pred,
        pred_lat_s=pred_lat,
        succ=succ,
        succ_lat_s=succ_lat,
        is_source=np.array([not p for p in preds], dtype=np.bool_),
        is_sink=np.array([not s for s in succs], dtype=np.bool_),
        order=order,
        pred_lists=tuple(tuple(p) for p in preds),
        succ_lists=tuple(tuple(s) for s in succs),
        order_array=np.array(order, dtype=np.int64),
        pred_ptr=pred_ptr,
        pred_idx=pred_idx,
        pred_lat_csr=pred_lat_csr,
        succ_ptr=succ_ptr,
        succ_idx=succ_idx,
        succ_lat_csr=succ_lat_csr,
    )
