"""Test oracles for the solver (kept out of the package): the frontier walk in numpy on
scipy's max flow (:mod:`tests.solver.oracles.reference_walk`, passed to
:func:`perseus.solver.frontier.trace` as its ``method``) and that max flow
(:mod:`tests.solver.oracles.maxflow`), and exact optima of tiny jobs
(:mod:`tests.solver.oracles.milp`).
"""
