"""Files of the power features: price/carbon signals (CSV), plan schedules (JSON), power curves.

* **Signal CSV**: rows ``start, value``; an optional header row (``start,value``); ``#``
  comments and blank lines are skipped. ``start`` is seconds (any step, increasing) or an ISO
  8601 time (``2026-11-23T00:00:00+00:00``), all rows the same kind; times are taken relative
  to the first row, which is the job's start. ``value`` is a cost per kWh (a price, a carbon
  intensity), a finite number >= 0.
* **Schedule JSON** (:class:`ScheduleFile`, ``schema_version`` 1): the frontier it indexes
  (its ``points_sha256``), ``N``, ``D``, the costs, one record per interval and the
  iteration-indexed ``segments`` a running job follows.
* **Power curve CSV** (:func:`write_power_curve`): one row per frontier point.
"""

from __future__ import annotations

import itertools
import math
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from perseus.errors import ConfigError, PlanError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_text
from perseus.io.frontier_files import read_json_document
from perseus.io.reading import INPUT_LIMITS, read_bounded
from perseus.plan import MAX_TIME_S, Frontier, points_sha256
from perseus.solver.power_schedule import PowerSchedule
from perseus.validate import show_value

__all__ = [
    "SCHEDULE_SCHEMA_VERSION",
    "ScheduleFile",
    "ScheduleIntervalRecord",
    "power_curve_rows",
    "read_schedule",
    "read_signal",
    "schedule_document",
    "write_power_curve",
    "write_schedule",
]

SCHEDULE_SCHEMA_VERSION: Literal[1] = 1
#: Most rows a signal may have (a year of per-minute values is 525,600).
MAX_SIGNAL_ROWS = 1_000_000

_SIGNAL_WHAT = "a CSV of `start, value` rows (seconds or ISO 8601 times; cost per kWh)"
_FROZEN = ConfigDict(frozen=True, extra="forbid")
_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Index = Annotated[int, Field(ge=0)]


def read_signal(path: str | os.PathLike[str]) -> tuple[list[float], list[float]]:
    """Read a signal CSV: ``(starts_s, values)``, starts relative to the first row.

    Raises:
        ConfigError: one line naming the file, the line and the value at fault.
    """
    p = Path(path)
    data = read_bounded(p, limit_bytes=INPUT_LIMITS["signal"], what=_SIGNAL_WHAT, name="signal")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bad_line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{bad_line}: not UTF-8 text; pass {_SIGNAL_WHAT}") from None
    starts: list[float] = []
    values: list[float] = []
    kind: str | None = None
    origin: datetime | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2:
            raise ConfigError(
                f"{p}:{number}: {len(cells)} fields, expected 2 (start, value); pass {_SIGNAL_WHAT}"
            )
        if not starts and kind is None and cells[0].lower() in ("start", "start_s", "time"):
            kind = "header"
            continue
        if len(starts) >= MAX_SIGNAL_ROWS:
            raise ConfigError(f"{p}:{number}: more than {MAX_SIGNAL_ROWS:,} rows; resample it")
        start_s, this_kind, origin = _parse_start(p, number, cells[0], origin)
        if kind not in (None, "header") and this_kind != kind:
            raise ConfigError(
                f"{p}:{number}: start {show_value(cells[0])} mixes seconds and ISO times; use "
                "one kind for every row"
            )
        kind = this_kind
        try:
            value = float(cells[1])
        except ValueError:
            raise ConfigError(
                f"{p}:{number}: value {show_value(cells[1])} is not a number; pass {_SIGNAL_WHAT}"
            ) from None
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(
                f"{p}:{number}: value {show_value(cells[1])} must be a finite number >= 0 "
                "(a price or carbon intensity per kWh)"
            )
        starts.append(start_s)
        values.append(value)
    if not starts:
        raise ConfigError(f"{p}: no rows; pass {_SIGNAL_WHAT}")
    first = starts[0]
    rel = [s - first for s in starts]
    for k in range(1, len(rel)):
        if not rel[k] > rel[k - 1]:
            raise ConfigError(
                f"{p}: row {k + 1}: start is not after the previous row's "
                f"({rel[k]:g} s vs {rel[k - 1]:g} s from the first row); sort the rows by start, "
                "without repeats"
            )
    return rel, values


def _parse_start(
    p: Path, number: int, cell: str, origin: datetime | None
) -> tuple[float, str, datetime | None]:
    try:
        value = float(cell)
    except ValueError:
        pass
    else:
        if not (math.isfinite(value) and abs(value) <= MAX_TIME_S * 10):
            raise ConfigError(f"{p}:{number}: start {show_value(cell)} is not a finite time")
        return value, "seconds", origin
    try:
        when = datetime.fromisoformat(cell)
    except ValueError:
        raise ConfigError(
            f"{p}:{number}: start {show_value(cell)} is neither seconds nor an ISO 8601 time; "
            f"pass {_SIGNAL_WHAT}"
        ) from None
    if origin is None:
        origin = when
    try:
        return (when - origin).total_seconds(), "iso", origin
    except TypeError:
        raise ConfigError(
            f"{p}:{number}: start {show_value(cell)} mixes times with and without a time zone; "
            "give every row the same form"
        ) from None


class PlanCount(BaseModel):
    """``iterations`` iterations of frontier point ``point_index``."""

    model_config = _FROZEN

    point_index: _Index
    iterations: _Index


class ScheduleIntervalRecord(BaseModel):
    """One interval of a schedule file."""

    model_config = _FROZEN

    start_s: _NonNeg
    end_s: _NonNeg
    value: _NonNeg
    first_iteration: _Index
    plans: tuple[PlanCount, ...]
    busy_s: _NonNeg
    energy_j: _NonNeg
    cost: _NonNeg


class ScheduleFile(BaseModel):
    """A plan schedule: which frontier point runs from which iteration on."""

    model_config = _FROZEN

    schema_version: Literal[1] = SCHEDULE_SCHEMA_VERSION
    frontier_points_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    iterations: Annotated[int, Field(ge=1)]
    deadline_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    cost: _NonNeg
    lp_cost: _NonNeg
    baseline_cost: _NonNeg | None
    baseline_point_index: _Index
    intervals: tuple[ScheduleIntervalRecord, ...]
    #: ``(first_iteration, point_index)``, first iterations strictly increasing from 0.
    segments: tuple[tuple[_Index, _Index], ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_segments(self) -> ScheduleFile:
        firsts = [s[0] for s in self.segments]
        if firsts[0] != 0 or any(b <= a for a, b in itertools.pairwise(firsts)):
            raise ValueError(
                "segments must start at iteration 0 with first iterations strictly increasing"
            )
        if firsts[-1] >= self.iterations:
            raise ValueError(f"a segment starts at or after iteration {self.iterations} (N)")
        return self

    def point_at(self, iteration: int) -> int:
        """The frontier point index that iteration ``iteration`` (0-based) runs."""
        current = self.segments[0][1]
        for first, index in self.segments:
            if first > iteration:
                break
            current = index
        return current

    def check_frontier(self, frontier: Frontier, source: str) -> None:
        """Raise :class:`PlanError` unless the schedule indexes ``frontier``'s points."""
        if points_sha256(frontier.points) != self.frontier_points_sha256:
            raise PlanError(
                f"{source}: field frontier_points_sha256: the schedule was made for another "
                "frontier; make it again with `perseus plan schedule` on the deployed frontier"
            )
        top = max(i for _, i in self.segments)
        if top >= len(frontier.points):
            raise PlanError(
                f"{source}: field segments: point {top} is outside the frontier's "
                f"{len(frontier.points)} points"
            )


def schedule_document(schedule: PowerSchedule, frontier: Frontier) -> ScheduleFile:
    """The file model of ``schedule``, made for ``frontier``'s points."""
    records = []
    done = 0
    for iv in schedule.intervals:
        plans = tuple(
            PlanCount(point_index=i, iterations=n)
            for i, n in (
                (iv.fast_index, iv.fast_iterations),
                (iv.slow_index, iv.slow_iterations),
            )
            if n
        )
        records.append(
            ScheduleIntervalRecord(
                start_s=iv.start_s,
                end_s=iv.end_s,
                value=iv.value,
                first_iteration=done,
                plans=plans,
                busy_s=iv.busy_s,
                energy_j=iv.energy_j,
                cost=iv.cost,
            )
        )
        done += iv.iterations
    return ScheduleFile(
        frontier_points_sha256=points_sha256(frontier.points),
        iterations=schedule.iterations,
        deadline_s=schedule.deadline_s,
        cost=schedule.cost,
        lp_cost=schedule.lp_cost,
        baseline_cost=schedule.baseline_cost,
        baseline_point_index=schedule.baseline_index,
        intervals=tuple(records),
        segments=schedule.segments(),
    )


def write_schedule(
    schedule: PowerSchedule, frontier: Frontier, path: str | os.PathLike[str]
) -> None:
    """Write the schedule JSON atomically."""
    doc = schedule_document(schedule, frontier)
    atomic_write_text(path, doc.model_dump_json(indent=1) + "\n")


def read_schedule(path: str | os.PathLike[str]) -> ScheduleFile:
    """Read and validate a schedule JSON.

    Raises:
        PlanError: naming the file and the first bad field.
    """
    p = Path(path)
    doc = read_json_document(
        p, "a schedule JSON written by `perseus plan schedule`", PlanError,
        limit_bytes=INPUT_LIMITS["schedule"],
    )  # fmt: skip
    try:
        return ScheduleFile.model_validate(doc)
    except ValidationError as e:
        raise PlanError(describe_validation_error(str(p), e)) from None


def power_curve_rows(frontier: Frontier) -> list[tuple[float, float, float | None, float | None]]:
    """``(time_s, avg_power_w, peak_power_w, dpower_dtime_w_per_s)`` per point, fastest first.

    The slope is taken to the next slower point (None for the last point and between points
    of equal time); a cluster manager reads it as watts freed per second of iteration time.
    """
    pts = frontier.points
    rows: list[tuple[float, float, float | None, float | None]] = []
    for i, p in enumerate(pts):
        slope = None
        if i + 1 < len(pts) and pts[i + 1].time_s > p.time_s:
            q = pts[i + 1]
            slope = (q.avg_power_w - p.avg_power_w) / (q.time_s - p.time_s)
        peak = p.power.peak_power_w if p.power is not None else None
        rows.append((p.time_s, p.avg_power_w, peak, slope))
    return rows


def write_power_curve(frontier: Frontier, path: str | os.PathLike[str]) -> None:
    """Write ``time_s,avg_power_w,peak_power_w,dpower_dtime_w_per_s`` rows atomically (an
    empty cell where a figure does not exist)."""

    def cell(x: float | None) -> str:
        return "" if x is None else repr(float(x))

    lines = ["time_s,avg_power_w,peak_power_w,dpower_dtime_w_per_s"]
    lines += [",".join(cell(x) for x in row) for row in power_curve_rows(frontier)]
    atomic_write_text(path, "\n".join(lines) + "\n")
