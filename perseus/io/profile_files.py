"""Read and write profiles: Zeus/lowtime CSV and perseus's JSON form.

CSV: a header with at least ``stage,instruction,frequency,time,energy`` (extra columns are
ignored), one row per (stage, instruction, clock); ``time`` in seconds and ``energy`` in joules
of one GPU per op. JSON: ``{"schema_version": 1, "rows": [{"stage": 0, "instruction":
"forward", "frequency": 1410, "time": 0.05, "energy": 23.8}, ...]}``.

Every problem is reported as one :class:`ProfileError` line naming the file and line (CSV) or
field (JSON).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perseus.errors import ProfileError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_text
from perseus.profile.model import Profile, build_profile
from perseus.schedule.actions import Kind

__all__ = ["read_profile", "write_profile_csv", "write_profile_json"]

REQUIRED_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
_KIND_NAMES = ", ".join(k.profile_name for k in Kind)

Row = tuple[int, Kind, int, float, float]


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a CSV or JSON profile (chosen by extension; ``.json`` is JSON, anything else CSV).

    Raises:
        ProfileError: naming the file and the line or field, for any malformed content.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"{p}: file not found; pass a profile CSV/JSON path") from None
    except OSError as e:
        raise ProfileError(f"{p}: cannot read file ({e.strerror})") from None
    if not data.strip():
        raise ProfileError(
            f"{p}: file is empty; expected a header line '{','.join(REQUIRED_COLUMNS)}' and rows"
        )
    if b"\x00" in data:
        raise ProfileError(f"{p}: file is binary, not a text profile; pass the CSV or JSON file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ProfileError(f"{p}:{line}: not valid UTF-8 text; pass the CSV or JSON file") from None
    rows = _parse_json(p, text) if p.suffix.lower() == ".json" else _parse_csv(p, text)
    return build_profile(rows, source=str(p))


def _parse_csv(p: Path, text: str) -> list[Row]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip().lower() for h in next(reader)]
    except (StopIteration, csv.Error) as e:
        raise ProfileError(f"{p}:1: cannot read the CSV header ({e})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ProfileError(
            f"{p}:1: missing column(s) {', '.join(missing)}; the header must contain "
            f"{','.join(REQUIRED_COLUMNS)} (got {','.join(header)})"
        )
    col = {name: header.index(name) for name in REQUIRED_COLUMNS}
    rows: list[Row] = []
    seen: dict[tuple[int, Kind, int], int] = {}
    try:
        for record in reader:
            line = reader.line_num
            if not record or all(not c.strip() for c in record):
                continue
            if len(record) < len(header):
                raise ProfileError(f"{p}:{line}: expected {len(header)} fields, got {len(record)}")
            row = _parse_fields(f"{p}:{line}", {k: record[i].strip() for k, i in col.items()})
            key = row[:3]
            if key in seen:
                raise ProfileError(
                    f"{p}:{line}: duplicate row for stage {row[0]} {row[1].profile_name} at "
                    f"{row[2]} MHz (first on line {seen[key]}); keep one"
                )
            seen[key] = line
            rows.append(row)
    except csv.Error as e:
        raise ProfileError(f"{p}:{reader.line_num}: malformed CSV ({e})") from None
    if not rows:
        raise ProfileError(f"{p}: no data rows after the header")
    return rows


def _parse_fields(where: str, fields: dict[str, str]) -> Row:
    try:
        stage = int(fields["stage"])
    except ValueError:
        raise ProfileError(f"{where}: stage {fields['stage']!r} is not an integer") from None
    try:
        kind = Kind.from_profile_name(fields["instruction"].lower())
    except KeyError:
        raise ProfileError(
            f"{where}: unknown instruction {fields['instruction']!r}; use one of {_KIND_NAMES}"
        ) from None
    try:
        freq_f = float(fields["frequency"])
    except ValueError:
        freq_f = math.nan
    if not math.isfinite(freq_f) or freq_f != int(freq_f):
        raise ProfileError(
            f"{where}: frequency {fields['frequency']!r} is not an integer clock in MHz"
        )
    values = []
    for name in ("time", "energy"):
        try:
            v = float(fields[name])
        except ValueError:
            raise ProfileError(f"{where}: {name} {fields[name]!r} is not a number") from None
        if not math.isfinite(v) or v <= 0:
            unit = "s" if name == "time" else "J"
            raise ProfileError(
                f"{where}: {name} must be a finite number > 0 {unit}, got {fields[name]}"
            )
        values.append(v)
    if stage < 0:
        raise ProfileError(f"{where}: stage must be >= 0, got {stage}")
    return stage, kind, int(freq_f), values[0], values[1]


class _JsonRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: Annotated[int, Field(ge=0)]
    instruction: Literal["forward", "backward", "weight"]
    frequency: Annotated[int, Field(gt=0)]
    time: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    energy: Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _JsonProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    rows: list[_JsonRow] = Field(min_length=1)


def _parse_json(p: Path, text: str) -> list[Row]:
    try:
        doc = _JsonProfile.model_validate_json(text)
    except ValidationError as e:
        raise ProfileError(describe_validation_error(str(p), e)) from None
    rows: list[Row] = []
    seen: set[tuple[int, Kind, int]] = set()
    for i, r in enumerate(doc.rows):
        row = (r.stage, Kind.from_profile_name(r.instruction), r.frequency, r.time, r.energy)
        if row[:3] in seen:
            raise ProfileError(
                f"{p}: field rows.{i}: duplicate row for stage {r.stage} {r.instruction} at "
                f"{r.frequency} MHz; keep one"
            )
        seen.add(row[:3])
        rows.append(row)
    return rows


def _rows(profile: Profile) -> list[Row]:
    return [
        (stage, kind, o.freq_mhz, o.time_s, o.energy_j)
        for (stage, kind), op in profile.ops.items()
        for o in op.options
    ]


def write_profile_csv(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` in the Zeus/lowtime CSV format (atomically)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(REQUIRED_COLUMNS)
    for stage, kind, freq, t, e in _rows(profile):
        writer.writerow([stage, kind.profile_name, freq, repr(t), repr(e)])
    atomic_write_text(path, out.getvalue())


def write_profile_json(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` in perseus's JSON form (atomically)."""
    doc = {
        "schema_version": 1,
        "rows": [
            {"stage": s, "instruction": k.profile_name, "frequency": f, "time": t, "energy": e}
            for s, k, f, t, e in _rows(profile)
        ],
    }
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
