"""Longest-path passes over an :class:`~perseus.dag.OpGraph` for the solver's inner loops.

The exact evaluator (:mod:`perseus.dag.evaluate`) answers "what does this plan cost"; the
solver also needs latest finish times (for slack and criticality) and the binding path of a
candidate step. Pipeline DAGs have many small generations (a handful of nodes each), where
per-generation numpy calls cost more in overhead than the arithmetic, so the passes are plain
Python loops over a precomputed topological order with per-node predecessor/successor lists
(durations converted with one ``tolist()`` per pass). They add and compare the same floats in
the same order as a vectorised pass would, so results are identical. The padded numpy tables
are kept for callers that vectorise over generations (:mod:`perseus.solver.reclaim`).

Complexity: O(N + E) Python steps per pass for N nodes and E edges.
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
        arguments the compiled loops (:mod:`perseus.solver.compiled`) take first."""
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
        n = self.num_nodes
        t = time_s.tolist()
        end = [0.0] * n
        start = [0.0] * n
        preds = self.pred_lists
        for v in self.order:
            s = 0.0
            for u, w in preds[v]:
                r = end[u] + w
                if r > s:
                    s = r
            start[v] = s
            end[v] = s + t[v]
        return np.array(start), np.array(end)

    def backward(self, time_s: FloatArray, deadline_s: float) -> FloatArray:
        """Latest finish of every node so that everything ends by ``deadline_s``."""
        n = self.num_nodes
        t = time_s.tolist()
        deadline = float(deadline_s)
        late_start = [deadline] * n
        late_finish = [deadline] * n
        succs = self.succ_lists
        for v in reversed(self.order):
            lf = deadline
            for u, w in succs[v]:
                r = late_start[u] - w
                if r < lf:
                    lf = r
            late_finish[v] = lf
            late_start[v] = lf - t[v]
        return np.array(late_finish)

    def binding_path(self, time_s: FloatArray, end_s: FloatArray) -> list[int]:
        """Nodes of one longest path ending at the latest-finishing node (sink first)."""
        node = int(np.argmax(end_s))
        t = time_s.tolist()
        end = end_s.tolist()
        path = [node]
        start = end[node] - t[node]
        while True:
            preds = self.pred_lists[node]
            if not preds:
                return path
            best_u, best = -1, -np.inf
            for u, w in preds:  # first maximum, like argmax
                r = end[u] + w
                if r > best:
                    best_u, best = u, r
            if best < start - 1e-12 * max(1.0, abs(start)):
                return path  # starts at 0: no predecessor is binding
            node = best_u
            path.append(node)
            start = end[node] - t[node]


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
