"""Slack reclaiming: slow every op that has slack to the cheapest clock that still fits.

Walking the DAG backwards from the sinks, each op may end as late as its successors' latest
starts allow and start as early as its predecessors finish; it takes the slowest Pareto option
that fits that window (the cheapest in effective energy ``e − P·t``). Neither the iteration
time nor the energy can grow. Complexity: O(N·log W + E) per plan (W options per op).
"""

from __future__ import annotations

import numpy as np

from perseus.dag.graph import IntArray
from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["reclaim_slack"]


def reclaim_slack(model: CostModel, topo: Topology, plans: IntArray) -> IntArray:
    """Per-node option indices after reclaiming slack (a new array; compiled).

    Args:
        plans: (N,) or (K, N) indices into each node's Pareto options (time ascending).

    Returns:
        Option indices of the same shape, each ≥ the input's, same or lower makespan.
    """
    from perseus.solver.plan_kernels import reclaim_kernel

    rows = np.ascontiguousarray(np.atleast_2d(plans), dtype=np.int64)
    out: IntArray = reclaim_kernel(topo.csr(), model.node_type, model.opt_time_s, rows)
    return out[0] if np.ndim(plans) == 1 else out
