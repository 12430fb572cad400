"""A planning job: schedule + profile + DAG + blocking power, with plan <-> array conversions.

The one place a :class:`~perseus.plan.JobSpec` meets the objects it describes, so every caller
evaluates plans the same way.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perseus.dag.evaluate import Evaluation, PlanArg, allmax_freqs, evaluate_freqs, op_costs
from perseus.dag.graph import FloatArray, IntArray, OpGraph, build_dag
from perseus.errors import ConfigError, PlanError
from perseus.plan import MAX_ENERGY_J, Baseline, Frontier, JobSpec, PlanOp, PlanPoint
from perseus.profile.model import Profile
from perseus.profile.two_clock import LayerSplit, build_layer_split, op_phases, phases_op
from perseus.schedule.actions import Schedule
from perseus.schedule.builders import build_schedule
from perseus.validate import JOB_BOUNDS, JOB_DEFAULTS, Bounds, check_job_size, show_value

__all__ = ["DEFAULT_BACKWARD_SPLIT", "PlanningJob", "check_number", "make_job"]

#: Share of a backward given to ``B`` when a profile without ``weight`` rows meets a ZB schedule.
DEFAULT_BACKWARD_SPLIT = JOB_DEFAULTS.backward_split


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

    @cached_property
    def layer_split(self) -> LayerSplit | None:
        """How two-clock ops are priced; ``None`` without ``layers_per_stage``."""
        spec = self.spec
        if spec.layers_per_stage is None:
            return None
        return build_layer_split(
            spec.layers_per_stage,
            spec.stages,
            spec.layer_time_fractions,
            spec.switch_latency_s,
            spec.switch_energy_j,
            spec.switch_stall_s,
        )

    def evaluate(self, freqs_mhz: PlanArg) -> Evaluation:
        """Exact evaluation of a plan in any form :func:`perseus.dag.evaluate.op_costs` takes."""
        return evaluate_freqs(
            self.graph,
            self.profile,
            freqs_mhz,
            blocking_power_w=self.spec.blocking_power_w,
            split=self.layer_split,
        )

    def op_costs(self, freqs_mhz: PlanArg) -> tuple[FloatArray, FloatArray]:
        """Per-node (time_s, energy_j) of a plan, two-clock ops priced with this job's layers."""
        return op_costs(self.graph, self.profile, freqs_mhz, self.layer_split)

    def allmax(self) -> IntArray:
        """The all-max plan as per-node clocks."""
        return allmax_freqs(self.graph, self.profile)

    def nested(self, freqs_mhz: PlanArg) -> tuple[tuple[PlanOp, ...], ...]:
        """A plan in any evaluator form -> ``freqs_mhz[r][j]`` as in plan files (each op in its
        canonical form)."""
        flat: list[PlanOp]
        if not isinstance(freqs_mhz, np.ndarray) and not all(isinstance(f, int) for f in freqs_mhz):
            flat = [phases_op(op_phases(op)) for op in freqs_mhz]  # type: ignore[arg-type]
        elif (arr := np.asarray(freqs_mhz, dtype=np.int64)).ndim == 1:
            flat = [int(f) for f in arr.tolist()]
        else:  # two-clock rows: one clock where the row is one
            flat = arr[:, 0].tolist()
            for i in np.flatnonzero((arr[:, 2] != 0) & (arr[:, 0] != arr[:, 1])).tolist():
                flat[i] = tuple(arr[i].tolist())
        starts = self.graph.rank_start.tolist()
        return tuple(tuple(flat[starts[r] : starts[r + 1]]) for r in range(len(starts) - 1))

    def flat(self, point: PlanPoint) -> IntArray | list[PlanOp]:
        """A plan point -> per-node clocks (N,), (N, 3) two-clock rows when it has a two-clock
        op, or the list of plan ops when it has a phased op."""
        flat = [f for rank in point.freqs_mhz for f in rank]
        if len(flat) != self.graph.num_nodes:
            raise PlanError(f"plan has {len(flat)} clocks, job has {self.graph.num_nodes} ops")
        if all(isinstance(f, int) for f in flat):
            return np.array(flat, dtype=np.int64)
        if any(not isinstance(f, int) and not isinstance(f[0], int) for f in flat):
            return flat
        return np.array(
            [(f, f, 0) if isinstance(f, int) else tuple(f) for f in flat], dtype=np.int64
        )

    def point(self, freqs_mhz: PlanArg) -> PlanPoint:
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

    def check_frontier(self, frontier: Frontier, source: str | None = None) -> None:
        """Raise :class:`PlanError`, naming ``source``, unless ``frontier`` belongs to this job."""
        frontier.check_job(self.spec, source=source)
        if frontier.stage_ops != self.schedule.stage_ops():
            raise PlanError(
                f"{source or 'plan'}: stage_ops differ from this job's schedule; recompute it"
            )


def check_number(
    name: str, value: object, bounds: Bounds | None = None, *, integer: bool = False
) -> None:
    """Raise :class:`ConfigError` naming `` `name` `` unless ``value`` is a number (an int
    when ``integer``; never a bool or str) in ``bounds`` (default: ``JOB_BOUNDS[name]``)."""
    gt, ge, lt, le = JOB_BOUNDS[name] if bounds is None else bounds
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, kind) and not isinstance(value, bool):
        v: float = value  # type: ignore[assignment]
        low_ok = v > gt if gt is not None else ge is None or v >= ge
        high_ok = v < lt if lt is not None else le is None or v <= le
        if low_ok and high_ok:  # NaN fails both
            return
    low = f"({gt:g}" if gt is not None else "(-inf" if ge is None else f"[{ge:g}"
    high = f"{lt:g})" if lt is not None else "inf)" if le is None else f"{le:g}]"
    raise ConfigError(
        f"`{name}` must be {'an integer' if integer else 'a number'} in {low}, {high}, "
        f"got {show_value(value)}; pass a value in that range"
    )


def _check_args(profile: object, profile_name: object, args: dict[str, object]) -> None:
    """:func:`make_job`'s arguments, each of the right type and in its range."""
    if not isinstance(profile, Profile):
        raise ConfigError(f"`profile` must be a Profile (load_profile), got {show_value(profile)}")
    if not (profile_name is None or isinstance(profile_name, str)):
        raise ConfigError(
            f"`profile_name` must be a string or None, got {show_value(profile_name)}"
        )
    for name, value in args.items():
        if name in JOB_BOUNDS and name not in ("layers_per_stage", "layer_time_fractions"):
            # a file may record a switch energy past a config's range (as JobSpec allows)
            bounds = Bounds(ge=0, le=MAX_ENERGY_J) if name == "switch_energy_j" else None
            check_number(
                name, value, bounds, integer=name in ("stages", "microbatches", "virtual_stages")
            )
    given = args["layers_per_stage"]
    if given is not None:
        many = isinstance(given, Sequence) and not isinstance(given, str)
        for n in given if many and isinstance(given, Sequence) else [given]:
            check_number("layers_per_stage", n, integer=True)


def make_job(
    profile: Profile,
    schedule: str,
    stages: int,
    microbatches: int,
    *,
    blocking_power_w: float,
    virtual_stages: int = JOB_DEFAULTS.virtual_stages,
    p2p_latency_s: float = JOB_DEFAULTS.p2p_latency_s,
    backward_split: float = DEFAULT_BACKWARD_SPLIT,
    profile_name: str | None = None,
    layers_per_stage: Sequence[int] | int | None = None,
    layer_time_fractions: Sequence[Sequence[float]] | None = None,
    switch_latency_s: float = JOB_DEFAULTS.switch_latency_s,
    switch_energy_j: float = JOB_DEFAULTS.switch_energy_j,
    switch_stall_s: float = JOB_DEFAULTS.switch_stall_s,
) -> PlanningJob:
    """Build the schedule and DAG for ``profile`` and describe the job::

        job = make_job(load_profile("a100"), "1f1b", 8, 24, blocking_power_w=83.64)

    ``blocking_power_w`` is the GPU's power while blocked on communication
    (:func:`perseus.device.presets.blocking_power_for`; ``perseus doctor`` measures it). A
    zero-bubble schedule on a profile without ``weight`` rows splits each backward by
    ``backward_split``. ``layers_per_stage`` (one number or one per stage) allows two-clock ops,
    priced with ``layer_time_fractions`` and the ``switch_*`` costs
    (:mod:`perseus.profile.two_clock`).

    Raises:
        ConfigError: if the profile's stage count differs from ``stages``, a number is of the
            wrong type or out of its range (:data:`perseus.validate.JOB_BOUNDS`), the job is
            too large to plan, or the schedule name, sizes or two-clock settings are bad.
    """
    _check_args(profile, profile_name, locals())
    if profile.num_stages != stages:
        raise ConfigError(
            f"{profile.source}: profile has {profile.num_stages} stages but `stages` is {stages}; "
            f"use `stages`={profile.num_stages} or a profile with {stages} stages"
        )
    check_job_size("make_job", schedule, stages, microbatches, virtual_stages)
    layers = None
    if layers_per_stage is not None:  # checked with the fractions and switch costs
        given = [layers_per_stage] if isinstance(layers_per_stage, int) else layers_per_stage
        switch = (switch_latency_s, switch_energy_j, switch_stall_s)
        split = build_layer_split(list(given), stages, layer_time_fractions, *switch)
        layers = tuple(len(f) for f in split.layer_fractions)
    elif layer_time_fractions is not None:
        raise ConfigError("layer_time_fractions needs layers_per_stage; give both")
    sched = build_schedule(schedule, stages, microbatches, virtual_stages=virtual_stages)
    b_split: float | None = None
    if sched.has_weight_actions and not profile.has_weight:
        profile = profile.split_backward(backward_split)
        b_split = backward_split
    spec = JobSpec(
        schedule=schedule,
        ranks=sched.num_ranks,
        stages=stages,
        microbatches=microbatches,
        virtual_stages=virtual_stages,
        blocking_power_w=blocking_power_w,
        profile_sha256=profile.sha256,
        p2p_latency_s=p2p_latency_s,
        backward_split=b_split,
        profile_name=profile_name,
        layers_per_stage=layers,
        layer_time_fractions=None
        if layer_time_fractions is None
        else tuple(tuple(float(w) for w in ws) for ws in layer_time_fractions),
        switch_latency_s=switch_latency_s,
        switch_energy_j=switch_energy_j,
        switch_stall_s=switch_stall_s,
        gpu=profile.gpu,
    )
    return PlanningJob(spec, sched, profile, build_dag(sched, p2p_latency_s=p2p_latency_s))
