"""Frequency plans and frontiers as validated data (never code).

A frontier file holds the job it was computed for, every rank's ops in execution order
(``stage_ops``), the all-max baseline and its points, each a full frequency plan with its exact
time and energy; a plan file is a frontier of one point. A plan op is a clock, a two-clock op
``[freq_a_mhz, freq_b_mhz, layers_at_a]`` or a phase list (:mod:`perseus.profile.two_clock`).
Schema version 2 adds ``points_sha256`` (:func:`points_sha256`), version 3 point power
records, phase lists and ``switch_stall_s``; older files still read (docs/formats.md and
docs/memory-clocks.md give the details).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Protocol, TypeGuard

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from perseus.errors import InfeasibleError, PlanError, ScheduleError
from perseus.identity import GpuIdentity
from perseus.schedule.actions import Action, parse_op_name
from perseus.validate import JOB_BOUNDS, JOB_DEFAULTS, MAX_LAYER_WEIGHT, whole_number

__all__ = [
    "MAX_CLOCK_MHZ",
    "MAX_ENERGY_J",
    "MAX_POWER_W",
    "MAX_TIME_S",
    "SCHEMA_VERSION",
    "Baseline",
    "ClockMHz",
    "Frontier",
    "JobSpec",
    "PlanOp",
    "PlanPoint",
    "PointPower",
    "job_range",
    "points_sha256",
    "same_figures",
]

SCHEMA_VERSION: Literal[3] = 3

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def job_range(name: str) -> Any:
    """The field constraint of job number ``name`` (:data:`perseus.validate.JOB_BOUNDS`)."""
    gt, ge, lt, le = JOB_BOUNDS[name]
    return Field(gt=gt, ge=ge, lt=lt, le=le, allow_inf_nan=False)


LayerCount = Annotated[int, job_range("layers_per_stage")]
#: No GPU clock is anywhere near 100 GHz; a larger number is a corrupted file.
MAX_CLOCK_MHZ = 100_000
ClockMHz = Annotated[int, Field(ge=1, le=MAX_CLOCK_MHZ)]
#: Bounds on an iteration's figures (115 days, a quarter TWh): beyond is a corrupted file.
MAX_TIME_S = 1e7
MAX_ENERGY_J = 1e15
_Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
_Joules = Annotated[float, Field(gt=0, le=MAX_ENERGY_J, allow_inf_nan=False)]
_LayerWeight = Annotated[float, Field(gt=0, le=MAX_LAYER_WEIGHT, allow_inf_nan=False)]
#: One phase of a phased op: ``(freq_mhz, mem_freq_mhz or None, first_layer)``.
PhaseSpec = tuple[ClockMHz, ClockMHz | None, Annotated[int, Field(ge=0, le=100_000)]]
#: One op of a plan: a clock, a two-clock op or a list of at most 64 phases.
PlanOp = (
    ClockMHz
    | tuple[ClockMHz, ClockMHz, LayerCount]
    | Annotated[tuple[PhaseSpec, ...], Field(min_length=1, max_length=64)]
)


class JobSpec(BaseModel):
    """What a plan was computed for; a plan is only valid for the same job."""

    model_config = _FROZEN

    schedule: Annotated[str, Field(min_length=1, max_length=100)]
    ranks: Annotated[int, job_range("stages")]
    stages: Annotated[int, job_range("stages")]
    microbatches: Annotated[int, job_range("microbatches")]
    virtual_stages: Annotated[int, job_range("virtual_stages")] = JOB_DEFAULTS.virtual_stages
    blocking_power_w: Annotated[float, job_range("blocking_power_w")]
    profile_sha256: Annotated[str, Field(min_length=1, max_length=128)]
    p2p_latency_s: Annotated[float, job_range("p2p_latency_s")] = JOB_DEFAULTS.p2p_latency_s
    backward_split: Annotated[float, job_range("backward_split")] | None = None
    profile_name: Annotated[str, Field(max_length=4096)] | None = None
    layers_per_stage: Annotated[tuple[LayerCount, ...], Field(max_length=4096)] | None = None
    layer_time_fractions: tuple[tuple[_LayerWeight, ...], ...] | None = None
    switch_latency_s: Annotated[float, job_range("switch_latency_s")] = (
        JOB_DEFAULTS.switch_latency_s
    )
    # A file may record a switch energy past a config's range (any finite figure up to 1e15 J).
    switch_energy_j: Annotated[float, Field(ge=0, le=MAX_ENERGY_J, allow_inf_nan=False)] = (
        JOB_DEFAULTS.switch_energy_j
    )
    switch_stall_s: Annotated[float, job_range("switch_stall_s")] = JOB_DEFAULTS.switch_stall_s
    gpu: GpuIdentity | None = None


class Baseline(BaseModel):
    """The all-max plan's exact figures."""

    model_config = _FROZEN

    time_s: _Seconds
    energy_j: _Joules


#: Summed power of a whole pipeline: bounded far above any real job (10 MW).
MAX_POWER_W = 1e7
_Watts = Annotated[float, Field(ge=0, le=MAX_POWER_W, allow_inf_nan=False)]


class PointPower(BaseModel):
    """The pipeline's summed power over one iteration of a plan (all ranks together).

    Attributes:
        avg_power_w: Energy / iteration time.
        peak_power_w: Highest summed power at any instant; ``min_power_w`` the lowest.
        max_step_w: Largest change of the summed power at one instant.
    """

    model_config = _FROZEN

    avg_power_w: _Watts
    peak_power_w: _Watts
    min_power_w: _Watts
    max_step_w: _Watts

    @model_validator(mode="after")
    def _check_order(self) -> PointPower:
        slack = 1e-9 * max(self.peak_power_w, 1.0)
        if not (self.min_power_w - slack <= self.avg_power_w <= self.peak_power_w + slack):
            raise ValueError(
                f"power figures out of order: need min_power_w {self.min_power_w} <= "
                f"avg_power_w {self.avg_power_w} <= peak_power_w {self.peak_power_w}"
            )
        return self


class PlanPoint(BaseModel):
    """One plan: ``freqs_mhz[r][j]`` is the op (a clock, a two-clock op or a phase list) of
    ``stage_ops[r][j]``."""

    model_config = _FROZEN

    time_s: _Seconds
    energy_j: _Joules
    freqs_mhz: tuple[tuple[PlanOp, ...], ...]
    power: PointPower | None = None

    @model_validator(mode="after")
    def _check(self) -> PlanPoint:
        avg = self.avg_power_w
        if self.power is not None and abs(self.power.avg_power_w - avg) > 1e-6 * avg:
            raise ValueError(
                f"power.avg_power_w {self.power.avg_power_w} is not energy_j / time_s "
                f"({avg}); regenerate the file"
            )
        for r, rank in enumerate(self.freqs_mhz):
            if _all_ints(rank):
                continue
            for j, op in enumerate(rank):
                if not _is_phased(op):
                    continue
                firsts = [ph[2] for ph in op]
                if firsts[0] != 0 or any(b <= a for a, b in itertools.pairwise(firsts)):
                    raise ValueError(
                        f"rank {r} op {j} {json.dumps(op)}: phases start at layer 0 and then at "
                        f"increasing layers, got first layers {firsts}"
                    )
        return self

    @property
    def avg_power_w(self) -> float:
        """The pipeline's average power: energy / iteration time."""
        return self.energy_j / self.time_s

    @property
    def num_two_clock_ops(self) -> int:
        """Ops that switch clock mid-op (one switch or more each) per iteration."""
        return sum(1 for rank in self.freqs_mhz for op in rank if _switches(op))

    @property
    def num_switches(self) -> int:
        """Mid-op clock switches per iteration (a phased op of ``p`` phases has ``p - 1``)."""
        return sum(_switches(op) for rank in self.freqs_mhz for op in rank)

    @property
    def memory_clocks_mhz(self) -> frozenset[int]:
        """The memory clocks the plan sets explicitly (empty: the GPU's default throughout)."""
        return frozenset(
            ph[1]
            for rank in self.freqs_mhz
            for op in rank
            if _is_phased(op)
            for ph in op
            if ph[1] is not None
        )


def _all_ints(ops: Sequence[object]) -> bool:
    """Whether every item is a plain ``int`` (one clock each: a fast path for large plans)."""
    return set(map(type, ops)) <= {int}


def _is_phased(op: PlanOp) -> TypeGuard[tuple[PhaseSpec, ...]]:
    return not isinstance(op, int) and not isinstance(op[0], int)


def _switches(op: PlanOp) -> int:
    if isinstance(op, int):
        return 0
    if isinstance(op[0], int):
        return int(op[0] != op[1])
    return sum(1 for a, b in itertools.pairwise(op) if a[:2] != b[:2])


class _Figures(Protocol):
    @property
    def time_s(self) -> float: ...
    @property
    def energy_j(self) -> float: ...


def same_figures(a: _Figures, b: _Figures) -> bool:
    """Whether two records' ``time_s`` and ``energy_j`` agree to a relative 1e-6."""
    return all(
        abs(x - y) <= 1e-6 * max(abs(x), abs(y))
        for x, y in ((a.time_s, b.time_s), (a.energy_j, b.energy_j))
    )


def _parse_op(name: str, rank: int, index: int) -> Action:
    """``stage_ops[rank][index]``, refused by its place when malformed."""
    try:
        return parse_op_name(name, rank)
    except ScheduleError:
        fix = "not an op name like 'F3' or 'F3@5' (F, B or W, microbatch, @stage if needed)"
        error = PydanticCustomError("op_name", fix)
        details = InitErrorDetails(type=error, loc=("stage_ops", rank, index), input=name)
        raise ValidationError.from_exception_data("Frontier", [details]) from None


#: Job fields that change a plan's figures, not its ops (``gpu`` is checked by the plan sources).
_FIGURES_ONLY = (
    "blocking_power_w",
    "profile_name",
    "layer_time_fractions",
    "switch_latency_s",
    "switch_energy_j",
    "switch_stall_s",
    "gpu",
)


def points_sha256(points: Iterable[PlanPoint]) -> str:
    """SHA-256 of the points' canonical JSON (sorted keys, no spaces, ``None`` fields left out,
    so a point without ``power`` digests as in schema version 2)."""
    doc = [p.model_dump(mode="json", exclude_none=True) for p in points]
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Frontier(BaseModel):
    """A time–energy frontier (or, with one point, a single plan).

    ``stage_ops`` (the file's spelling of every rank's ops) is parsed once, on validation, into
    :attr:`rank_actions`; a malformed name is refused by its place ``stage_ops.<rank>.<index>``.
    """

    model_config = _FROZEN

    schema_version: Annotated[Literal[1, 2, 3], BeforeValidator(whole_number)] = SCHEMA_VERSION
    job: JobSpec
    stage_ops: tuple[tuple[str, ...], ...]
    baseline: Baseline
    points: tuple[PlanPoint, ...] = Field(min_length=1)
    points_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

    _rank_actions: tuple[tuple[Action, ...], ...] = PrivateAttr(default=())
    _stage_in_names: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _check_versions(self) -> Frontier:
        if self.points_sha256 is not None and self.schema_version == 1:
            raise ValueError("points_sha256 needs schema_version 2 or later")
        if self.schema_version < 3 and any(p.power is not None for p in self.points):
            raise ValueError("point power figures need schema_version 3")
        if self.schema_version < 3 and any(
            _is_phased(op) for p in self.points for rank in p.freqs_mhz for op in rank
        ):
            raise ValueError("phased ops (phase lists) need schema_version 3")
        if self.points_sha256 is not None and self.points_sha256 != points_sha256(self.points):
            raise ValueError(
                "points do not match points_sha256: the file was edited or corrupted; "
                "regenerate it (perseus frontier / perseus plan pick)"
            )
        return self

    @model_validator(mode="after")
    def _check_ops(self) -> Frontier:
        self._rank_actions = tuple(
            tuple(_parse_op(name, r, i) for i, name in enumerate(ops))
            for r, ops in enumerate(self.stage_ops)
        )
        self._stage_in_names = any("@" in name for ops in self.stage_ops for name in ops)
        if len(self.stage_ops) != self.job.ranks:
            raise ValueError(
                f"stage_ops has {len(self.stage_ops)} ranks but job.ranks is {self.job.ranks}"
            )
        shape = [len(ops) for ops in self.stage_ops]
        for i, p in enumerate(self.points):
            got = [len(f) for f in p.freqs_mhz]
            if got != shape:
                pairs = enumerate(itertools.zip_longest(got, shape))
                bad = next(r for r, (a, b) in pairs if a != b)
                raise ValueError(
                    f"points[{i}].freqs_mhz does not fit stage_ops ({len(got)} ranks vs "
                    f"{len(shape)}; first difference at rank {bad})"
                )
        for i, (a, b) in enumerate(itertools.pairwise(self.points), start=1):
            if b.time_s < a.time_s:
                raise ValueError(
                    f"points must be sorted by time_s ascending; points[{i}] "
                    f"({b.time_s}) < points[{i - 1}] ({a.time_s})"
                )
        return self

    @property
    def rank_actions(self) -> tuple[tuple[Action, ...], ...]:
        """``stage_ops`` as actions: ``rank_actions[r]`` lists rank ``r``'s in order."""
        return self._rank_actions

    def op_name(self, action: Action) -> str:
        """``action`` spelled as this plan's ``stage_ops`` spell it (``F3`` or ``F3@5``)."""
        return action.op_name(self._stage_in_names)

    @property
    def fastest(self) -> PlanPoint:
        """The point with the lowest iteration time."""
        return self.points[0]

    @property
    def min_energy(self) -> PlanPoint:
        """The point with the lowest energy (T*, the slowest useful plan)."""
        return min(self.points, key=lambda p: (p.energy_j, p.time_s))

    def cheapest_within(self, time_s: float) -> PlanPoint:
        """The lowest-energy point no slower than ``time_s`` (the minimum-energy one beyond T*).

        Raises:
            InfeasibleError: if even the fastest point is slower than ``time_s``.
        """
        feasible = [p for p in self.points if p.time_s <= time_s * (1 + 1e-12)]
        if not feasible:
            raise InfeasibleError(
                f"no plan finishes within {time_s:.6g} s; the fastest takes "
                f"{self.fastest.time_s:.6g} s"
            )
        return min(feasible, key=lambda p: (p.energy_j, -p.time_s))

    def with_points(self, points: tuple[PlanPoint, ...] | list[PlanPoint]) -> Frontier:
        """A copy with other points (e.g. one chosen plan); the writer sets its digest."""
        return self.model_copy(update={"points": tuple(points), "points_sha256": None})

    def check_job(self, job: JobSpec, source: str | None = None) -> None:
        """Raise :class:`PlanError` unless this frontier was computed for ``job``: the same
        schedule, sizes and profile hash (what changes only the figures may differ)."""
        figures_only = set(_FIGURES_ONLY)
        if not any(p.num_two_clock_ops for p in self.points):
            figures_only.add("layers_per_stage")  # it only says where two-clock ops switch
        mine = self.job.model_dump(exclude=figures_only)
        theirs = job.model_dump(exclude=figures_only)
        if diff := [k for k in mine if mine[k] != theirs[k]]:
            fields = "; ".join(
                f"job.{k}: plan has {mine[k]!r}, run has {theirs[k]!r}" for k in diff
            )
            where = f"{source}: " if source else ""
            raise PlanError(f"{where}plan was computed for another job ({fields}); recompute it")
