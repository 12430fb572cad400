"""perseus: remove wasted GPU energy from pipeline-parallel training without slowing it down.

The public API, one import away::

    from perseus import load_profile, make_job, trace_frontier          # plan
    from perseus import PerseusPipeline, RankSession, SimulatedGPU      # run (torch, a GPU)
    from perseus import PlanFile, OfflineProfile, OnlineProfile         # where a plan comes from

Every name below is loaded on first use (module ``__getattr__``), so ``import perseus`` costs
a few milliseconds and never imports numpy, torch, pynvml or matplotlib; the module that
defines a name is imported when the name is first touched. Everything else lives one level
down: :mod:`perseus.schedule`, :mod:`perseus.profile`, :mod:`perseus.dag` (the operation graph
and its exact evaluator), :mod:`perseus.solver` (the pure planning core), :mod:`perseus.io`
(files), :mod:`perseus.device` (GPUs), :mod:`perseus.runtime` (sessions and engine adapters),
:mod:`perseus.recurring` (batch size and power limit across re-runs), :mod:`perseus.errors`
(every error class).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perseus.errors import (
    ConfigError,
    DeviceError,
    InfeasibleError,
    PerseusError,
    PlanError,
    ProfileError,
    ScheduleError,
)

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from perseus.device.nvml import NvmlGPU
    from perseus.device.presets import blocking_power_for
    from perseus.device.simulated import SimulatedGPU
    from perseus.io import load_profile, read_frontier, write_frontier
    from perseus.job import PlanningJob, make_job
    from perseus.plan import Frontier, PlanPoint
    from perseus.profile import Profile
    from perseus.runtime.metrics import IterationMetrics, MetricsSink
    from perseus.runtime.pipeline import PerseusPipeline, perseus_pipeline
    from perseus.runtime.planning import OfflineProfile, OnlineProfile, PlanFile
    from perseus.runtime.session import IterationStats, RankSession, SessionOptions
    from perseus.schedule import Action
    from perseus.solver import baseline_plans, trace_frontier

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first access).
_LAZY: dict[str, str] = {
    # data model
    "Action": "perseus.schedule",
    "Frontier": "perseus.plan",
    "PlanPoint": "perseus.plan",
    "PlanningJob": "perseus.job",
    "Profile": "perseus.profile",
    # planning
    "baseline_plans": "perseus.solver",
    "make_job": "perseus.job",
    "trace_frontier": "perseus.solver",
    # files
    "load_profile": "perseus.io",
    "read_frontier": "perseus.io",
    "write_frontier": "perseus.io",
    # devices
    "NvmlGPU": "perseus.device.nvml",
    "SimulatedGPU": "perseus.device.simulated",
    "blocking_power_for": "perseus.device.presets",
    # where a running job's plan comes from
    "OfflineProfile": "perseus.runtime.planning",
    "OnlineProfile": "perseus.runtime.planning",
    "PlanFile": "perseus.runtime.planning",
    # sessions (torch is imported when a session starts, not here)
    "IterationMetrics": "perseus.runtime.metrics",
    "IterationStats": "perseus.runtime.session",
    "MetricsSink": "perseus.runtime.metrics",
    "PerseusPipeline": "perseus.runtime.pipeline",
    "RankSession": "perseus.runtime.session",
    "SessionOptions": "perseus.runtime.session",
    "perseus_pipeline": "perseus.runtime.pipeline",
}

__all__ = [
    "Action",
    "ConfigError",
    "DeviceError",
    "Frontier",
    "InfeasibleError",
    "IterationMetrics",
    "IterationStats",
    "MetricsSink",
    "NvmlGPU",
    "OfflineProfile",
    "OnlineProfile",
    "PerseusError",
    "PerseusPipeline",
    "PlanError",
    "PlanFile",
    "PlanPoint",
    "PlanningJob",
    "Profile",
    "ProfileError",
    "RankSession",
    "ScheduleError",
    "SessionOptions",
    "SimulatedGPU",
    "__version__",
    "baseline_plans",
    "blocking_power_for",
    "load_profile",
    "make_job",
    "perseus_pipeline",
    "read_frontier",
    "trace_frontier",
    "write_frontier",
]


def _lazy_names(
    module_name: str, lazy: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: each name of ``lazy`` (name -> defining
    module) is imported on first access, then cached in the package's namespace."""
    namespace = sys.modules[module_name].__dict__

    def getattr_(name: str) -> Any:
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module), name)
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(lazy))

    return getattr_, dir_


__getattr__, __dir__ = _lazy_names(__name__, _LAZY)
