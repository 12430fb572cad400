"""Slack reclaiming: slow every op that has slack to the cheapest clock that still fits.

Rounding a fractional plan to real clocks, or any heuristic plan, leaves ops that finish
before anyone waits for them. Walking the DAG backwards from the sinks, each op may end as late
as its successors' latest starts allow and may start as early as its predecessors (unchanged
so far) finish; among the op's Pareto options whose time fits that window we take the cheapest
in effective energy ``e − P·t`` (the slowest fitting Pareto option). The iteration time cannot
grow, because every op stays inside its latest-start window, and the energy cannot grow,
because each op's effective cost only drops while the makespan stays put.

Ops in one generation have no edges between them, so a generation is reclaimed at once.

Complexity: O(N·W + N·d) numpy work in O(G) steps (W options per op, G generations).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["reclaim_slack"]

IntArray = npt.NDArray[np.int64]


def reclaim_slack(model: CostModel, topo: Topology, option_index: IntArray) -> IntArray:
    """Per-node option indices after reclaiming slack (a new array; the input is untouched).

    Args:
        model: The job's cost model.
        topo: Its topology.
        option_index: (N,) index into each node's Pareto options (time ascending).

    Returns:
        (N,) option indices, each ≥ the input's (never faster), same or lower makespan.
    """
    n = topo.num_nodes
    types = model.node_type
    idx = option_index.copy()
    time_s = model.opt_time_s[types, idx]
    start, end = topo.forward(time_s)
    deadline = float(end.max())
    # Keep a hair of margin so rounding in the exact evaluator cannot lengthen the makespan.
    margin = 8 * np.finfo(np.float64).eps * max(deadline, 1.0)
    late_start = np.full(n + 1, deadline)
    for gen in reversed(topo.generations):
        lf = (late_start[topo.succ[gen]] - topo.succ_lat_s[gen]).min(axis=1)
        lf = np.minimum(lf, deadline)
        window = lf - start[gen] - margin
        table = model.opt_time_s[types[gen]]
        fits = (table <= window[:, None]).sum(axis=1) - 1
        new = np.maximum(idx[gen], fits)
        idx[gen] = new
        late_start[gen] = lf - np.maximum(model.opt_time_s[types[gen], new], 0.0)
    return idx
