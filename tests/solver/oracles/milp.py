"""Exact optima for tiny jobs, to check the frontier tracer against (tests, benchmarks).

* :func:`optimal_energy_j`: a MILP (scipy's HiGHS), the LP of :mod:`perseus.solver.lp_bound`
  over each op's Pareto options (only they can be optimal) with the clock choice ``λ`` binary.
* :func:`brute_force_energy_j`: every assignment of every measured clock, exactly evaluated.

Complexity: MILP worst case exponential in N (fine for ≤ 12 ops × ≤ 5 clocks, milliseconds);
brute force O(K^N · (N + E)) for K clocks per op.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from perseus.dag.evaluate import evaluate_many, node_ops
from perseus.errors import ConfigError, InfeasibleError
from perseus.job import PlanningJob
from perseus.solver.cost_model import build_cost_model
from perseus.solver.lp_bound import _floor_lp

__all__ = ["brute_force_energy_j", "optimal_energy_j"]

_MAX_BRUTE_FORCE = 2_000_000


def optimal_energy_j(job: PlanningJob, deadline_s: float) -> float:
    """The least energy of any real plan of ``job`` that finishes within ``deadline_s``.

    Raises:
        InfeasibleError: if no plan meets the deadline or HiGHS fails.
    """
    lp = _floor_lp(job, build_cost_model(job), options=True)
    n_lam, n_var = lp.lam_node.size, lp.num_vars
    upper = np.concatenate([np.ones(n_lam), np.full(n_var - n_lam - 1, np.inf), [deadline_s]])
    res = milp(
        lp.cost,
        constraints=[
            LinearConstraint(lp.a_ub, -np.inf, lp.b_ub),
            LinearConstraint(lp.a_eq, lp.b_eq, lp.b_eq),
        ],
        integrality=np.concatenate([np.ones(n_lam), np.zeros(n_var - n_lam)]),
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
    ops = [op.options for op in node_ops(g, job.profile)]
    total = int(np.prod([len(o) for o in ops], dtype=np.float64))
    if total > _MAX_BRUTE_FORCE:
        raise ConfigError(
            f"brute force needs {total} evaluations (max {_MAX_BRUTE_FORCE}); use optimal_energy_j"
        )
    best = np.inf
    combos = itertools.product(*[range(len(o)) for o in ops])
    while chunk := list(itertools.islice(combos, 4096)):
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
