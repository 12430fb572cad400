"""perseus: remove wasted GPU energy from pipeline-parallel training without slowing it down.

The public API, one import away::

    from perseus import load_profile, make_job, trace_frontier          # plan
    from perseus import PerseusPipeline, RankSession, SimulatedGPU      # run (torch, a GPU)

Every name below is loaded on first use (module ``__getattr__``), so ``import perseus`` costs
a few milliseconds and never imports numpy, torch, pynvml or matplotlib; the module that
defines a name is imported when the name is first touched. Everything else lives one level
down: :mod:`perseus.schedule`, :mod:`perseus.profile`, :mod:`perseus.dag`,
:mod:`perseus.solver` (the pure planning core), :mod:`perseus.io` (files),
:mod:`perseus.device` (GPUs), :mod:`perseus.runtime` (sessions and engine adapters),
:mod:`perseus.recurring` (batch size and power limit across re-runs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from perseus.errors import (
    ConfigError,
    DeviceError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InfeasibleError,
    PerseusError,
    PlanError,
    ProfileError,
    ScheduleError,
)

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from perseus.dag import Evaluation, OpGraph, build_dag, evaluate_durations, evaluate_freqs
    from perseus.device.nvml import NvmlGPU
    from perseus.device.presets import blocking_power_for
    from perseus.device.simulated import SimulatedGPU
    from perseus.io import load_profile, read_frontier, read_profile, write_frontier
    from perseus.job import PlanningJob, make_job
    from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
    from perseus.profile import OpOption, OpProfile, Profile, build_profile
    from perseus.runtime.metrics import IterationMetrics, MetricsSink
    from perseus.runtime.pipeline import PerseusPipeline, perseus_pipeline
    from perseus.runtime.session import IterationStats, RankSession
    from perseus.schedule import Action, Kind, Schedule, build_schedule
    from perseus.solver import baseline_plans, trace_frontier

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first access).
_LAZY: dict[str, str] = {
    # data model
    "Action": "perseus.schedule",
    "Baseline": "perseus.plan",
    "Evaluation": "perseus.dag",
    "Frontier": "perseus.plan",
    "JobSpec": "perseus.plan",
    "Kind": "perseus.schedule",
    "OpGraph": "perseus.dag",
    "OpOption": "perseus.profile",
    "OpProfile": "perseus.profile",
    "PlanPoint": "perseus.plan",
    "PlanningJob": "perseus.job",
    "Profile": "perseus.profile",
    "Schedule": "perseus.schedule",
    # planning
    "baseline_plans": "perseus.solver",
    "build_dag": "perseus.dag",
    "build_profile": "perseus.profile",
    "build_schedule": "perseus.schedule",
    "evaluate_durations": "perseus.dag",
    "evaluate_freqs": "perseus.dag",
    "make_job": "perseus.job",
    "trace_frontier": "perseus.solver",
    # files
    "load_profile": "perseus.io",
    "read_frontier": "perseus.io",
    "read_profile": "perseus.io",
    "write_frontier": "perseus.io",
    # devices
    "NvmlGPU": "perseus.device.nvml",
    "SimulatedGPU": "perseus.device.simulated",
    "blocking_power_for": "perseus.device.presets",
    # sessions (torch is imported when a session starts, not here)
    "IterationMetrics": "perseus.runtime.metrics",
    "IterationStats": "perseus.runtime.session",
    "MetricsSink": "perseus.runtime.metrics",
    "PerseusPipeline": "perseus.runtime.pipeline",
    "RankSession": "perseus.runtime.session",
    "perseus_pipeline": "perseus.runtime.pipeline",
}

__all__ = [
    "Action",
    "Baseline",
    "ConfigError",
    "DeviceError",
    "DeviceNotSupportedError",
    "DevicePermissionError",
    "Evaluation",
    "Frontier",
    "InfeasibleError",
    "IterationMetrics",
    "IterationStats",
    "JobSpec",
    "Kind",
    "MetricsSink",
    "NvmlGPU",
    "OpGraph",
    "OpOption",
    "OpProfile",
    "PerseusError",
    "PerseusPipeline",
    "PlanError",
    "PlanPoint",
    "PlanningJob",
    "Profile",
    "ProfileError",
    "RankSession",
    "Schedule",
    "ScheduleError",
    "SimulatedGPU",
    "__version__",
    "baseline_plans",
    "blocking_power_for",
    "build_dag",
    "build_profile",
    "build_schedule",
    "evaluate_durations",
    "evaluate_freqs",
    "load_profile",
    "make_job",
    "perseus_pipeline",
    "read_frontier",
    "read_profile",
    "trace_frontier",
    "write_frontier",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perseus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
