"""Recurring jobs (Zeus, NSDI'23): the batch size and GPU power limit across re-runs.

Pure parts: :mod:`~perseus.recurring.cost` (the η-weighted cost), :mod:`~.workload` (a job's
trace), :mod:`~.bandit` (Gaussian Thompson sampling), :mod:`~.policy` (the batch-size
optimizer), :mod:`~.replay` (trace-driven evaluation and its summaries). I/O:
:mod:`~.trace` (CSV files), :mod:`~.store` (SQLite, with :mod:`~.schema` and the run leases
of :mod:`~.lease`), :mod:`~.profiler` and :mod:`~.job`
(the training-loop side, on a GPU), :mod:`~.report` (matplotlib, imported only on demand).

Importing this package loads only the pure parts; the I/O names below are imported on first
access, so ``import perseus.recurring.replay`` never loads sqlite3 or the device layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perseus import _lazy_names
from perseus.recurring.bandit import GaussianPrior
from perseus.recurring.cost import PowerLimitMeasurement, best_power_limit_w, zeus_cost
from perseus.recurring.policy import BatchSizeOptimizer, Decision, Observation
from perseus.recurring.replay import replay_workload
from perseus.recurring.workload import ZEUS_JOBS, JobSpec, Workload

if TYPE_CHECKING:
    from perseus.recurring.job import RecurringJob, RecurringRun
    from perseus.recurring.profiler import PowerLimitProfiler
    from perseus.recurring.store import RecurringStore, SQLiteStore
    from perseus.recurring.trace import load_workloads

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
    "replay_workload",
    "zeus_cost",
]

_LAZY = {
    "PowerLimitProfiler": "perseus.recurring.profiler",
    "RecurringJob": "perseus.recurring.job",
    "RecurringRun": "perseus.recurring.job",
    "RecurringStore": "perseus.recurring.store",
    "SQLiteStore": "perseus.recurring.store",
    "load_workloads": "perseus.recurring.trace",
}


__getattr__, __dir__ = _lazy_names(__name__, _LAZY)
