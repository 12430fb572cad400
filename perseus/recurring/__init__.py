"""Recurring jobs (Zeus, NSDI'23): the batch size and GPU power limit across re-runs.

Importing this package loads only the pure parts (cost, workload, bandit, policy, replay);
the store, the profiler, the trace reader and the training-loop job are imported on first
access.
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
