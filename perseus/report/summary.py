"""The figures a report shows, relative to the job's all-max plan as the Perseus paper reports
them; one :class:`Summary` feeds the terminal, ``report-summary.json`` and the HTML page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perseus.errors import ConfigError
from perseus.io._errors import describe_validation_error
from perseus.plan import MAX_ENERGY_J, MAX_TIME_S, Frontier, JobSpec, PlanPoint, same_figures
from perseus.runtime.straggler.sweep import StragglerCase

__all__ = [
    "REPORT_SUMMARY_KIND",
    "MeasuredFigures",
    "MeasuredRun",
    "PlanFigures",
    "StragglerFigures",
    "Summary",
    "format_summary",
    "summarize",
]

#: ``kind`` of a report's ``report-summary.json`` (the figures of a frontier, nothing run).
REPORT_SUMMARY_KIND = "perseus.report-summary"
#: The straggler slowdown the summary quotes.
SUMMARY_STRAGGLER_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class PlanFigures:
    """One plan's exact iteration time and energy, its ``energy_saving`` (``1 − energy /
    all-max energy``) and ``slowdown`` (``time / all-max time − 1``)."""

    time_s: float
    energy_j: float
    energy_saving: float
    slowdown: float


@dataclass(frozen=True, slots=True)
class StragglerFigures:
    """Job-level saving with one straggling pipeline (see :mod:`perseus.runtime.straggler.sweep`)."""

    factor: float
    pipelines: int
    saving_vs_allmax: float
    saving_vs_fastest: float


@dataclass(frozen=True, slots=True)
class Summary:
    """Everything ``report-summary.json`` holds (and the terminal summary prints)."""

    job: dict[str, Any]
    points: int
    allmax: PlanFigures
    fastest: PlanFigures
    min_energy: PlanFigures
    baselines: dict[str, PlanFigures]
    straggler: StragglerFigures | None

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``report-summary.json`` layout, tagged with its ``kind``)."""
        return {"kind": REPORT_SUMMARY_KIND, "schema_version": 1, **asdict(self)}


def summarize(
    frontier: Frontier,
    baselines: Mapping[str, PlanPoint] | None = None,
    sweep: Sequence[StragglerCase] = (),
    pipelines: int | None = None,
) -> Summary:
    """The report's figures of a frontier, its baselines and a straggler sweep (the case whose
    factor is closest to ``SUMMARY_STRAGGLER_FACTOR``)."""
    base = frontier.baseline

    def figures(point: PlanPoint | Any) -> PlanFigures:
        t, e = point.time_s, point.energy_j
        return PlanFigures(t, e, energy_saving=1 - e / base.energy_j, slowdown=t / base.time_s - 1)

    straggler = None
    if sweep and pipelines is not None:
        c = min(sweep, key=lambda c: abs(c.factor - SUMMARY_STRAGGLER_FACTOR))
        straggler = StragglerFigures(c.factor, pipelines, c.saving_vs_allmax, c.saving_vs_fastest)
    return Summary(
        job=frontier.job.model_dump(),
        points=len(frontier.points),
        allmax=figures(base),
        fastest=figures(frontier.fastest),
        min_energy=figures(frontier.min_energy),
        baselines={name: figures(p) for name, p in (baselines or {}).items()},
        straggler=straggler,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def format_summary(summary: Summary) -> str:
    """The short terminal summary (a few lines, no trailing newline)."""
    j = summary.job
    lines = [
        f"{j['profile_name'] or 'profile'}: {j['schedule']} {j['stages']} stages x "
        f"{j['microbatches']} microbatches on {j['ranks']} GPUs, {summary.points} frontier points",
        f"all-max:                  {summary.allmax.time_s:8.3f} s  {summary.allmax.energy_j / 1e3:8.2f} kJ",
        f"energy saved, no slowdown: {_pct(summary.fastest.energy_saving):>8}  "
        f"(fastest plan, {summary.fastest.time_s:.3f} s)",
        f"energy saved at T*:        {_pct(summary.min_energy.energy_saving):>8}  "
        f"({summary.min_energy.time_s:.3f} s, {_pct(summary.min_energy.slowdown)} slower)",
    ]
    s = summary.straggler
    if s is not None:
        lines.append(
            f"{f'with a {s.factor:g}x straggler:':<27}{_pct(s.saving_vs_allmax):>8}  "
            f"(job of {s.pipelines} pipelines, vs all-max; {_pct(s.saving_vs_fastest)} from "
            f"slowing the others)"
        )
    if summary.baselines:
        lines.append("baselines (saving, slowdown vs all-max):")
        for name, b in summary.baselines.items():
            lines.append(f"  {name:<14} {_pct(b.energy_saving):>8}  {_pct(b.slowdown):>8}")
    return "\n".join(lines)


_LOOSE = ConfigDict(frozen=True, extra="ignore")


class MeasuredFigures(BaseModel):
    """Time and energy of one iteration (predicted or measured)."""

    model_config = _LOOSE

    time_s: Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
    energy_j: Annotated[float, Field(gt=0, le=MAX_ENERGY_J, allow_inf_nan=False)]


class _PredictedMeasured(BaseModel):
    model_config = _LOOSE

    predicted: MeasuredFigures
    measured: MeasuredFigures


class MeasuredRun(BaseModel):
    """An emulated or real run's summary: the plan's predicted and measured figures (extra keys
    ignored; ``kind``, ``job`` and ``allmax`` optional)."""

    model_config = _LOOSE

    kind: Literal["perseus.run-summary"] | None = None
    job: dict[str, Any] | None = None
    predicted: MeasuredFigures
    measured: MeasuredFigures
    allmax: _PredictedMeasured | None = None

    @property
    def pairs(self) -> list[tuple[str, MeasuredFigures, MeasuredFigures]]:
        """``(run, predicted, measured)`` of the plan, then of all-max when the run has it."""
        pairs = [("plan", self.predicted, self.measured)]
        if self.allmax is not None:
            pairs.append(("all-max", self.allmax.predicted, self.allmax.measured))
        return pairs

    def check_frontier(self, frontier: Frontier, source: str) -> None:
        """Raise :class:`~perseus.errors.ConfigError` unless this run planned ``frontier``'s job:
        its recorded job and predicted all-max must match the frontier's, and a run that
        records neither must have predicted one of its points (relative tolerance 1e-6)."""
        if self.job is not None:
            try:
                spec = JobSpec.model_validate(self.job)
            except ValidationError as e:
                raise ConfigError(describe_validation_error(source, e, loc=("job",))) from None
            frontier.check_job(spec, source=source)
        if self.allmax is not None:
            got, want = self.allmax.predicted, frontier.baseline
            if not same_figures(got, want):
                raise ConfigError(
                    f"{source}: field allmax.predicted: {got.time_s:.6g} s, {got.energy_j:.6g} J, "
                    f"but the frontier's all-max is {want.time_s:.6g} s, {want.energy_j:.6g} J: "
                    "the run planned another job; pass the frontier that run used"
                )
        p = self.predicted
        if (
            self.job is None
            and self.allmax is None
            and not same_figures(p, frontier.baseline)
            and not any(same_figures(p, q) for q in frontier.points)
        ):
            raise ConfigError(
                f"{source}: field predicted: {p.time_s:.6g} s, {p.energy_j:.6g} J is no point of "
                "the frontier: the run planned another job; pass the frontier that run used"
            )
