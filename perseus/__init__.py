"""perseus: remove wasted GPU energy from pipeline-parallel training without slowing it down.

The public API, one import away::

    from perseus import load_profile, make_job, trace_frontier          # plan
    from perseus import PerseusPipeline, RankSession, SimulatedGPU      # run (torch, a GPU)
    from perseus import PlanFile, OfflineProfile, OnlineProfile         # where a plan comes from

Every name is loaded on first use (module ``__getattr__``), so ``import perseus`` never imports
numpy, torch, pynvml or matplotlib. Everything else lives one level down
(:mod:`perseus.schedule`, :mod:`perseus.profile`, :mod:`perseus.dag`, :mod:`perseus.solver`,
:mod:`perseus.io`, :mod:`perseus.device`, :mod:`perseus.runtime`, :mod:`perseus.recurring`,
:mod:`perseus.errors`).
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

#: Module -> the public names it defines (each imported on first access).
_MODULES = {
    "perseus.schedule": "Action",
    "perseus.plan": "Frontier PlanPoint",
    "perseus.job": "PlanningJob make_job",
    "perseus.profile": "Profile",
    "perseus.solver": "baseline_plans trace_frontier",
    "perseus.io": "load_profile read_frontier write_frontier",
    "perseus.device.nvml": "NvmlGPU",
    "perseus.device.simulated": "SimulatedGPU",
    "perseus.device.presets": "blocking_power_for",
    "perseus.runtime.planning": "OfflineProfile OnlineProfile PlanFile",
    "perseus.runtime.metrics": "IterationMetrics MetricsSink",
    "perseus.runtime.pipeline": "PerseusPipeline perseus_pipeline",
    "perseus.runtime.session": "IterationStats RankSession SessionOptions",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}

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
    """A package's ``__getattr__`` and ``__dir__``: each name of ``lazy`` (name -> module) is
    imported on first access, then cached in the package's namespace."""
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
