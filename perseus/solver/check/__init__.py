"""Test oracles for the solver, kept off its hot path.

* :mod:`~perseus.solver.check.reference_walk`: the Phillips–Dessouky walk in numpy/Python on
  scipy's max flow (``trace(..., method="reference")``), the compiled walk step for step (the
  same frontier): its parity oracle, and ``perseus demo``'s walk while the kernels are not
  compiled yet.
* :mod:`~perseus.solver.check.milp`: the true optimum of a tiny job at a deadline (HiGHS MILP)
  and by brute force: "optimal over real one-clock plans", the yardstick of the frontier's
  quality (the LP floor, :mod:`perseus.solver.lp_bound`, is the relaxation's optimum).
* :mod:`~perseus.solver.check.maxflow`: the exact minimal min cut (int64 capacities on scipy's
  int32 max flow) the reference walk uses.

Nothing in the default solver path (``method="compiled"``) imports this package.
"""

__all__: list[str] = []
