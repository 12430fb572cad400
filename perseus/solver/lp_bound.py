"""The LP floor: the least energy any plan could use by a deadline if ops could mix clocks.

Relaxing "one clock per op" to "any convex combination of an op's measured clocks" turns the
planning problem into a linear program::

    minimise   Σ_i Σ_k λ_ik (e_ik − P·t_ik) + P·R·M
    subject to Σ_k λ_ik = 1,  λ ≥ 0                      (op i mixes its clocks k)
               s_v ≥ s_u + Σ_k λ_uk t_uk + latency(u, v)  (every DAG edge u → v)
               s_i + Σ_k λ_ik t_ik ≤ M ≤ deadline,  s ≥ 0

whose value is a lower bound on every real plan's energy at that deadline (a real plan is a
0/1 ``λ``). Only the lower-hull vertices of each op's options can be optimal, so only they are
variables. scipy's HiGHS solves it; at 8×96 on the bundled profiles that takes a few seconds.

Complexity: an LP with N·H + N + 1 variables and N + E + N rows (H hull vertices per op),
solved by HiGHS's dual simplex / IPM.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from perseus.errors import InfeasibleError
from perseus.job import PlanningJob
from perseus.solver.cost_model import build_cost_model

__all__ = ["lp_energy_floor_j"]


def lp_energy_floor_j(job: PlanningJob, deadline_s: float) -> float:
    """The LP relaxation's least energy for ``job`` within ``deadline_s``.

    Raises:
        InfeasibleError: if even all-fastest ops cannot meet ``deadline_s``, or HiGHS fails.
    """
    model = build_cost_model(job)
    g = job.graph
    n = g.num_nodes
    types = model.node_type
    nh = model.num_hull[types]
    lam_node = np.repeat(np.arange(n), nh)
    lam_k = np.concatenate([np.arange(h) for h in nh])
    lam_t = model.hull_time_s[types[lam_node], lam_k]
    lam_c = model.hull_cost_j[types[lam_node], lam_k]
    n_lam = lam_node.size
    s0 = n_lam  # start-time variables follow the λs
    m_var = n_lam + n  # then the makespan
    n_var = m_var + 1
    power_ranks = model.blocking_power_w * g.num_ranks

    cost = np.concatenate([lam_c, np.zeros(n), [power_ranks]])
    # Σ_k λ_ik = 1
    a_eq = sp.csr_array((np.ones(n_lam), (lam_node, np.arange(n_lam))), shape=(n, n_var))
    b_eq = np.ones(n)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    # Edge u -> v:  s_u - s_v + Σ λ_u t_u <= -latency.
    ne = g.edge_src.size
    erow = np.arange(ne)
    rows += [erow, erow]
    cols += [s0 + g.edge_src, s0 + g.edge_dst]
    vals += [np.ones(ne), -np.ones(ne)]
    # λ terms of each edge's source node.
    lam_of_node = np.split(np.arange(n_lam), np.cumsum(nh)[:-1])
    counts = nh[g.edge_src]
    rows.append(np.repeat(erow, counts))
    lam_idx = (
        np.concatenate([lam_of_node[u] for u in g.edge_src.tolist()])
        if ne
        else np.zeros(0, dtype=np.int64)
    )
    cols.append(lam_idx)
    vals.append(lam_t[lam_idx])
    # Node i finishes by M:  s_i + Σ λ_i t_i - M <= 0.
    nrow = ne + np.arange(n)
    rows += [nrow, ne + lam_node, nrow]
    cols += [s0 + np.arange(n), np.arange(n_lam), np.full(n, m_var)]
    vals += [np.ones(n), lam_t, -np.ones(n)]
    a_ub = sp.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(ne + n, n_var)
    )
    b_ub = np.concatenate([-g.edge_latency_s, np.zeros(n)])
    bounds = [(0.0, None)] * (n_lam + n) + [(0.0, float(deadline_s))]
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status == 2:
        raise InfeasibleError(f"no plan, even mixing clocks, finishes within {deadline_s:.6g} s")
    if res.status != 0:
        raise InfeasibleError(f"HiGHS could not solve the LP floor: {res.message}")
    return float(res.fun)
