"""Recurring jobs (Zeus, NSDI'23): the batch size and GPU power limit across re-runs.

Pure parts: :mod:`~perseus.recurring.cost` (the η-weighted cost), :mod:`~.workload` (a job's
trace), :mod:`~.bandit` (Gaussian Thompson sampling), :mod:`~.policy` (the batch-size
optimizer), :mod:`~.simulator` (trace-driven evaluation) and :mod:`~.results`. I/O:
:mod:`~.trace` (CSV files), :mod:`~.store` (SQLite), :mod:`~.profiler` and :mod:`~.job`
(the training-loop side, on a GPU), :mod:`~.report` (matplotlib, imported only on demand).
"""

from perseus.recurring.bandit import GaussianPrior
from perseus.recurring.cost import PowerLimitMeasurement, best_power_limit_w, zeus_cost
from perseus.recurring.job import RecurringJob, RecurringRun
from perseus.recurring.policy import BatchSizeOptimizer, Decision, Observation
from perseus.recurring.profiler import PowerLimitProfiler
from perseus.recurring.simulator import simulate_workload
from perseus.recurring.store import RecurringStore, SQLiteStore
from perseus.recurring.trace import load_workloads
from perseus.recurring.workload import ZEUS_JOBS, JobSpec, Workload

__all__ = [
    "ZEUS_JOBS",
    "BatchSizeOptimizer",
    "Decision",
    "GaussianPrior",
    "JobSpec",
    "Observation",
    "PowerLimitMeasurement",
    "PowerLimitProfiler",
    "RecurringJob",
    "RecurringRun",
    "RecurringStore",
    "SQLiteStore",
    "Workload",
    "best_power_limit_w",
    "load_workloads",
    "simulate_workload",
    "zeus_cost",
]
