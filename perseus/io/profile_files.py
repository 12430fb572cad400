"""Read and write profiles: Zeus/lowtime CSV (op-level, multi-rank or phase-level) and JSON.

The formats, bounds and aggregation rules are in docs/formats.md and docs/memory-clocks.md.
Every problem is one :class:`ProfileError` line naming the file and line (CSV) or field (JSON).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from perseus.errors import ProfileError
from perseus.identity import GpuIdentity
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_bytes
from perseus.io.gpu_record import (
    gpu_record_target,
    note_missing_gpu_record,
    read_gpu_record,
    write_gpu_record,
)
from perseus.io.reading import INPUT_LIMITS, MB, decode_text, read_bounded
from perseus.log import get_logger
from perseus.profile.model import Profile, build_profile, clock_label
from perseus.schedule.actions import Kind
from perseus.validate import MAX_LAYERS_PER_STAGE, clip_message, show_value, whole_number

logger = get_logger(__name__)

__all__ = [
    "PhaseProfile",
    "PhaseRow",
    "read_phase_profile",
    "read_profile",
    "write_phase_profile_csv",
    "write_profile_csv",
    "write_profile_json",
]

REQUIRED_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
RANK_COLUMNS = ("rank", "dp_rank", "pp_rank", "tp_rank")
MAX_STAGES = 4096
MAX_FREQ_MHZ = 100_000
MAX_TIME_S = 1e6
MAX_ENERGY_J = 1e9
#: Smallest time and energy of one op (1 ns, 1 nJ): below, the planner's arithmetic degrades.
MIN_VALUE = 1e-9
MAX_FILE_BYTES = INPUT_LIMITS["profile"]
_KIND_NAMES = ", ".join(k.profile_name for k in Kind)
MEM_COLUMN = "mem_freq_mhz"
PHASE_COLUMNS = ("first_layer", "last_layer")
#: A stage's layers: as many as a job plans with (``layers_per_stage``).
MAX_LAYERS = MAX_LAYERS_PER_STAGE
#: What a cell of a layer or memory clock column must be (in the message when it is not).
_LAYER = f"a layer index in 0..{MAX_LAYERS - 1} (a stage holds at most {MAX_LAYERS} layers)"
_MEM_CLOCK = (
    f"an integer memory clock in 1..{MAX_FREQ_MHZ} MHz; leave the cell empty for the GPU's "
    "default memory clock"
)
#: Every column perseus reads; each may be named once (case and spaces ignored).
_KNOWN_COLUMNS = (*REQUIRED_COLUMNS, *RANK_COLUMNS, MEM_COLUMN, *PHASE_COLUMNS)

#: (stage, kind, SM clock, time, energy, memory clock or None)
Row = tuple[int, Kind, int, float, float, int | None]
#: ``(stage, kind, first_layer, last_layer, freq_mhz, time_s, energy_j, mem_freq_mhz)``.
PhaseRow = tuple[int, Kind, int, int, int, float, float, int | None]
#: A CSV record to write: its cells and its memory clock (None: the default).
_Cells = tuple[list[object], int | None]
#: A phase-level profile's rows by op: (stage, kind, SM clock, memory clock or None) -> phases.
_PhaseOps = dict[tuple[int, Kind, int, int | None], list[PhaseRow]]


@dataclass(frozen=True)
class PhaseProfile:
    """A phase-level profile.

    Attributes:
        profile: The op-level profile (each op the sum of its phases).
        rows: The phase rows as read, in file order.
        layers_per_stage: Layers of each stage.
        layer_time_fractions: Per stage, each layer's share of the stage's op time at the
            highest clocks (a phase's time spread evenly over its layers).
    """

    profile: Profile
    rows: tuple[PhaseRow, ...]
    layers_per_stage: tuple[int, ...]
    layer_time_fractions: tuple[tuple[float, ...], ...]


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a CSV or JSON profile (``.json`` is JSON, anything else CSV); a phase-level CSV
    is read as its op-level profile.

    Raises:
        ProfileError: naming the file and the line or field.
    """
    p = Path(path)
    text = _read_text(p)
    if p.suffix.lower() != ".json" and _is_phase_csv(text):
        return _phase_profile(p, text).profile.with_gpu(read_gpu_record(p))
    if p.suffix.lower() == ".json":
        rows, gpu = _parse_json(p, text)  # the text is parsed twice (syntax, schema), not again
        gpu = note_missing_gpu_record(p, gpu)
    else:
        rows, gpu = _parse_csv(p, text), read_gpu_record(p)
    profile = build_profile(rows, source=str(p), gpu=gpu)
    logger.debug("read profile %s: %d stages, %d rows", p, profile.num_stages, len(rows))
    return profile


def read_phase_profile(path: str | os.PathLike[str]) -> PhaseProfile:
    """Read a phase-level CSV profile (``first_layer`` and ``last_layer`` columns).

    Raises:
        ProfileError: a malformed row, a duplicate phase, or phases that do not cover each
            op's layers once (or differ between clocks).
    """
    p = Path(path)
    text = _read_text(p)
    if not _is_phase_csv(text):
        raise ProfileError(
            f"{p}:1: not a phase-level profile: the header needs the columns "
            f"{','.join(REQUIRED_COLUMNS + PHASE_COLUMNS)}; read op-level files with read_profile"
        )
    return _phase_profile(p, text)


def _read_text(p: Path) -> str:
    data = read_bounded(
        p, limit_bytes=MAX_FILE_BYTES, what="a profile CSV/JSON path", error=ProfileError
    )
    if not data.strip():
        raise ProfileError(
            f"{p}: file is empty; expected a header line '{','.join(REQUIRED_COLUMNS)}' and rows"
        )
    if b"\x00" in data:
        raise ProfileError(f"{p}: file is binary, not a text profile; pass the CSV or JSON file")
    return decode_text(p, data, "the CSV or JSON file", ProfileError, "utf-8-sig")


def _is_phase_csv(text: str) -> bool:
    """Either phase column makes a phase-level file (whose header then needs both)."""
    try:
        cells = next(csv.reader([text.split("\n", 1)[0]]), [])
    except csv.Error:  # a cell past the csv module's limit: _read_header reports it
        return False
    header = {h.strip().lower() for h in cells}
    return any(c in header for c in PHASE_COLUMNS)


def _read_header(p: Path, reader: Any, phase: bool) -> list[str]:
    """The CSV header, lower-cased; refuses a missing column and a column named twice."""
    try:
        header = [h.strip().lower() for h in next(reader)]
    except (StopIteration, csv.Error) as e:
        raise ProfileError(f"{p}:1: cannot read the CSV header ({e})") from None
    need = REQUIRED_COLUMNS + (PHASE_COLUMNS if phase else ())
    missing = [c for c in need if c not in header]
    if missing:
        what = "a phase-level header must contain" if phase else "the header must contain"
        raise ProfileError(
            f"{p}:1: missing column(s) {', '.join(missing)}; {what} {','.join(need)} (got "
            f"{show_value(','.join(header), 120)})"
        )
    twice = [c for c in _KNOWN_COLUMNS if header.count(c) > 1]
    if twice:
        raise ProfileError(
            f"{p}:1: column {twice[0]} is named {header.count(twice[0])} times; keep one"
        )
    orphans = [c for c in ("dp_rank", "tp_rank") if c in header and "rank" not in header]
    if orphans:
        raise ProfileError(
            f"{p}:1: column {orphans[0]} without a rank column; a multi-rank profile gives each "
            "row's global rank in `rank` (or drop the rank columns of a one-GPU profile)"
        )
    return header


def _records(p: Path, text: str, phase: bool) -> Iterator[tuple[int, list[str], dict[str, int]]]:
    """The data records after the header: line number, cells stripped and each known column's
    index; blank lines skipped, short and malformed lines and a file without data refused."""
    reader = csv.reader(io.StringIO(text))
    header = _read_header(p, reader, phase)
    if phase and any(c in header for c in RANK_COLUMNS):
        raise ProfileError(
            f"{p}:1: a phase-level profile holds one GPU's phases: aggregate the ranks first "
            "(drop the rank columns)"
        )
    col = {name: header.index(name) for name in _KNOWN_COLUMNS if name in header}
    width, count = len(header), 0
    try:
        for record in reader:
            if not record or all(not c.strip() for c in record):
                continue
            if len(record) < width:
                raise ProfileError(
                    f"{p}:{reader.line_num}: expected {width} fields, got {len(record)}"
                )
            count += 1
            yield reader.line_num, [c.strip() for c in record], col
    except csv.Error as e:
        raise ProfileError(f"{p}:{reader.line_num}: malformed CSV ({e})") from None
    if not count:
        raise ProfileError(f"{p}: no data rows after the header")


def _parse_phase_rows(p: Path, text: str) -> list[PhaseRow]:
    rows: list[PhaseRow] = []
    seen: dict[tuple[int, Kind, int, int | None, int], int] = {}
    for line, record, col in _records(p, text, phase=True):
        where = f"{p}:{line}"
        stage, kind, freq, time_s, energy_j, mem = _parse_fields(where, record, col)
        first, last = (
            _cell(where, c, record[col[c]], _LAYER, 5, MAX_LAYERS) for c in PHASE_COLUMNS
        )
        if last < first:
            raise ProfileError(
                f"{where}: last_layer {last} is before first_layer {first}; a phase is the "
                "layers first_layer..last_layer (inclusive)"
            )
        if (first_line := seen.setdefault((stage, kind, freq, mem, first), line)) != line:
            raise ProfileError(
                f"{where}: duplicate phase from layer {first} of stage {stage} "
                f"{kind.profile_name} at {clock_label(freq, mem)} (first on line {first_line}); "
                "keep one"
            )
        rows.append((stage, kind, first, last, freq, time_s, energy_j, mem))
    return rows


def _tile_layers(what: str, phases: list[PhaseRow]) -> tuple[tuple[int, int], ...]:
    """The op's phases as (first, last) layers, sorted; refuses a gap or an overlap."""
    phases.sort(key=lambda r: r[2])
    end = 0
    for r in phases:
        if r[2] != end:
            raise ProfileError(
                f"{what}: phases {'overlap' if r[2] < end else 'gap'} at layer {min(r[2], end)} "
                f"(a phase starts at layer {r[2]}, the one before ends at {end - 1}); the phases "
                "must cover layers 0..L-1 once"
            )
        end = r[3] + 1
    return tuple((r[2], r[3]) for r in phases)


def _phase_profile(p: Path, text: str) -> PhaseProfile:
    """Check that phases tile each op's layers alike at every clock; sum them per op."""
    rows = _parse_phase_rows(p, text)
    ops: _PhaseOps = {}
    for r in rows:
        ops.setdefault((r[0], r[1], r[4], r[7]), []).append(r)
    layers: dict[int, tuple[int, Kind]] = {}  # stage -> (count, kind) first seen
    splits: dict[tuple[int, Kind], tuple[tuple[int, int], ...]] = {}
    op_rows: list[Row] = []
    for (stage, kind, freq, mem), phases in ops.items():
        what = f"{p}: stage {stage} {kind.profile_name} at {clock_label(freq, mem)}"
        split = _tile_layers(what, phases)
        if (known := splits.setdefault((stage, kind), split)) != split:
            raise ProfileError(
                f"{what}: phases {list(split)} differ from the op's phases at another clock "
                f"{list(known)}; measure every clock with the same phases"
            )
        end = split[-1][1] + 1
        if (count := layers.setdefault(stage, (end, kind)))[0] != end:
            raise ProfileError(
                f"{what}: {end} layers, but stage {stage} {count[1].profile_name} has "
                f"{count[0]}; every instruction of a stage covers the same layers"
            )
        time_s = math.fsum(r[5] for r in phases)
        op_rows.append((stage, kind, freq, time_s, math.fsum(r[6] for r in phases), mem))
    profile = build_profile(op_rows, source=str(p))
    num_stages = profile.num_stages
    missing = [s for s in range(num_stages) if s not in layers]
    if missing:
        raise ProfileError(f"{p}: no phases for stage(s) {missing}")
    counts = tuple(layers[s][0] for s in range(num_stages))
    logger.debug("read phase profile %s: %d stages, %d phase rows", p, num_stages, len(rows))
    return PhaseProfile(profile, tuple(rows), counts, _layer_fractions(profile, ops, counts))


def _layer_fractions(
    profile: Profile, ops: _PhaseOps, counts: tuple[int, ...]
) -> tuple[tuple[float, ...], ...]:
    """:attr:`PhaseProfile.layer_time_fractions` of the phases of ``ops`` (in file order)."""
    weights = [[0.0] * n for n in counts]
    for stage, kind in dict.fromkeys(key[:2] for key in ops):
        top = profile.op(stage, kind).max_freq  # the highest clock (pair): the reference
        for r in ops[(stage, kind, top.freq_mhz, top.mem_freq_mhz)]:
            share = r[5] / (r[3] - r[2] + 1)
            for layer in range(r[2], r[3] + 1):
                weights[stage][layer] += share
    return tuple(tuple(w / math.fsum(ws) for w in ws) for ws in weights)


def _parse_csv(p: Path, text: str) -> list[Row]:
    rows: list[Row] = []
    row_ranks: list[int] = []
    seen: dict[tuple[int, int, Kind, int, int | None], int] = {}
    for line, record, col in _records(p, text, phase=False):
        where = f"{p}:{line}"
        row = _parse_fields(where, record, col)
        rank = "an integer rank >= 0"
        ranks = {k: _cell(where, k, record[col[k]], rank, 7) for k in RANK_COLUMNS if k in col}
        if ranks.get("pp_rank", row[0]) != row[0]:
            raise ProfileError(
                f"{where}: pp_rank {ranks['pp_rank']} differs from stage {row[0]}; a "
                "multi-rank profile lists each pipeline stage under its pp_rank"
            )
        key = (ranks.get("rank", 0), *row[:3], row[5])
        if (first_line := seen.setdefault(key, line)) != line:
            who = f"rank {key[0]} " if "rank" in ranks else ""
            raise ProfileError(
                f"{where}: duplicate row for {who}stage {row[0]} {row[1].profile_name} at "
                f"{clock_label(row[2], row[5])} (first on line {first_line}); keep one"
            )
        rows.append(row)
        row_ranks.append(key[0])
    return _aggregate_ranks(p, rows, row_ranks) if "rank" in col else rows


def _cell(
    where: str, name: str, text: str, what: str, digits: int = 0, below: float = math.inf
) -> int:
    """The cell ``text`` as an integer of at most ``digits`` digits below ``below``, or (no
    ``digits``) as an integer clock in 1..MAX_FREQ_MHZ MHz (``1410`` or ``1410.0``); else
    ``"<where>: <name> <text> is not <what>"``."""
    clock = math.nan
    if digits:
        ok = text.isdecimal() and len(text) <= digits and int(text) < below
    else:
        with contextlib.suppress(ValueError):
            clock = float(text)
        ok = math.isfinite(clock) and clock == int(clock) and 1 <= clock <= MAX_FREQ_MHZ
    if not ok:
        raise ProfileError(f"{where}: {name} {show_value(text)} is not {what}")
    return int(text) if digits else int(clock)


def _aggregate_ranks(p: Path, rows: list[Row], ranks: list[int]) -> list[Row]:
    """One row per (stage, instruction, clock): max time and mean energy over the stage's ranks."""
    stage_ranks: dict[int, set[int]] = {}
    groups: dict[tuple[int, Kind, int, int | None], list[tuple[int, float, float]]] = {}
    for row, rank in zip(rows, ranks, strict=True):
        stage_ranks.setdefault(row[0], set()).add(rank)
        groups.setdefault((*row[:3], row[5]), []).append((rank, row[3], row[4]))
    out: list[Row] = []
    for (stage, kind, freq, mem), members in groups.items():
        got = {r for r, _, _ in members}
        want = stage_ranks[stage]
        if got != want:
            lacking = sorted(want - got)[:3]
            raise ProfileError(
                f"{p}: stage {stage} {kind.profile_name} at {freq} MHz has no row for rank(s) "
                f"{', '.join(map(str, lacking))} (the stage's ranks are {len(want)}); every rank "
                "of a stage must be profiled at the same clocks"
            )
        energy_j = sum(e for _, _, e in members) / len(members)
        out.append((stage, kind, freq, max(t for _, t, _ in members), energy_j, mem))
    return out


def _parse_number(where: str, name: str, text: str, limit: float, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{where}: {name} {show_value(text)} is not a number") from None
    if not math.isfinite(value) or value < MIN_VALUE or value > limit:
        raise ProfileError(
            f"{where}: {name} must be a finite number in [{MIN_VALUE:g}, {limit:g}] {unit}, "
            f"got {show_value(text)}"
        )
    return value


def _parse_fields(where: str, record: list[str], col: dict[str, int]) -> Row:
    """One op-level row of a CSV record; the checks run in column order, the stage's range
    after the other fields and the memory clock last."""
    stage, name, freq_text, time_text, energy_text = (record[col[c]] for c in REQUIRED_COLUMNS)
    digits = stage[1:] if stage[:1] in ("+", "-") else stage  # one sign at most, as int() takes
    if not (digits.isdecimal() and len(stage) <= 12):
        raise ProfileError(f"{where}: stage {show_value(stage)} is not an integer")
    try:
        kind = Kind.from_profile_name(name.lower())
    except KeyError:
        raise ProfileError(
            f"{where}: unknown instruction {show_value(name)}; use one of {_KIND_NAMES}"
        ) from None
    freq = _cell(where, "frequency", freq_text, f"an integer clock in 1..{MAX_FREQ_MHZ} MHz")
    time_s = _parse_number(where, "time", time_text, MAX_TIME_S, "s")
    energy_j = _parse_number(where, "energy", energy_text, MAX_ENERGY_J, "J")
    if not 0 <= int(stage) < MAX_STAGES:
        raise ProfileError(f"{where}: stage must be in 0..{MAX_STAGES - 1}, got {int(stage)}")
    mem_text = record[col[MEM_COLUMN]] if MEM_COLUMN in col else ""
    mem = _cell(where, MEM_COLUMN, mem_text, _MEM_CLOCK) if mem_text else None
    return int(stage), kind, freq, time_s, energy_j, mem


class _JsonRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: Annotated[int, Field(ge=0, lt=MAX_STAGES)]
    instruction: Literal["forward", "backward", "weight"]
    frequency: Annotated[int, Field(gt=0, le=MAX_FREQ_MHZ)]
    time: Annotated[float, Field(ge=MIN_VALUE, le=MAX_TIME_S, allow_inf_nan=False)]
    energy: Annotated[float, Field(ge=MIN_VALUE, le=MAX_ENERGY_J, allow_inf_nan=False)]
    mem_freq_mhz: Annotated[int, Field(gt=0, le=MAX_FREQ_MHZ)] | None = None


class _JsonProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Annotated[Literal[1], BeforeValidator(whole_number)] = 1
    rows: list[_JsonRow] = Field(min_length=1)
    gpu: GpuIdentity | None = None  # the GPU the rows were measured on (perseus.io.gpu_record)


def _parse_json(p: Path, text: str) -> tuple[list[Row], GpuIdentity | None]:
    """The rows of a JSON profile and its ``gpu`` field."""
    _check_json_syntax(p, text)
    try:
        doc = _JsonProfile.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise ProfileError(describe_validation_error(str(p), e)) from None
    rows: list[Row] = []
    seen: set[tuple[int, Kind, int, int | None]] = set()
    for i, r in enumerate(doc.rows):
        key = (r.stage, Kind.from_profile_name(r.instruction), r.frequency, r.mem_freq_mhz)
        if key in seen:
            raise ProfileError(
                f"{p}: field rows.{i}: duplicate row for stage {r.stage} {r.instruction} at "
                f"{clock_label(r.frequency, r.mem_freq_mhz)}; keep one"
            )
        seen.add(key)
        rows.append((*key[:3], r.time, r.energy, r.mem_freq_mhz))
    return rows, doc.gpu


def _check_json_syntax(p: Path, text: str) -> None:
    """Report a JSON syntax error at its real line and column (stdlib parser), and a key
    repeated in one object; NaN/Infinity pass here and are refused by the schema."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ProfileError(
                    f"{p}: key {show_value(key)} appears twice in one object (which one counts "
                    "would be a guess); keep one"
                )
            out[key] = value
        return out

    try:
        json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{p}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise ProfileError(f"{p}: invalid JSON (nested too deeply)") from None
    except ProfileError:  # a key named twice (a ValueError too)
        raise
    except ValueError as e:  # an integer of thousands of digits
        raise ProfileError(f"{p}: invalid JSON ({clip_message(str(e), 120)})") from None


def _rows(profile: Profile) -> list[Row]:
    return [
        (stage, kind, o.freq_mhz, o.time_s, o.energy_j, o.mem_freq_mhz)
        for (stage, kind), op in profile.ops.items()
        for o in op.options
    ]


def _write_text(path: str | os.PathLike[str], text: str, form: str, max_bytes: int | None) -> None:
    """Write ``text`` atomically, refusing (before writing) more than ``max_bytes``."""
    data = text.encode("utf-8")
    if max_bytes is not None and len(data) > max_bytes:
        raise ProfileError(
            f"{path}: {len(data) / MB:.1f} MB of profile {form}, more than perseus reads back "
            f"({max_bytes / MB:.0f} MB); nothing was written"
        )
    atomic_write_bytes(path, data)


def _write_csv(
    path: str | os.PathLike[str],
    columns: tuple[str, ...],
    records: list[_Cells],
    max_bytes: int | None = None,
) -> None:
    """Write ``(cells, memory clock)`` records atomically; a ``mem_freq_mhz`` column only when
    some record has a memory clock."""
    with_mem = any(mem is not None for _, mem in records)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns + ((MEM_COLUMN,) if with_mem else ()))
    for cells, mem in records:
        writer.writerow(cells + (["" if mem is None else mem] if with_mem else []))
    _write_text(path, out.getvalue(), "CSV", max_bytes)


def write_profile_csv(
    profile: Profile, path: str | os.PathLike[str], *, max_bytes: int | None = None
) -> None:
    """Write ``profile`` in the Zeus/lowtime CSV format (atomically), and its GPU record
    beside it when it has one (:mod:`perseus.io.gpu_record`; none beside a device or FIFO).

    Raises:
        ProfileError: the file would be larger than ``max_bytes`` (``MAX_FILE_BYTES``: more
            than perseus reads back); nothing is written.
        ConfigError: the GPU record cannot be written beside ``path``
            (:func:`~perseus.io.gpu_record.gpu_record_target`); nothing is written.
    """
    record = None if profile.gpu is None else gpu_record_target(path)
    records: list[_Cells] = [
        ([s, k.profile_name, f, repr(t), repr(e)], m) for s, k, f, t, e, m in _rows(profile)
    ]
    _write_csv(path, REQUIRED_COLUMNS, records, max_bytes)
    if profile.gpu is not None and record is not None:
        write_gpu_record(profile.gpu, path)


def write_profile_json(
    profile: Profile, path: str | os.PathLike[str], *, max_bytes: int | None = None
) -> None:
    """Write ``profile`` in perseus's JSON form (atomically).

    Raises:
        ProfileError: the file would be larger than ``max_bytes``; nothing is written.
    """
    rows_out = [
        {"stage": s, "instruction": k.profile_name, "frequency": f, "time": t, "energy": e}
        | ({} if mem is None else {MEM_COLUMN: mem})
        for s, k, f, t, e, mem in _rows(profile)
    ]
    doc: dict[str, object] = {"schema_version": 1, "rows": rows_out}
    if profile.gpu is not None:
        doc["gpu"] = profile.gpu.model_dump(mode="json", exclude_none=True)
    _write_text(path, json.dumps(doc, indent=1) + "\n", "JSON", max_bytes)


def write_phase_profile_csv(profile: PhaseProfile, path: str | os.PathLike[str]) -> None:
    """Write a phase-level profile's rows as CSV (atomically)."""
    records: list[_Cells] = [
        ([s, k.profile_name, f, repr(t), repr(e), first, last], m)
        for s, k, first, last, f, t, e, m in profile.rows
    ]
    _write_csv(path, REQUIRED_COLUMNS + PHASE_COLUMNS, records)
