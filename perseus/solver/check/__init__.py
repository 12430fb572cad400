"""Test oracles for the solver, kept off its hot path (the default ``method="compiled"``
never imports them): the reference walk (:mod:`~perseus.solver.check.reference_walk`) and its
max flow (:mod:`~perseus.solver.check.maxflow`), and exact optima of tiny jobs
(:mod:`~perseus.solver.check.milp`).
"""

__all__: list[str] = []
