"""Exact optima for tiny jobs, to check the frontier tracer against (tests, benchmarks).

* :func:`optimal_energy_j` solves the planning problem at one deadline as a MILP with scipy's
  HiGHS: the LP of :mod:`perseus.solver.lp_bound` over each op's Pareto options, with the
  clock choice ``λ`` binary. Only Pareto options can be optimal (any other clock is beaten in
  both time and effective energy), so nothing is lost by leaving the others out.
* :func:`brute_force_energy_j` enumerates every clock assignment (all measured clocks, not
  only Pareto ones) and evaluates each with the exact evaluator, for cross-checking the MILP.

Complexity: MILP worst case exponential in N (fine for ≤ 12 ops × ≤ 5 clocks, milliseconds);
brute force O(K^N · (N + E)) for K clocks per op.
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from perseus.dag.evaluate import evaluate_many
from perseus.errors import ConfigError, InfeasibleError
from perseus.job import PlanningJob
from perseus.schedule.actions import Kind
from perseus.solver.cost_model import build_cost_model

__all__ = ["brute_force_energy_j", "optimal_energy_j"]

_MAX_BRUTE_FORCE = 2_000_000


def optimal_energy_j(job: PlanningJob, deadline_s: float) -> float:
    """The least energy of any real plan of ``job`` that finishes within ``deadline_s``.

    Raises:
        InfeasibleError: if no plan meets the deadline or HiGHS fails.
    """
    model = build_cost_model(job)
    g = job.graph
    n = g.num_nodes
    types = model.node_type
    no = model.num_opts[types]
    x_node = np.repeat(np.arange(n), no)
    x_k = np.concatenate([np.arange(k) for k in no])
    x_t = model.opt_time_s[types[x_node], x_k]
    x_c = model.opt_cost_j[types[x_node], x_k]
    nx_ = x_node.size
    s0, m_var = nx_, nx_ + n
    n_var = m_var + 1
    ne = g.edge_src.size
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    # One option per op.
    rows.append(x_node)
    cols.append(np.arange(nx_))
    vals.append(np.ones(nx_))
    lo.append(np.ones(n))
    hi.append(np.ones(n))
    base = n
    # Edges u -> v: s_v - s_u - Σ x_u t_u >= latency.
    of_node = np.split(np.arange(nx_), np.cumsum(no)[:-1])
    for e, (u, v) in enumerate(zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True)):
        r = base + e
        idx = of_node[u]
        rows += [np.array([r, r]), np.full(idx.size, r)]
        cols += [np.array([s0 + v, s0 + u]), idx]
        vals += [np.array([1.0, -1.0]), -x_t[idx]]
    lo.append(g.edge_latency_s.copy())
    hi.append(np.full(ne, np.inf))
    base += ne
    # M - s_i - Σ x_i t_i >= 0.
    for i in range(n):
        r = base + i
        idx = of_node[i]
        rows += [np.array([r, r]), np.full(idx.size, r)]
        cols += [np.array([m_var, s0 + i]), idx]
        vals += [np.array([1.0, -1.0]), -x_t[idx]]
    lo.append(np.zeros(n))
    hi.append(np.full(n, np.inf))
    a = sp.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(base + n, n_var),
    )
    cost = np.concatenate([x_c, np.zeros(n), [model.blocking_power_w * g.num_ranks]])
    integrality = np.concatenate([np.ones(nx_), np.zeros(n + 1)])
    upper = np.concatenate([np.ones(nx_), np.full(n, np.inf), [float(deadline_s)]])
    res = milp(
        cost,
        constraints=LinearConstraint(a, np.concatenate(lo), np.concatenate(hi)),
        integrality=integrality,
        bounds=Bounds(np.zeros(n_var), upper),
        options={"mip_rel_gap": 1e-9},
    )
    if res.status == 2 or res.x is None:
        raise InfeasibleError(f"no plan finishes within {deadline_s:.6g} s")
    if res.status != 0:
        raise InfeasibleError(f"HiGHS could not solve the MILP: {res.message}")
    return float(res.fun)


def brute_force_energy_j(job: PlanningJob, deadline_s: float) -> float:
    """Least energy within ``deadline_s`` by enumerating every clock of every op.

    Raises:
        ConfigError: if there are more than two million assignments.
        InfeasibleError: if no assignment meets the deadline.
    """
    g = job.graph
    kinds = list(Kind)
    ops = [
        job.profile.op(int(s), kinds[int(k)]).options for s, k in zip(g.stage, g.kind, strict=True)
    ]
    total = int(np.prod([len(o) for o in ops], dtype=np.float64))
    if total > _MAX_BRUTE_FORCE:
        raise ConfigError(
            f"brute force needs {total} evaluations (max {_MAX_BRUTE_FORCE}); use optimal_energy_j"
        )
    best = np.inf
    combos = itertools.product(*[range(len(o)) for o in ops])
    while True:
        chunk = list(itertools.islice(combos, 4096))
        if not chunk:
            break
        idx = np.array(chunk)
        t = np.array([[ops[i][j].time_s for i, j in enumerate(row)] for row in idx])
        e = np.array([[ops[i][j].energy_j for i, j in enumerate(row)] for row in idx])
        times, energies = evaluate_many(g, t, e, job.blocking_power_w)
        ok = times <= deadline_s * (1 + 1e-12)
        if ok.any():
            best = min(best, float(energies[ok].min()))
    if not np.isfinite(best):
        raise InfeasibleError(f"no plan finishes within {deadline_s:.6g} s")
    return float(best)
