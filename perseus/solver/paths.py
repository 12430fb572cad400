"""Longest-path passes over an :class:`~perseus.dag.OpGraph` for the solver's inner loops.

The exact evaluator (:mod:`perseus.dag.evaluate`) answers "what does this plan cost"; the
solver also needs latest finish times (for slack and criticality) and the binding path of a
candidate step. Both passes walk the DAG's topological generations with per-node padded
predecessor/successor tables, so each generation is a handful of numpy gathers without
``ufunc.at``.

Complexity: O(N·d + G) numpy work for N nodes of in/out degree ≤ d in G generations.
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
    """

    num_nodes: int
    generations: tuple[IntArray, ...]
    pred: IntArray
    pred_lat_s: FloatArray
    succ: IntArray
    succ_lat_s: FloatArray
    is_source: BoolArray
    is_sink: BoolArray

    def forward(self, time_s: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Earliest start and finish of every node (``time_s`` of shape (N,))."""
        n = self.num_nodes
        end = np.zeros(n + 1)
        start = np.zeros(n)
        for gen in self.generations:
            ready = end[self.pred[gen]] + self.pred_lat_s[gen]
            s = ready.max(axis=1)
            start[gen] = s
            end[gen] = s + time_s[gen]
        return start, end[:n]

    def backward(self, time_s: FloatArray, deadline_s: float) -> FloatArray:
        """Latest finish of every node so that everything ends by ``deadline_s``."""
        n = self.num_nodes
        late_start = np.full(n + 1, deadline_s)
        late_finish = np.empty(n)
        for gen in reversed(self.generations):
            lf = (late_start[self.succ[gen]] - self.succ_lat_s[gen]).min(axis=1)
            lf = np.minimum(lf, deadline_s)
            late_finish[gen] = lf
            late_start[gen] = lf - time_s[gen]
        return late_finish

    def binding_path(self, time_s: FloatArray, end_s: FloatArray) -> list[int]:
        """Nodes of one longest path ending at the latest-finishing node (sink first)."""
        node = int(np.argmax(end_s))
        path = [node]
        start = end_s[node] - time_s[node]
        while True:
            preds = self.pred[node]
            real = preds < self.num_nodes
            if not real.any():
                return path
            ready = end_s[preds[real]] + self.pred_lat_s[node][real]
            j = int(np.argmax(ready))
            if ready[j] < start - 1e-12 * max(1.0, abs(start)):
                return path  # starts at 0: no predecessor is binding
            node = int(preds[real][j])
            path.append(node)
            start = end_s[node] - time_s[node]


def _padded(lists: list[list[tuple[int, float]]], n: int) -> tuple[IntArray, FloatArray]:
    width = max(1, max((len(x) for x in lists), default=0))
    idx = np.full((n, width), n, dtype=np.int64)
    lat = np.zeros((n, width))
    for i, items in enumerate(lists):
        for j, (v, w) in enumerate(items):
            idx[i, j] = v
            lat[i, j] = w
    return idx, lat


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
    return Topology(
        num_nodes=n,
        generations=graph.generations,
        pred=pred,
        pred_lat_s=pred_lat,
        succ=succ,
        succ_lat_s=succ_lat,
        is_source=np.array([not p for p in preds], dtype=np.bool_),
        is_sink=np.array([not s for s in succs], dtype=np.bool_),
    )
