"""Where a running session's plan comes from: a plan file, an offline profile, or a sweep.

A session gets its frontier in one of three ways, all collective over the pipeline's process
group (every rank calls the same function at the same point):

* a plan/frontier passed in (object or JSON path), checked against the schedule the engine
  runs and, when given, the profile it was computed for;
* a profile: pipeline rank 0 traces the frontier and broadcasts it
  (:func:`plan_from_profile`);
* an online sweep (:mod:`perseus.runtime.profiling.sweep`): the ranks agree when every rank's
  sweep is done (:func:`sweep_finished_everywhere`), gather the rows and plan as above.

Collectives go through :mod:`perseus.runtime.collectives`, so NCCL-only groups work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perseus.dag.graph import build_dag
from perseus.errors import ConfigError, PlanError
from perseus.io.frontier_files import read_frontier
from perseus.job import PlanningJob, make_job
from perseus.plan import Frontier, JobSpec
from perseus.profile.model import Profile, build_profile
from perseus.runtime.collectives import all_gather_objects, all_reduce_max, broadcast_object
from perseus.runtime.profiling.pair_sweep import PairProfileRow, PairSweep
from perseus.runtime.profiling.sweep import OnlineProfiler, ProfileRow
from perseus.schedule.actions import Schedule
from perseus.schedule.builders import SCHEDULE_NAMES, build_schedule

__all__ = [
    "check_frontier",
    "gather_profile",
    "job_for_schedule",
    "load_frontier",
    "plan_from_profile",
    "sweep_finished_everywhere",
]


def job_for_schedule(
    schedule: Schedule,
    profile: Profile,
    blocking_power_w: float,
    profile_name: str | None = None,
    job_options: dict[str, Any] | None = None,
) -> PlanningJob:
    """The planning job of a schedule read from an engine.

    ``job_options`` are passed to :func:`perseus.job.make_job` (``layers_per_stage`` for
    two-clock plans, ``switch_latency_s``...); they need a schedule perseus can build.

    When the schedule equals one of perseus's builders (GPipe, 1F1B, interleaved, ZB-H1 with
    the same sizes) the job is :func:`perseus.job.make_job`'s, so plans computed with
    ``perseus frontier`` fit it; otherwise the job is named after the engine's schedule.
    """
    v = schedule.virtual_stages
    for name in SCHEDULE_NAMES:
        try:
            ours = build_schedule(
                name, schedule.num_stages, schedule.num_microbatches, virtual_stages=v
            )
        except ConfigError:
            continue
        if (
            ours.rank_actions == schedule.rank_actions
            and ours.stage_to_rank == schedule.stage_to_rank
        ):
            return make_job(
                profile,
                name,
                schedule.num_stages,
                schedule.num_microbatches,
                blocking_power_w=blocking_power_w,
                virtual_stages=v,
                profile_name=profile_name,
                **(job_options or {}),
            )
    if job_options:
        raise ConfigError(
            f"job options {sorted(job_options)} need a schedule perseus builds (GPipe, 1F1B, "
            f"interleaved, ZB-H1); {schedule.name} is not one: drop them"
        )
    if schedule.has_weight_actions and not profile.has_weight:
        profile = profile.split_backward(0.5)
    spec = JobSpec(
        schedule=schedule.name,
        ranks=schedule.num_ranks,
        stages=schedule.num_stages,
        microbatches=schedule.num_microbatches,
        virtual_stages=v,
        blocking_power_w=blocking_power_w,
        profile_sha256=profile.sha256,
        profile_name=profile_name,
    )
    return PlanningJob(spec, schedule, profile, build_dag(schedule))


def load_frontier(plan: Frontier | str | Path) -> Frontier:
    """``plan`` itself, or the frontier read from its JSON path."""
    return plan if isinstance(plan, Frontier) else read_frontier(plan)


def check_frontier(schedule: Schedule, frontier: Frontier, point_index: int) -> None:
    """Raise :class:`PlanError` unless ``frontier`` was computed for ``schedule``.

    Raises:
        PlanError: other stage ops, or ``point_index`` out of range.
    """
    if frontier.stage_ops != schedule.stage_ops():
        raise PlanError(
            "plan's stage_ops differ from the schedule the engine runs; compute the plan for "
            f"{schedule.name} with {schedule.num_stages} stages and "
            f"{schedule.num_microbatches} microbatches"
        )
    if not 0 <= point_index < len(frontier.points):
        raise PlanError(f"point {point_index} is out of range ({len(frontier.points)} points)")


def plan_from_profile(
    schedule: Schedule,
    profile: Profile,
    blocking_power_w: float,
    rank: int,
    group: Any,
    job_options: dict[str, Any] | None = None,
) -> tuple[PlanningJob, Frontier]:
    """Trace the frontier on pipeline rank 0 and broadcast it (collective over ``group``)."""
    from perseus.solver import trace_frontier

    job = job_for_schedule(schedule, profile, blocking_power_w, job_options=job_options)
    payload = trace_frontier(job).model_dump_json() if rank == 0 else None
    payload = broadcast_object(payload, 0, group)
    return job, Frontier.model_validate_json(payload)


def sweep_finished_everywhere(profiler: OnlineProfiler | PairSweep, group: Any) -> bool:
    """True when every rank's sweep is done (one all-reduce over ``group``)."""
    (busy,) = all_reduce_max([0.0 if profiler.done else 1.0], group)
    return busy == 0.0


def gather_profile(rows: list[ProfileRow] | list[PairProfileRow], group: Any) -> Profile:
    """Every rank's measured rows as one profile (collective over ``group``)."""
    parts = all_gather_objects(rows, group)
    return build_profile([r for part in parts for r in part], source="online profile")
