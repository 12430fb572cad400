"""A planning job: schedule + profile + DAG + blocking power, with plan <-> array conversions.

This is the one place where a :class:`~perseus.plan.JobSpec` meets the objects it describes,
so the solver, the CLI and the runtime all evaluate plans the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag.evaluate import Evaluation, allmax_freqs, evaluate_freqs
from perseus.dag.graph import OpGraph, build_dag
from perseus.errors import ConfigError, PlanError
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.profile.model import Profile
from perseus.schedule.actions import Schedule
from perseus.schedule.builders import build_schedule

__all__ = ["DEFAULT_BACKWARD_SPLIT", "PlanningJob", "make_job"]

#: Fraction of a profiled backward given to ``B`` when a zero-bubble schedule needs ``B``/``W``
#: and the profile has no ``weight`` rows (the ZB paper's T_B ≈ T_W).
DEFAULT_BACKWARD_SPLIT = 0.5

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class PlanningJob:
    """Everything needed to evaluate and emit plans for one job."""

    spec: JobSpec
    schedule: Schedule
    profile: Profile
    graph: OpGraph

    @property
    def blocking_power_w(self) -> float:
        return self.spec.blocking_power_w

    def evaluate(self, freqs_mhz: Sequence[int] | IntArray) -> Evaluation:
        """Exact evaluation of a plan given as per-node clocks (rank-major)."""
        return evaluate_freqs(self.graph, self.profile, freqs_mhz, self.spec.blocking_power_w)

    def allmax(self) -> IntArray:
        """The all-max plan as per-node clocks."""
        return allmax_freqs(self.graph, self.profile)

    def nested(self, freqs_mhz: Sequence[int] | IntArray) -> tuple[tuple[int, ...], ...]:
        """Per-node clocks -> ``freqs_mhz[r][j]`` as in plan files."""
        flat = [int(f) for f in freqs_mhz]
        starts = self.graph.rank_start.tolist()
        return tuple(tuple(flat[starts[r] : starts[r + 1]]) for r in range(len(starts) - 1))

    def flat(self, point: PlanPoint) -> IntArray:
        """``freqs_mhz[r][j]`` of a plan point -> per-node clocks."""
        flat = [f for rank in point.freqs_mhz for f in rank]
        if len(flat) != self.graph.num_nodes:
            raise PlanError(f"plan has {len(flat)} clocks, job has {self.graph.num_nodes} ops")
        return np.array(flat, dtype=np.int64)

    def point(self, freqs_mhz: Sequence[int] | IntArray) -> PlanPoint:
        """A plan point whose figures come from the exact evaluator."""
        ev = self.evaluate(freqs_mhz)
        return PlanPoint(time_s=ev.time_s, energy_j=ev.energy_j, freqs_mhz=self.nested(freqs_mhz))

    def frontier(self, points: Sequence[PlanPoint]) -> Frontier:
        """Wrap points (sorted here by time) with the job, stage_ops and all-max baseline."""
        base = self.evaluate(self.allmax())
        return Frontier(
            job=self.spec,
            stage_ops=self.schedule.stage_ops(),
            baseline=Baseline(time_s=base.time_s, energy_j=base.energy_j),
            points=tuple(sorted(points, key=lambda p: (p.time_s, p.energy_j))),
        )

    def check_frontier(self, frontier: Frontier, source: str = "plan") -> None:
        """Raise :class:`PlanError` unless ``frontier`` belongs to this job."""
        frontier.check_job(self.spec)
        if frontier.stage_ops != self.schedule.stage_ops():
            raise PlanError(f"{source}: stage_ops differ from this job's schedule; recompute it")


def make_job(
    profile: Profile,
    schedule: str,
    stages: int,
    microbatches: int,
    blocking_power_w: float,
    virtual_stages: int = 1,
    p2p_latency_s: float = 0.0,
    backward_split: float = DEFAULT_BACKWARD_SPLIT,
    profile_name: str | None = None,
) -> PlanningJob:
    """Build the schedule and DAG for ``profile`` and describe the job.

    A zero-bubble schedule on a profile without ``weight`` rows splits each backward into
    ``B``/``W`` by ``backward_split`` (recorded in the job spec).

    Raises:
        ConfigError: if the profile's stage count differs from ``stages``, or sizes are bad.
    """
    if profile.num_stages != stages:
        raise ConfigError(
            f"{profile.source}: profile has {profile.num_stages} stages but --stages is {stages}; "
            f"use --stages {profile.num_stages} or a profile with {stages} stages"
        )
    if blocking_power_w < 0:
        raise ConfigError(f"--blocking-power-w must be >= 0, got {blocking_power_w}")
    sched = build_schedule(schedule, stages, microbatches, virtual_stages)
    split: float | None = None
    if sched.has_weight_actions and not profile.has_weight:
        profile = profile.split_backward(backward_split)
        split = backward_split
    spec = JobSpec(
        schedule=schedule,
        ranks=sched.num_ranks,
        stages=stages,
        microbatches=microbatches,
        virtual_stages=virtual_stages,
        blocking_power_w=blocking_power_w,
        profile_sha256=profile.sha256,
        p2p_latency_s=p2p_latency_s,
        backward_split=split,
        profile_name=profile_name,
    )
    return PlanningJob(spec, sched, profile, build_dag(sched, p2p_latency_s))
