"""perseus: remove wasted GPU energy from pipeline-parallel training without slowing it down.

The planning core (schedules, profiles, DAG, evaluator, plans) is importable without torch,
pynvml or matplotlib.
"""

from perseus.dag import Evaluation, OpGraph, build_dag, evaluate_durations, evaluate_freqs
from perseus.errors import (
    ConfigError,
    DeviceError,
    InfeasibleError,
    PerseusError,
    PlanError,
    ProfileError,
    ScheduleError,
)
from perseus.job import PlanningJob, make_job
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.profile import OpOption, OpProfile, Profile, build_profile
from perseus.schedule import Action, Kind, Schedule, build_schedule

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Baseline",
    "ConfigError",
    "DeviceError",
    "Evaluation",
    "Frontier",
    "InfeasibleError",
    "JobSpec",
    "Kind",
    "OpGraph",
    "OpOption",
    "OpProfile",
    "PerseusError",
    "PlanError",
    "PlanPoint",
    "PlanningJob",
    "Profile",
    "ProfileError",
    "Schedule",
    "ScheduleError",
    "__version__",
    "build_dag",
    "build_profile",
    "build_schedule",
    "evaluate_durations",
    "evaluate_freqs",
    "make_job",
]
