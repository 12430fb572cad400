"""Where a running session's plan comes from: a plan file, an offline profile, or a sweep.

Each way is a :class:`PlanSource` that :class:`~perseus.runtime.session.RankSession` asks once,
at start, collectively over the pipeline's group; an online sweep answers None and is planned
from the gathered rows later. Every source checks the GPU it describes (:func:`check_gpu`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from perseus.dag.graph import build_dag
from perseus.device.private_dir import check_private_file
from perseus.errors import ConfigError, PlanError
from perseus.identity import GpuIdentity
from perseus.io.frontier_files import read_frontier
from perseus.io.profile_files import read_profile, write_profile_csv
from perseus.job import DEFAULT_BACKWARD_SPLIT, PlanningJob, make_job
from perseus.log import get_logger
from perseus.plan import Frontier, JobSpec
from perseus.profile.model import Profile, build_profile
from perseus.runtime.collectives import all_gather_objects, broadcast_object
from perseus.runtime.profiling.energy_attribution import DEFAULT_RIDGE
from perseus.runtime.profiling.pair_sweep import PairProfileRow
from perseus.runtime.profiling.sweep import ProfileRow
from perseus.schedule.actions import Schedule
from perseus.schedule.builders import SCHEDULE_NAMES, build_schedule

__all__ = [
    "OfflineProfile",
    "OnlineProfile",
    "OtherGpuWarning",
    "PlanContext",
    "PlanFile",
    "PlanLike",
    "PlanSource",
    "Planned",
    "check_frontier",
    "check_gpu",
    "job_for_schedule",
    "job_spec",
    "plan_from_profile",
    "plan_source",
]


logger = get_logger(__name__)


class OtherGpuWarning(UserWarning):
    """A plan or profile of another GPU runs here as an estimate (``allow_other_gpu=True``)."""


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What a plan source needs to know about the running job (``gpu``: the GPU it runs on,
    None when unknown)."""

    schedule: Schedule
    rank: int
    group: Any
    blocking_power_w: float
    gpu: GpuIdentity | None = None


def check_gpu(
    described: GpuIdentity | None,
    running: GpuIdentity | None,
    what: str,
    source: str,
    allow_other_gpu: bool = False,
) -> None:
    """Check that ``what`` (``"profile a100.csv"``), of GPU ``described`` (None: an older file,
    unchecked), describes ``running`` (None: unknown); ``source``: the plan source's name.

    Raises:
        PlanError: another GPU without the opt-in.
    """
    if running is None:
        return
    if described is None:
        logger.warning("%s has no GPU record: unchecked against %s", what, running.name)
        return
    if described.same_gpu(running):
        return
    line = (
        f"{what} describes {described.describe()}, but this session runs on "
        f"{running.describe()}: its times and energies do not hold here"
    )
    if allow_other_gpu:
        warnings.warn(
            f"{line}; running it as an estimate (allow_other_gpu=True)",
            OtherGpuWarning,
            stacklevel=3,
        )
        return
    raise PlanError(
        f"{line}; profile this GPU (plan=OnlineProfile(), or OnlineProfile(cache=...)), or run "
        f"it as an estimate with {source}(..., allow_other_gpu=True)"
    )


@dataclass(frozen=True, slots=True)
class Planned:
    """A plan source's answer: the frontier to deploy, its job (None for a bare plan file),
    and the profile measured on this machine (online or cached), if any."""

    frontier: Frontier
    job: PlanningJob | None
    profiled: Profile | None = None


class PlanSource(Protocol):
    """Where the plan comes from. ``plan`` is collective over ``ctx.group``."""

    def plan(self, ctx: PlanContext) -> Planned | None:
        """The plan to deploy, or None when it must be measured first (online sweep)."""


@dataclass(frozen=True, slots=True)
class PlanFile:
    """A plan/frontier computed elsewhere (``perseus frontier``), as an object or a JSON path.

    Args:
        frontier: The frontier or its JSON path.
        profile: The profile it was computed for: checked against the plan, and used for
            :meth:`~perseus.runtime.session.RankSession.allmax_plan`.
        allow_other_gpu: Run a plan made for another GPU as an estimate (one warning).
    """

    frontier: Frontier | str | Path
    profile: Profile | None = None
    allow_other_gpu: bool = False

    def plan(self, ctx: PlanContext) -> Planned:
        """Read and check the plan (no collective)."""
        plan = self.frontier
        frontier = plan if isinstance(plan, Frontier) else read_frontier(plan)
        source = "plan (object)" if frontier is plan else str(plan)[:200]
        described = frontier.job.gpu or (self.profile.gpu if self.profile else None)
        what = source if frontier is plan else f"plan {source}"
        check_gpu(described, ctx.gpu, what, "PlanFile", self.allow_other_gpu)
        job = None
        if self.profile is not None:
            job = job_for_schedule(ctx.schedule, self.profile, ctx.blocking_power_w)
            job.check_frontier(frontier, source=source)
        return Planned(frontier, job)


@dataclass(frozen=True, slots=True)
class OfflineProfile:
    """Plan from a measured profile: pipeline rank 0 traces the frontier and broadcasts it.

    Args:
        profile: Time and energy per (stage, kind, clock).
        layers_per_stage: Plans may switch the clock once inside an op (two-clock ops); needs
            a schedule perseus builds.
        switch_latency_s: With ``layers_per_stage``: the cost of a mid-op clock switch
            (default: :func:`perseus.job.make_job`'s).
        allow_other_gpu: Run a profile of another GPU as an estimate (one warning).

    Raises:
        ConfigError: a ``layers_per_stage`` below 1.
    """

    profile: Profile
    layers_per_stage: int | tuple[int, ...] | None = None
    switch_latency_s: float | None = None
    allow_other_gpu: bool = False

    def __post_init__(self) -> None:
        layers = self.layers_per_stage
        values = (layers,) if isinstance(layers, int) else (layers or ())
        if any(v < 1 for v in values):
            raise ConfigError(f"OfflineProfile: layers_per_stage must be >= 1, got {layers}")

    def plan(self, ctx: PlanContext) -> Planned:
        """Trace (rank 0) and broadcast the frontier (collective)."""
        what = f"profile {self.profile.source}"
        check_gpu(self.profile.gpu, ctx.gpu, what, "OfflineProfile", self.allow_other_gpu)
        options: dict[str, Any] = {}
        if self.layers_per_stage is not None:
            options["layers_per_stage"] = self.layers_per_stage
            if self.switch_latency_s is not None:
                options["switch_latency_s"] = self.switch_latency_s
        job, frontier = plan_from_profile(
            ctx.schedule, self.profile, ctx.blocking_power_w, ctx.rank, ctx.group, options
        )
        return Planned(frontier, job)


@dataclass(frozen=True, slots=True)
class OnlineProfile:
    """Measure the profile during the first iterations, then plan from it.

    Args:
        cache: CSV path where pipeline rank 0 saves the measured profile; if it exists (and
            was not measured on another GPU), the sweep is skipped and the saved profile used.
        patience: Clocks swept below the best energy before a (stage, kind) stops (see
            :class:`~perseus.runtime.profiling.sweep.ClockSweep`).
        min_windows: Energy-counter windows each sweep step must span.
        sample_period_s: Time between counter reads (None:
            :func:`~perseus.runtime.profiling.energy_windows.sample_period_for`).
        max_step_iterations: Iterations after which a sweep step ends anyway.
        ridge: Ridge weight of the per-step power fit.

    Raises:
        ConfigError: a value out of range.
    """

    cache: Path | None = None
    patience: int = 5
    min_windows: int = 20
    sample_period_s: float | None = None
    max_step_iterations: int = 200
    ridge: float = DEFAULT_RIDGE

    def __post_init__(self) -> None:
        if self.cache is not None and not isinstance(self.cache, Path):
            object.__setattr__(self, "cache", Path(self.cache))
        for name in ("patience", "min_windows", "max_step_iterations"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"OnlineProfile: {name} must be an integer >= 1, got {value!r}")
        if self.sample_period_s is not None and not self.sample_period_s > 0:
            raise ConfigError(
                f"OnlineProfile: sample_period_s must be > 0 (or None), got {self.sample_period_s}"
            )
        if not self.ridge >= 0:
            raise ConfigError(f"OnlineProfile: ridge must be >= 0, got {self.ridge}")

    def plan(self, ctx: PlanContext) -> Planned | None:
        """The cached profile's plan (collective), or None: sweep first."""
        if self.cache is None or not check_private_file(
            self.cache, what="profile cache", create_dir=False
        ):
            return None
        profile = read_profile(self.cache)
        if profile.gpu is not None and ctx.gpu is not None and not profile.gpu.same_gpu(ctx.gpu):
            logger.warning(
                "profile cache %s was measured on %s, this session runs on %s: measuring again",
                self.cache,
                profile.gpu.name,
                ctx.gpu.name,
            )
            return None
        return replace(OfflineProfile(profile).plan(ctx), profiled=profile)

    def plan_measured(
        self, ctx: PlanContext, rows: list[ProfileRow] | list[PairProfileRow]
    ) -> Planned:
        """Gather every rank's rows, save them to ``cache`` (rank 0) and plan (collective)."""
        merged = [r for part in all_gather_objects(rows, ctx.group) for r in part]
        profile = build_profile(merged, source="online profile").with_gpu(ctx.gpu)
        if self.cache is not None and ctx.rank == 0:
            check_private_file(self.cache, what="profile cache")  # a directory of ours
            write_profile_csv(profile, self.cache)
        return replace(OfflineProfile(profile).plan(ctx), profiled=profile)


#: What a session's ``plan=`` takes: a plan source, or a frontier, plan JSON path or profile.
PlanLike = PlanSource | Frontier | Profile | str | Path


def plan_source(plan: PlanLike) -> PlanSource:
    """The plan source a session's ``plan=`` names.

    Raises:
        ConfigError: if ``plan`` is none of :data:`PlanLike`.
    """
    if isinstance(plan, Profile):
        return OfflineProfile(plan)
    if isinstance(plan, (Frontier, str, Path)):
        return PlanFile(plan)
    if not callable(getattr(plan, "plan", None)):
        raise ConfigError(
            f"plan= takes a plan source (PlanFile, OfflineProfile, OnlineProfile), a frontier "
            f"or its JSON path, or a profile; got {type(plan).__name__}"
        )
    return plan


def job_for_schedule(
    schedule: Schedule,
    profile: Profile,
    blocking_power_w: float,
    job_options: dict[str, Any] | None = None,
) -> PlanningJob:
    """The planning job of a schedule read from an engine: :func:`perseus.job.make_job`'s for a
    schedule perseus builds (so ``perseus frontier`` plans fit it), else one of ``schedule``.

    Raises:
        ConfigError: ``job_options`` for a schedule perseus does not build.
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
                **(job_options or {}),
            )
    if job_options:
        raise ConfigError(
            f"job options {sorted(job_options)} need a schedule perseus builds (GPipe, 1F1B, "
            f"interleaved, ZB-H1); {schedule.name} is not one: drop them"
        )
    if schedule.has_weight_actions and not profile.has_weight:
        profile = profile.split_backward(DEFAULT_BACKWARD_SPLIT)
    spec = job_spec(schedule, blocking_power_w, profile.sha256, gpu=profile.gpu)
    return PlanningJob(spec, schedule, profile, build_dag(schedule))


def job_spec(
    schedule: Schedule, blocking_power_w: float, profile_sha256: str, **fields: Any
) -> JobSpec:
    """The :class:`~perseus.plan.JobSpec` of an engine's ``schedule`` (``fields``: the rest)."""
    return JobSpec(
        schedule=schedule.name,
        ranks=schedule.num_ranks,
        stages=schedule.num_stages,
        microbatches=schedule.num_microbatches,
        virtual_stages=schedule.virtual_stages,
        blocking_power_w=blocking_power_w,
        profile_sha256=profile_sha256,
        **fields,
    )


def check_frontier(
    schedule: Schedule, frontier: Frontier, point_index: int, *, ops_checked: bool = False
) -> None:
    """Check that ``frontier`` was computed for ``schedule`` (``ops_checked``: its stage ops
    were found to be the schedule's before; only the point is checked).

    Raises:
        PlanError: other stage ops, or ``point_index`` out of range.
    """
    if not ops_checked and frontier.rank_actions != schedule.rank_actions:
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
    """Trace the frontier on pipeline rank 0 and broadcast it (collective over ``group``), the
    profile's options above a cap-bound clock collapsed into it first."""
    from perseus.solver import trace_frontier

    profile = profile.collapse_cap_bound()
    job = job_for_schedule(schedule, profile, blocking_power_w, job_options=job_options)
    payload = trace_frontier(job).model_dump_json() if rank == 0 else None
    payload = broadcast_object(payload, 0, group)
    return job, Frontier.model_validate_json(payload)
