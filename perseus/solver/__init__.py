"""The frontier solver: min-cut frontier tracing (:mod:`perseus.solver.frontier`), slack
reclaiming, baselines, LP bounds; and planning on a frontier: power figures and budgets
(:mod:`~perseus.solver.power`, :mod:`~perseus.solver.power_peak`), over a price or carbon
signal (:mod:`~perseus.solver.power_schedule`) and for many jobs under one budget
(:mod:`~perseus.solver.fleet`).

Pure: numpy, numba, scipy and the standard library only.
"""

from __future__ import annotations

from perseus.solver.baselines import baseline_plans, global_clock_plans
from perseus.solver.frontier import FrontierTrace, trace, trace_frontier

__all__ = [
    "FrontierTrace",
    "baseline_plans",
    "global_clock_plans",
    "trace",
    "trace_frontier",
]
