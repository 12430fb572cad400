"""Fill the gaps between rounded frontier points with a Pareto local search.

**Why.** The min-cut walk traces the relaxation exactly, but every real plan comes from
rounding a fractional one, so the frontier is a staircase of rounded plans with gaps between
them. On measured (non-convex) profiles the cheapest real plan at a deadline inside a gap is
often one or two option steps away from a rounded plan: an op between two hull vertices runs at
a clock that is on no hull (lowtime, stepping one quantum at a time, lands on some of those),
or two ops on one path are slowed together. On tiny jobs a gap cost up to 0.6 % against the
MILP optimum, and on 4×8 a few of lowtime's 1110 plans fell into gaps (by up to 0.08 %).

**How.** A Pareto local search: keep an archive of mutually non-dominated plans (time, energy);
for every plan new to the archive, try each op one option faster and one option slower,
reclaim slack, and keep the neighbours no archive point dominates; repeat until a round adds
nothing or the work budget is spent. When the budget cannot pay for a whole round, the points
in front of the largest staircase steps (time gap × energy drop to the next point) go first;
jobs of thousands of ops get a few points' neighbourhoods, where one option step moves the
iteration by far less than the gap between frontier points anyway. The compiled kernel
(:func:`perseus.solver.plan_kernels.neighbour_kernel`) drops dominated neighbours before they reach
Python. Plans only ever enter through their own exact longest path, so nothing here changes
what a plan costs; the caller still evaluates the survivors with the exact evaluator.

Complexity: a round costs O(K·N·(N + E)) for K new archive plans (2N neighbours each, one
reclaim and one longest-path pass per neighbour); the budget caps the total at
``work_budget`` node-and-edge visits, so tiny jobs converge and large ones get part of a round.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perseus.profile.pareto import pareto_indices
from perseus.solver.cost_model import CostModel
from perseus.solver.paths import Topology

__all__ = ["DEFAULT_WORK_BUDGET", "PAIR_MOVES_MAX_NODES", "plan_figures", "search_neighbours"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: Node-and-edge visits the search may spend (about a second compiled on one core).
DEFAULT_WORK_BUDGET = 1e8
#: Jobs up to this many ops also try two-op moves (see :func:`search_neighbours`).
PAIR_MOVES_MAX_NODES = 16


def search_neighbours(
    model: CostModel,
    topo: Topology,
    num_ranks: int,
    plans: IntArray,
    work_budget: float = DEFAULT_WORK_BUDGET,
    pairs: bool | None = None,
) -> IntArray:
    """The Pareto set of ``plans`` after a local search around it (option indices, (K', N)).

    Args:
        model: The job's cost model.
        topo: Its topology.
        num_ranks: GPUs that draw blocking power while idle.
        plans: (K, N) option indices to start from.
        work_budget: Node-and-edge visits the search may spend in all.
        pairs: Also move two ops at once (O(N²) neighbours per plan instead of O(N));
            ``None`` (default) does so on one-clock jobs of at most
            :data:`PAIR_MOVES_MAX_NODES` ops, where rounding a few fractional ops decides
            the result.

    Returns:
        The archive: plans no other plan found dominates, sorted by time. Every input plan is
        either in it or dominated by a plan in it.
    """
    from perseus.solver.plan_kernels import neighbour_kernel

    power_ranks = model.blocking_power_w * num_ranks
    tables = (model.node_type, model.opt_time_s, model.opt_cost_j)
    rows = np.ascontiguousarray(plans, dtype=np.int64)
    times, energies = plan_figures(model, topo, num_ranks, rows)
    keep = pareto_indices(times, energies)
    archive, arch_t, arch_e = rows[keep], times[keep], energies[keep]
    fresh = np.ones(len(archive), dtype=np.bool_)
    if pairs is None:
        # Two-clock options are a fine grid (one step moves an op by a layer's share), so a
        # one-op move already reaches what an exchange would; pairs would only multiply work.
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
            # Largest staircase steps first: a point's step is the area (time × energy) up to
            # the next slower archive point, where a plan in between would save the most.
            step = np.diff(arch_t, append=arch_t[-1]) * -np.diff(arch_e, append=arch_e[-1])
            picked = picked[np.argsort(-step[picked], kind="stable")[:affordable]]
        sources = archive[picked]
        spent += len(sources) * per_plan
        found, found_t, found_e = neighbour_kernel(
            *topo.csr(),
            *tables,
            model.num_opts,
            power_ranks,
            sources,
            arch_t,
            arch_e,
            pairs,
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
    """Time and energy of each row of ``plans`` (option indices), compiled.

    The same longest path as the exact evaluator; energy is summed as ``Σ (e − P·t) + P·R·T``,
    so it can differ from the evaluator's in the last bits. For filtering candidates; reported
    figures come from :mod:`perseus.dag.evaluate`.
    """
    from perseus.solver.plan_kernels import evaluate_kernel

    times, energies = evaluate_kernel(
        *topo.csr()[:4],
        model.node_type,
        model.opt_time_s,
        model.opt_cost_j,
        model.blocking_power_w * num_ranks,
        np.ascontiguousarray(plans, dtype=np.int64),
    )
    return times, energies
