"""Fill the gaps between rounded frontier points with a Pareto local search.

Every plan of the walk is rounded, so the frontier is a staircase; the cheapest real plan in
a gap is often an option step or two away. The search tries each op one option faster and
slower (tiny jobs: also two-op exchanges) from every plan new to a Pareto archive, reclaimed,
until a round adds nothing or the budget is spent (largest staircase steps first).
Complexity: O(K·N·(N + E)) per round for K new archive plans, capped at ``work_budget``.
"""

from __future__ import annotations

import numpy as np

from perseus.dag.graph import FloatArray, IntArray
from perseus.profile.pareto import pareto_indices
from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["DEFAULT_WORK_BUDGET", "PAIR_MOVES_MAX_NODES", "plan_figures", "search_neighbours"]

#: Node-and-edge visits the search may spend (about a second compiled on one core).
DEFAULT_WORK_BUDGET = 1e8
#: One-clock jobs up to this many ops also try two-op moves (O(N²) neighbours per plan).
PAIR_MOVES_MAX_NODES = 16


def search_neighbours(
    model: CostModel,
    topo: Topology,
    num_ranks: int,
    plans: IntArray,
    work_budget: float = DEFAULT_WORK_BUDGET,
) -> IntArray:
    """The Pareto set of ``plans`` after a local search around it (option indices, (K', N)).

    Args:
        num_ranks: GPUs that draw blocking power while idle.
        plans: (K, N) option indices to start from.

    Returns:
        The plans no other plan found dominates, sorted by time (every input plan is in it or
        dominated by one in it).
    """
    from perseus.solver.plan_kernels import neighbour_kernel

    power_ranks = model.blocking_power_w * num_ranks
    tables = (model.node_type, model.opt_time_s, model.opt_cost_j)
    rows = np.ascontiguousarray(plans, dtype=np.int64)
    times, energies = plan_figures(model, topo, num_ranks, rows)
    keep = pareto_indices(times, energies)
    archive, arch_t, arch_e = rows[keep], times[keep], energies[keep]
    fresh = np.ones(len(archive), dtype=np.bool_)
    # Two-clock options are a fine grid: one-op moves already reach what exchanges would.
    pairs = topo.num_nodes <= PAIR_MOVES_MAX_NODES and not model.opt_layers_at_a.any()
    moves = 2 * topo.num_nodes * (topo.num_nodes if pairs else 1)
    # Per neighbour: a reclaim (a binary search per op), a longest path, an evaluation.
    log_w = max(1.0, float(np.log2(model.opt_time_s.shape[1])))
    per_plan = moves * (3 + log_w) * (topo.num_nodes + topo.pred_idx.size)
    spent = 0.0
    while fresh.any():
        affordable = int((work_budget - spent) // per_plan)
        if affordable <= 0:
            break
        picked = np.flatnonzero(fresh)
        if affordable < picked.size:
            # Largest staircase steps (time × energy up to the next archive point) first.
            step = np.diff(arch_t, append=arch_t[-1]) * -np.diff(arch_e, append=arch_e[-1])
            picked = picked[np.argsort(-step[picked], kind="stable")[:affordable]]
        sources = archive[picked]
        spent += len(sources) * per_plan
        found, found_t, found_e = neighbour_kernel(
            topo.csr(), *tables, model.num_opts, power_ranks, sources, arch_t, arch_e, pairs
        )
        if len(found) == 0:
            break
        every = np.concatenate([archive, found])
        every_t, every_e = np.concatenate([arch_t, found_t]), np.concatenate([arch_e, found_e])
        keep = pareto_indices(every_t, every_e)
        fresh = keep >= len(archive)
        archive, arch_t, arch_e = every[keep], every_t[keep], every_e[keep]
    return archive


def plan_figures(
    model: CostModel, topo: Topology, num_ranks: int, plans: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Time and energy (``Σ (e − P·t) + P·R·T``, so the last bits may differ from the exact
    evaluator's) of each row of ``plans`` (option indices), compiled; for filtering."""
    from perseus.solver.plan_kernels import evaluate_kernel

    tables = (model.node_type, model.opt_time_s, model.opt_cost_j)
    rows = np.ascontiguousarray(plans, dtype=np.int64)
    times, energies = evaluate_kernel(
        topo.csr()[:4], *tables, model.blocking_power_w * num_ranks, rows
    )
    return times, energies
