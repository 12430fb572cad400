"""Pairwise local search: slow one op, speed another, keep the makespan, lower the energy.

Rounding a fractional LP plan to real clocks loses most on small jobs, where a handful of
fractional ops decide the result. Slack reclaiming only slows ops that have slack; this pass
also tries *exchanges*: slow op ``i`` by one option and, if that lengthens the iteration,
speed up one op ``j`` (by one option) on the new longest path, accepting the pair when the
makespan does not grow and the effective energy drops. Rounds repeat until nothing improves.

Complexity: O(N·L·(N + E)) per round (L = longest-path length), so it is only used on small
jobs (see :mod:`perseus.solver.frontier`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["descend_greedy", "improve_pairwise"]

IntArray = npt.NDArray[np.int64]

_MAX_ROUNDS = 20


def improve_pairwise(model: CostModel, topo: Topology, option_index: IntArray) -> IntArray:
    """A plan no slower and no costlier than ``option_index`` (a new array).

    Args:
        model: The job's cost model.
        topo: Its topology.
        option_index: (N,) Pareto option index per node.
    """
    types = model.node_type
    rows = np.arange(topo.num_nodes)
    table, cost = model.opt_time_s[types], model.opt_cost_j[types]
    top = model.num_opts[types] - 1
    idx = option_index.copy()
    deadline = float(topo.forward(table[rows, idx])[1].max())
    bound = deadline * (1 + 1e-12)
    for _ in range(_MAX_ROUNDS):
        improved = False
        for i in range(topo.num_nodes):
            if idx[i] >= top[i]:
                continue
            idx[i] += 1
            t = table[rows, idx]
            _, end = topo.forward(t)
            if end.max() <= bound:
                improved = True
                continue
            gain = cost[i, idx[i] - 1] - cost[i, idx[i]]
            best_j, best_net = -1, 0.0
            for j in topo.binding_path(t, end):
                if j == i or idx[j] == 0:
                    continue
                net = cost[j, idx[j] - 1] - cost[j, idx[j]] - gain
                if net >= best_net:
                    continue
                idx[j] -= 1
                if topo.forward(table[rows, idx])[1].max() <= bound:
                    best_j, best_net = j, net
                idx[j] += 1
            if best_j >= 0:
                idx[best_j] -= 1
                improved = True
            else:
                idx[i] -= 1
        if not improved:
            break
    return idx


def descend_greedy(
    model: CostModel, topo: Topology, option_index: IntArray, per_second: bool = True
) -> list[IntArray]:
    """Plans met while repeatedly speeding up the op on the longest path that costs the least
    extra effective energy per second saved (one option at a time), fastest-reachable last.

    On small jobs the discrete frontier is a fine staircase between the LP's breakpoints; this
    walk visits the plans in between. With ``per_second=False`` the cheapest step in absolute
    energy is taken instead (small, cheap steps fill other stairs).

    Complexity: O(N·W) steps of one longest-path pass each.
    """
    types = model.node_type
    rows = np.arange(topo.num_nodes)
    table, cost = model.opt_time_s[types], model.opt_cost_j[types]
    idx = option_index.copy()
    out: list[IntArray] = []
    for _ in range(int(model.num_opts[types].sum())):
        t = table[rows, idx]
        _, end = topo.forward(t)
        path = np.array(topo.binding_path(t, end))
        can = idx[path] > 0
        if not can.any():
            break
        p, i = path[can], idx[path][can]
        rate = cost[p, i - 1] - cost[p, i]
        if per_second:
            rate = rate / (table[p, i] - table[p, i - 1])
        idx[p[int(np.argmin(rate))]] -= 1
        out.append(idx.copy())
    return out
