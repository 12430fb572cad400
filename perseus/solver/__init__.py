"""The frontier solver: min-cut frontier tracing, slack reclaiming, baselines, LP floor.

Pure: numpy, numba, scipy and the standard library only (:mod:`perseus.solver.frontier`).
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
