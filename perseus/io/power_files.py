"""Files of the power features: price/carbon signals (CSV), plan schedules (JSON, schema
version 2; 1 still reads) and power curves (CSV); the formats are in docs/power.md."""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from perseus.dag.graph import FloatArray
from perseus.errors import ConfigError, PlanError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_text
from perseus.io.frontier_files import _as_tuples, read_json_document
from perseus.io.reading import INPUT_LIMITS, decode_text, read_bounded
from perseus.plan import MAX_TIME_S, Frontier, points_sha256
from perseus.solver.power_schedule import _MAX_HORIZON_S, MAX_SIGNAL_VALUE, PowerSchedule
from perseus.validate import show_value, whole_number

__all__ = [
    "MAX_SIGNAL_ROWS",
    "SCHEDULE_SCHEMA_VERSION",
    "ScheduleFile",
    "ScheduleIntervalRecord",
    "Signal",
    "SignalSeries",
    "power_curve_rows",
    "read_schedule",
    "read_signal",
    "schedule_document",
    "schedule_json",
    "write_power_curve",
    "write_schedule",
]

SCHEDULE_SCHEMA_VERSION: Literal[2] = 2
#: Most rows a signal may have (a year of per-minute values is 525,600).
MAX_SIGNAL_ROWS = 1_000_000

_SIGNAL_WHAT = (
    "a CSV of `start, value` rows (seconds or ISO 8601 times), or with a header naming each "
    "column's unit: `start,price_eur_per_mwh,carbon_g_per_kwh_location_average`"
)
_COLUMN_FORMS = (
    "value (per kWh), price_per_kwh, price_per_mwh, price_<currency>_per_mwh (or _per_kwh), "
    "carbon_g_per_kwh_<location|market>_<average|marginal>"
)
_PRICE = re.compile(r"price(?:_([a-z]{3}))?_per_(kwh|mwh)")
_CARBON = re.compile(r"carbon_g_per_kwh(?:_(location|market)_(average|marginal))?")
_FROZEN = ConfigDict(frozen=True, extra="forbid")
_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Value = Annotated[float, Field(ge=-MAX_SIGNAL_VALUE, le=MAX_SIGNAL_VALUE, allow_inf_nan=False)]
_Cost = Annotated[float, Field(ge=-1e30, le=1e30, allow_inf_nan=False)]
_Index = Annotated[int, Field(ge=0)]


@dataclass(frozen=True, slots=True)
class SignalSeries:
    """One column of a signal.

    Attributes:
        column: The column's header name (``value`` for a file without a header).
        quantity: ``"price"``, ``"carbon"`` or ``"value"`` (a cost per kWh of no declared kind).
        unit: The unit as declared (``EUR/MWh``, ``gCO2/kWh``, ``per kWh``).
        basis: For carbon, ``location-based``/``market-based`` and ``average``/``marginal``.
        values_per_kwh: One value per signal row, converted to per kWh.
    """

    column: str
    quantity: str
    unit: str
    basis: str | None
    values_per_kwh: FloatArray

    def describe(self) -> str:
        """``price in EUR/MWh`` / ``carbon in gCO2/kWh (location-based, average)``."""
        basis = f" ({self.basis})" if self.basis else ""
        return f"{self.quantity} in {self.unit}{basis}"

    def amount(self, per_kwh_total: float) -> str:
        """A total (value per kWh x kWh) in the column's own terms: ``123.4 EUR``,
        ``56.7 kgCO2``, ``89.1 (value x kWh)``."""
        if self.quantity == "carbon":
            return f"{per_kwh_total / 1000:.6g} kgCO2"
        if self.quantity == "price":
            currency = self.unit.split("/")[0]
            return f"{per_kwh_total:.6g}" + ("" if currency.startswith("per") else f" {currency}")
        return f"{per_kwh_total:.6g} (value x kWh)"


@dataclass(frozen=True, slots=True)
class Signal:
    """A price/carbon signal.

    Attributes:
        starts_s: Interval starts in seconds from the job's start, 0 first, increasing.
        series: One entry per value column (of one file or two).
        origin: The UTC time of the first start (None for a signal in seconds).
    """

    starts_s: FloatArray
    series: tuple[SignalSeries, ...]
    origin: datetime | None

    def pick(self, quantity: str | None) -> SignalSeries:
        """The series of ``quantity`` (``price``/``carbon``/``value``), or the first one.

        Raises:
            ConfigError: if there is no such series, or two.
        """
        if quantity is None:
            return self.series[0]
        found = [s for s in self.series if s.quantity == quantity]
        if len(found) != 1:
            have = ", ".join(s.column for s in self.series)
            raise ConfigError(
                f"objective `{quantity}`: the signal has {len(found)} such columns ({have}); "
                "pass one price or one carbon column"
            )
        return found[0]


def read_signal(*paths: str | os.PathLike[str]) -> Signal:
    """Read one signal CSV, or two (prices and carbon) aligned on the union of their starts
    (both ISO times, aligned on the clock, or both seconds, each from its first row).

    Raises:
        ConfigError: one line naming the file, the line and the value at fault.
    """
    if not 1 <= len(paths) <= 2:
        raise ConfigError(f"signal: give one or two files, got {len(paths)}")
    parts = [_read_one(Path(p)) for p in paths]
    if len(parts) == 1:
        starts, series, origin = parts[0]
        return Signal(starts - starts[0], series, origin)
    (s1, c1, o1), (s2, c2, o2) = parts
    if (o1 is None) != (o2 is None):
        raise ConfigError(
            f"{paths[1]}: one signal uses ISO times and the other seconds; use one kind for both"
        )
    common = None
    if o1 is not None and o2 is not None:
        if (o1.tzinfo is None) != (o2.tzinfo is None):
            raise ConfigError(
                f"{paths[1]}: one signal's times have a time zone and the other's do not; give "
                "both the same form"
            )
        common = min(o1, o2)
        s1 = s1 + (o1 - common).total_seconds()
        s2 = s2 + (o2 - common).total_seconds()
    else:
        s1, s2 = s1 - s1[0], s2 - s2[0]
    start = max(s1[0], s2[0])
    union = np.union1d(np.union1d(s1[s1 >= start], s2[s2 >= start]), [start])
    aligned: list[SignalSeries] = []
    for s, cols in ((s1, c1), (s2, c2)):
        at = np.searchsorted(s, union, side="right") - 1
        aligned += [replace(c, values_per_kwh=c.values_per_kwh[at]) for c in cols]
    origin = None if common is None else common + timedelta(seconds=float(start))
    return Signal(union - start, tuple(aligned), origin)


def _column(p: Path, name: str) -> tuple[str, str, str | None, float]:
    """``(quantity, unit, basis, factor to per kWh)`` of a header column."""
    name = name.strip().lower()
    if name == "value":
        return "value", "per kWh", None, 1.0
    m = _PRICE.fullmatch(name)
    if m:
        currency = (m.group(1) or "").upper()
        energy = "MWh" if m.group(2) == "mwh" else "kWh"
        unit = f"{currency}/{energy}" if currency else f"per {energy}"
        return "price", unit, None, 1e-3 if energy == "MWh" else 1.0
    m = _CARBON.fullmatch(name)
    if m:
        if m.group(1) is None:
            raise ConfigError(
                f"{p}:1: column {show_value(name)} does not say its basis; name it "
                "carbon_g_per_kwh_<location|market>_<average|marginal>"
            )
        return "carbon", "gCO2/kWh", f"{m.group(1)}-based, {m.group(2)}", 1.0
    raise ConfigError(f"{p}:1: column {show_value(name)} is not one of: {_COLUMN_FORMS}")


def _signal_rows(p: Path) -> tuple[list[int], list[list[str]]]:
    """Line numbers and cells of the rows that are not blank or comments (header included)."""
    data = read_bounded(p, limit_bytes=INPUT_LIMITS["signal"], what=_SIGNAL_WHAT, name="signal")
    text = decode_text(p, data, _SIGNAL_WHAT, ConfigError, "utf-8-sig")
    del data
    numbers: list[int] = []
    rows: list[list[str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            numbers.append(number)
            rows.append(line.split(","))
            if len(rows) > MAX_SIGNAL_ROWS + 1:
                raise ConfigError(f"{p}:{number}: more than {MAX_SIGNAL_ROWS:,} rows; resample it")
    return numbers, rows


def _read_one(p: Path) -> tuple[FloatArray, tuple[SignalSeries, ...], datetime | None]:
    numbers, cells = _signal_rows(p)
    names = ["value"]
    if cells and cells[0][0].strip().lower() in ("start", "start_s", "time"):
        names = [c.strip() for c in cells[0][1:]]
        if not names:
            raise ConfigError(f"{p}:{numbers[0]}: a header with no value column; {_SIGNAL_WHAT}")
        numbers, cells = numbers[1:], cells[1:]
    columns = [_column(p, n) for n in names]
    if not cells:
        raise ConfigError(f"{p}: no rows; pass {_SIGNAL_WHAT}")
    if len(cells) > MAX_SIGNAL_ROWS:
        raise ConfigError(
            f"{p}:{numbers[MAX_SIGNAL_ROWS]}: more than {MAX_SIGNAL_ROWS:,} rows; resample it"
        )
    for number, row in zip(numbers, cells, strict=True):
        if len(row) != 1 + len(columns):
            raise ConfigError(
                f"{p}:{number}: {len(row)} fields, expected {1 + len(columns)} (start, "
                f"{', '.join(names)}); pass {_SIGNAL_WHAT}"
            )
    starts, origin = _parse_starts(p, numbers, [row[0].strip() for row in cells])
    series = []
    for j, (name, (quantity, unit, basis, factor)) in enumerate(zip(names, columns, strict=True)):
        values = _parse_values(p, numbers, [row[1 + j].strip() for row in cells])
        series.append(SignalSeries(name, quantity, unit, basis, values * factor))
    _check_increasing(p, starts)
    return starts, tuple(series), origin


def _check_increasing(p: Path, starts: FloatArray) -> None:
    bad = np.flatnonzero(~(np.diff(starts) > 0))
    if bad.size:
        k = int(bad[0]) + 1
        rel = starts - starts[0]
        raise ConfigError(
            f"{p}: row {k + 1}: start is not after the previous row's "
            f"({rel[k]:g} s vs {rel[k - 1]:g} s from the first row); sort the rows by start, "
            "without repeats"
        )


def _parse_values(p: Path, numbers: list[int], raw: list[str]) -> FloatArray:
    try:
        values = np.array(raw, dtype=np.float64)
    except ValueError:
        k = next(k for k, cell in enumerate(raw) if not _is_number(cell))
        raise ConfigError(
            f"{p}:{numbers[k]}: value {show_value(raw[k])} is not a number; pass {_SIGNAL_WHAT}"
        ) from None
    bad = np.flatnonzero(~(np.abs(values) <= MAX_SIGNAL_VALUE))
    if bad.size:
        k = int(bad[0])
        raise ConfigError(
            f"{p}:{numbers[k]}: value {show_value(raw[k])} must be a finite number within "
            f"±{MAX_SIGNAL_VALUE:g} (a price or carbon intensity; negative prices are allowed)"
        )
    return values


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _iso_or_none(cell: str) -> datetime | None:
    try:
        return datetime.fromisoformat(cell)
    except ValueError:
        return None


def _parse_starts(
    p: Path, numbers: list[int], raw: list[str]
) -> tuple[FloatArray, datetime | None]:
    """Seconds (any origin), or ISO times as seconds from the first one, and that origin."""
    try:
        starts = np.array(raw, dtype=np.float64)
    except ValueError:
        pass
    else:
        bad = np.flatnonzero(~(np.abs(starts) <= MAX_TIME_S * 10))
        if bad.size:
            k = int(bad[0])
            raise ConfigError(f"{p}:{numbers[k]}: start {show_value(raw[k])} is not a finite time")
        return starts, None
    seconds = _is_number(raw[0])
    out = np.empty(len(raw), dtype=np.float64)
    origin: datetime | None = None
    for k, (number, cell) in enumerate(zip(numbers, raw, strict=True)):
        when = _iso_or_none(cell)
        if seconds and when is None and _is_number(cell):
            continue
        if seconds or when is None:
            if when is not None or _is_number(cell):
                raise ConfigError(
                    f"{p}:{number}: start {show_value(cell)} mixes seconds and ISO times; use "
                    "one kind for every row"
                )
            raise ConfigError(
                f"{p}:{number}: start {show_value(cell)} is neither seconds nor an ISO 8601 "
                f"time; pass {_SIGNAL_WHAT}"
            )
        if origin is None:
            origin = when
        try:
            out[k] = (when - origin).total_seconds()
        except TypeError:
            raise ConfigError(
                f"{p}:{number}: start {show_value(cell)} mixes times with and without a time "
                "zone; give every row the same form"
            ) from None
    far = np.flatnonzero(~(out <= _MAX_HORIZON_S))
    if far.size:
        k = int(far[0])
        raise ConfigError(
            f"{p}:{numbers[k]}: start {show_value(raw[k])} is more than 1000 years after the "
            "first row's; fix the time"
        )
    if origin is not None and origin.tzinfo is not None:
        try:
            origin = origin.astimezone(timezone.utc)
        except OverflowError:
            raise ConfigError(
                f"{p}:{numbers[0]}: start {show_value(raw[0])} is before year 1 or after 9999 "
                "in UTC; fix the time"
            ) from None
    return out, origin


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
    value: _Value
    first_iteration: _Index
    plans: tuple[PlanCount, ...]
    busy_s: _NonNeg
    energy_j: _NonNeg
    #: The idle GPUs' energy over the rest of the interval (schema 2).
    idle_energy_j: _NonNeg = 0.0
    cost: _Cost


class ScheduleFile(BaseModel):
    """A plan schedule: which frontier point runs from which iteration on."""

    model_config = _FROZEN

    schema_version: Annotated[Literal[1, 2], BeforeValidator(whole_number)] = (
        SCHEDULE_SCHEMA_VERSION
    )
    frontier_points_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    iterations: Annotated[int, Field(ge=1, le=10**15)]
    deadline_s: Annotated[float, Field(gt=0, le=1e11, allow_inf_nan=False)]
    cost: _Cost
    lp_cost: _Cost
    baseline_cost: _Cost | None
    baseline_point_index: _Index
    #: The job's summed idle power, charged from the signal's start to the deadline.
    idle_power_w: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] = 0.0
    #: What the costs are: the signal's quantity, unit and basis (``price in EUR/MWh``).
    signal: Annotated[str, Field(max_length=200)] | None = None
    #: The UTC time of the signal's first row (None for a signal in seconds).
    origin_utc: datetime | None = None
    #: The intervals that run iterations, in time order (the others only idle).
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
        k = bisect.bisect_right(self.segments, iteration, key=lambda segment: segment[0])
        return self.segments[max(k - 1, 0)][1]

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


def schedule_json(
    schedule: PowerSchedule,
    frontier: Frontier,
    signal: SignalSeries | None = None,
    origin: datetime | None = None,
) -> str:
    """The schedule file's text, written from the schedule's arrays with :mod:`json` (a year
    of per-minute intervals in seconds); :func:`read_schedule` validates it."""
    used = schedule.used()
    s = schedule

    def column(values: npt.NDArray[np.generic]) -> list[object]:
        return values[used].tolist()  # type: ignore[no-any-return]

    fast = zip(column(s.fast_index), column(s.fast_iterations), strict=True)
    slow = zip(column(s.slow_index), column(s.slow_iterations), strict=True)
    fields = {
        "start_s": column(s.starts_s),
        "end_s": column(s.ends_s),
        "value": column(s.values),
        "first_iteration": column(np.concatenate([[0], np.cumsum(s.interval_iterations)])),
        "plans": [
            [{"point_index": i, "iterations": n} for i, n in pair if n]
            for pair in zip(fast, slow, strict=True)
        ],
        "busy_s": column(s.busy_s),
        "energy_j": column(s.energy_j),
        "idle_energy_j": column(s.idle_energy_j),
        "cost": column(s.interval_costs),
    }
    records = [dict(zip(fields, row, strict=True)) for row in zip(*fields.values(), strict=True)]
    head = ScheduleFile.model_construct(
        schema_version=SCHEDULE_SCHEMA_VERSION,
        frontier_points_sha256=points_sha256(frontier.points),
        iterations=schedule.iterations,
        deadline_s=schedule.deadline_s,
        cost=schedule.cost,
        lp_cost=schedule.lp_cost,
        baseline_cost=schedule.baseline_cost,
        baseline_point_index=schedule.baseline_index,
        idle_power_w=schedule.idle_power_w,
        signal=None if signal is None else signal.describe(),
        origin_utc=origin,
        intervals=(),
        segments=(),
    ).model_dump(mode="json", exclude={"intervals", "segments"})
    # One interval per line, written by json's C encoder (indent= would use the Python one).
    text = json.dumps(head, indent=1, allow_nan=False)[: -len("\n}")]
    lines = ",\n  ".join(json.dumps(r, allow_nan=False) for r in records)
    segments = json.dumps([list(s) for s in schedule.segments()], separators=(",", ":"))
    return f'{text},\n "intervals": [\n  {lines}\n ],\n "segments": {segments}\n}}\n'


def schedule_document(
    schedule: PowerSchedule,
    frontier: Frontier,
    signal: SignalSeries | None = None,
    origin: datetime | None = None,
) -> ScheduleFile:
    """The validated file model of ``schedule`` (see :func:`schedule_json`)."""
    return ScheduleFile.model_validate_json(schedule_json(schedule, frontier, signal, origin))


def write_schedule(
    schedule: PowerSchedule,
    frontier: Frontier,
    path: str | os.PathLike[str],
    signal: SignalSeries | None = None,
    origin: datetime | None = None,
) -> None:
    """Write the schedule JSON atomically.

    Raises:
        ConfigError: if the file would be larger than perseus reads back (nothing written).
    """
    text = schedule_json(schedule, frontier, signal, origin)
    limit = INPUT_LIMITS["schedule"]
    if len(text) > limit:
        raise ConfigError(
            f"{path}: the schedule runs in {schedule.used().size:,} signal intervals, "
            f"{len(text) / 2**20:.0f} MB of JSON, more than perseus reads back "
            f"({limit / 2**20:.0f} MB); resample the signal to longer intervals"
        )
    atomic_write_text(path, text)


_ISO_TIME: TypeAdapter[datetime] = TypeAdapter(datetime)


def read_schedule(path: str | os.PathLike[str]) -> ScheduleFile:
    """Read and validate a schedule JSON.

    Raises:
        PlanError: naming the file and the first bad field.
    """
    p = Path(path)
    doc = read_json_document(
        p,
        "a schedule JSON written by `perseus plan schedule`",
        PlanError,
        limit_bytes=INPUT_LIMITS["schedule"],
    )
    loc: tuple[str, ...] = ()
    try:  # strict, as plan files are read; the ISO time is the one text a datetime is read from
        if isinstance(doc, dict) and isinstance(doc.get("origin_utc"), str):
            loc = ("origin_utc",)
            doc["origin_utc"] = _ISO_TIME.validate_python(doc["origin_utc"])
        loc = ()
        return ScheduleFile.model_validate(_as_tuples(doc), strict=True)
    except ValidationError as e:
        raise PlanError(describe_validation_error(str(p), e, loc=loc)) from None


def power_curve_rows(frontier: Frontier) -> list[tuple[float, float, float | None, float | None]]:
    """``(time_s, avg_power_w, peak_power_w, dpower_dtime_w_per_s)`` per point, fastest first;
    the slope is to the next slower point (None for the last one and between equal times)."""
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
