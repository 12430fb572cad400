"""LP bounds: the least energy by a deadline, and the least time under a peak power cap.

Relaxing "one clock per op" to "any convex combination of an op's measured clocks" gives a
linear program (only each op's lower-hull vertices can be optimal, so only they are variables)::

    minimise   Σ_i Σ_k λ_ik (e_ik − P·t_ik) + P·R·M
    subject to Σ_k λ_ik = 1,  λ ≥ 0                      (op i mixes its clocks k)
               s_v ≥ s_u + Σ_k λ_uk t_uk + latency(u, v)  (every DAG edge u → v)
               s_i + Σ_k λ_ik t_ik ≤ M ≤ deadline,  s ≥ 0

whose value bounds every real plan's energy at that deadline from below. Under a peak cap
(:func:`lp_peak_time_bound_s`) the LP gains, over intervals of ``[0, T]``, the time ``τ_ikj``
op ``i`` spends at clock ``k`` in interval ``j`` of its window, with the ops' excess power
within the budget and each rank busy at most the interval's length in every interval; where
it has no solution no plan of makespan ``T`` fits the cap (``docs/power.md``).

Complexity: an LP with N·H + N + 1 variables and N + E + N rows (H hull vertices per op),
solved by HiGHS; under a peak cap, plus N·H variables per interval of each op's window, and one
solve per bisection step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from perseus.dag.graph import FloatArray, IntArray
from perseus.errors import InfeasibleError
from perseus.job import PlanningJob
from perseus.solver.cost_model import CostModel, build_cost_model
from perseus.solver.paths import build_topology

__all__ = ["lp_energy_floor_j", "lp_peak_time_bound_s"]


@dataclass(frozen=True, slots=True)
class _FloorLP:
    """The energy floor's LP (variables: the λs, the starts, then the makespan ``M``): per λ
    its node, time and effective cost (a hull vertex's, or an option's for the MILP), and the
    LP's objective and constraint rows."""

    lam_node: IntArray
    lam_t: FloatArray
    lam_c: FloatArray
    cost: FloatArray
    a_ub: sp.csr_array
    b_ub: FloatArray
    a_eq: sp.csr_array
    b_eq: FloatArray

    @property
    def num_vars(self) -> int:
        return int(self.cost.size)


def _floor_lp(job: PlanningJob, model: CostModel, options: bool = False) -> _FloorLP:
    """The LP floor's variables and rows (the deadline goes in ``M``'s bound); with
    ``options``, over every Pareto option instead of the hull vertices (the exact MILP's)."""
    g = job.graph
    n = g.num_nodes
    if options:
        counts, times, costs = model.num_opts, model.opt_time_s, model.opt_cost_j
    else:
        counts, times, costs = model.num_hull, model.hull_time_s, model.hull_cost_j
    nh = counts[model.node_type]
    lam_node = np.repeat(np.arange(n), nh)
    lam_k = np.concatenate([np.arange(h) for h in nh])
    lam_t = times[model.node_type[lam_node], lam_k]
    lam_c = costs[model.node_type[lam_node], lam_k]
    n_lam = lam_node.size
    s0, m_var = n_lam, n_lam + n  # start-time variables follow the λs, then the makespan
    cost = np.concatenate([lam_c, np.zeros(n), [model.blocking_power_w * g.num_ranks]])
    a_eq = sp.csr_array((np.ones(n_lam), (lam_node, np.arange(n_lam))), shape=(n, m_var + 1))
    ne = g.edge_src.size
    erow = np.arange(ne)
    # Edge u -> v:  s_u - s_v + Σ λ_u t_u <= -latency.
    lam_of_node = np.split(np.arange(n_lam), np.cumsum(nh)[:-1])
    lam_idx = (
        np.concatenate([lam_of_node[u] for u in g.edge_src.tolist()])
        if ne
        else np.zeros(0, dtype=np.int64)
    )
    # Node i finishes by M:  s_i + Σ λ_i t_i - M <= 0.
    nrow = ne + np.arange(n)
    rows = [erow, erow, np.repeat(erow, nh[g.edge_src]), nrow, ne + lam_node, nrow]
    cols = [s0 + g.edge_src, s0 + g.edge_dst, lam_idx, s0 + np.arange(n), np.arange(n_lam)]
    cols.append(np.full(n, m_var))
    vals = [np.ones(ne), -np.ones(ne), lam_t[lam_idx], np.ones(n), lam_t, -np.ones(n)]
    a_ub = sp.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(ne + n, m_var + 1),
    )
    b_ub = np.concatenate([-g.edge_latency_s, np.zeros(n)])
    return _FloorLP(lam_node, lam_t, lam_c, cost, a_ub, b_ub, a_eq, np.ones(n))


def lp_energy_floor_j(job: PlanningJob, deadline_s: float) -> float:
    """The LP relaxation's least energy for ``job`` within ``deadline_s``.

    Raises:
        InfeasibleError: if even all-fastest ops cannot meet ``deadline_s``, or HiGHS fails.
    """
    lp = _floor_lp(job, build_cost_model(job))
    bounds = [(0.0, None)] * (lp.num_vars - 1) + [(0.0, float(deadline_s))]
    res = linprog(
        lp.cost,
        A_ub=lp.a_ub,
        b_ub=lp.b_ub,
        A_eq=lp.a_eq,
        b_eq=lp.b_eq,
        bounds=bounds,
        method="highs",
    )
    if res.status == 2:
        raise InfeasibleError(f"no plan, even mixing clocks, finishes within {deadline_s:.6g} s")
    if res.status != 0:
        raise InfeasibleError(f"HiGHS could not solve the LP floor: {res.message}")
    return float(res.fun)


def _peak_feasible(
    job: PlanningJob,
    lp: _FloorLP,
    head: FloatArray,
    tail: FloatArray,
    budget_w: float,
    time_s: float,
    intervals: int,
) -> bool:
    """Whether the peak LP (module docstring) has a solution with makespan at most ``time_s``."""
    g = job.graph
    width = time_s / intervals
    node = lp.lam_node
    first = np.floor(head[node] / width).astype(np.int64)
    last = np.minimum(np.ceil((time_s - tail[node]) / width).astype(np.int64), intervals)
    span = np.maximum(last - first, 0)
    tau_lam = np.repeat(np.arange(node.size), span)  # the λ each τ belongs to
    tau_j = np.arange(tau_lam.size) - np.repeat(np.cumsum(span) - span, span) + first[tau_lam]
    excess_w = np.divide(lp.lam_c, lp.lam_t, out=np.zeros_like(lp.lam_c), where=lp.lam_t > 0)
    n0, n_tau = lp.num_vars, tau_lam.size
    tau_col = n0 + np.arange(n_tau)
    # Σ_j τ_ikj − λ_ik t_ik = 0
    link = sp.csr_array(
        (
            np.concatenate([np.ones(n_tau), -lp.lam_t]),
            (
                np.concatenate([tau_lam, np.arange(node.size)]),
                np.concatenate([tau_col, np.arange(node.size)]),
            ),
        ),
        shape=(node.size, n0 + n_tau),
    )
    power = sp.csr_array((excess_w[tau_lam], (tau_j, tau_col)), shape=(intervals, n0 + n_tau))
    rank_row = g.rank[node[tau_lam]] * intervals + tau_j
    busy = sp.csr_array(
        (np.ones(n_tau), (rank_row, tau_col)), shape=(g.num_ranks * intervals, n0 + n_tau)
    )
    a_ub = sp.vstack([sp.hstack([lp.a_ub, sp.csr_array((lp.b_ub.size, n_tau))]), power, busy])
    a_eq = sp.vstack([sp.hstack([lp.a_eq, sp.csr_array((lp.b_eq.size, n_tau))]), link])
    excess_budget_w = budget_w - job.blocking_power_w * g.num_ranks
    b_ub = np.concatenate(
        [
            lp.b_ub,
            np.full(intervals, excess_budget_w * width),
            np.full(g.num_ranks * intervals, width),
        ]
    )
    b_eq = np.concatenate([lp.b_eq, np.zeros(node.size)])
    bounds = [(0.0, None)] * (n0 - 1) + [(0.0, time_s)] + [(0.0, None)] * n_tau
    res = linprog(
        np.zeros(n0 + n_tau),
        A_ub=sp.csr_array(a_ub),
        b_ub=b_ub,
        A_eq=sp.csr_array(a_eq),
        b_eq=b_eq,
        bounds=bounds,
        method="highs-ipm",
    )
    return bool(res.status != 2)  # only a proof of infeasibility counts


def lp_peak_time_bound_s(
    job: PlanningJob,
    budget_w: float,
    upper_s: float,
    *,
    intervals: int = 64,
    rel_tol: float = 1e-3,
    max_time_vars: int = 2_000_000,
) -> float:
    """A lower bound on the time of any plan of ``job`` whose peak summed power is at most
    ``budget_w``: the largest makespan, bisected between the fastest plan's and ``upper_s`` to
    ``rel_tol``, at which the peak LP has no solution. Large jobs get fewer ``intervals`` (at
    most about ``max_time_vars`` time variables; a coarser, still valid bound).
    """
    model = build_cost_model(job)
    lp = _floor_lp(job, model)
    intervals = max(1, min(intervals, max_time_vars // max(lp.lam_node.size, 1)))
    fastest_s = model.hull_time_s[model.node_type, 0]
    topo = build_topology(job.graph)
    # Per node, its longest path from the start (head) and to the end (tail), all fastest.
    head, tail = topo.forward(fastest_s)[0], -topo.backward(fastest_s, 0.0)
    lo = float((head + fastest_s).max())  # no plan is faster
    hi = max(float(upper_s), lo)
    if not _peak_feasible(job, lp, head, tail, budget_w, lo, intervals):
        while hi - lo > rel_tol * lo:
            mid = 0.5 * (lo + hi)
            if _peak_feasible(job, lp, head, tail, budget_w, mid, intervals):
                hi = mid
            else:
                lo = mid
    return lo
