"""Read and write plan/frontier JSON files (validated with pydantic, never executed).

Reading checks the JSON syntax (naming the line and column), the schema (strict types, finite
numbers), the points' digest (``points_sha256``, schema version 2+) and the job's
self-consistency (:func:`check_frontier_job`).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perseus.errors import ConfigError, PlanError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_write_bytes
from perseus.io.reading import INPUT_LIMITS, MB, decode_text, read_bounded
from perseus.log import get_logger
from perseus.plan import SCHEMA_VERSION, Frontier, PlanPoint, points_sha256
from perseus.profile.two_clock import build_layer_split
from perseus.schedule.actions import Action, Kind
from perseus.schedule.builders import SCHEDULE_NAMES, build_schedule
from perseus.validate import MAX_JOB_OPS, check_job_size, clip_message, show_value

logger = get_logger(__name__)

__all__ = ["check_frontier_job", "read_frontier", "read_json_document", "write_frontier"]

#: Largest plan/frontier file read (sized in :data:`perseus.io.reading.INPUT_LIMITS`).
MAX_FILE_BYTES = INPUT_LIMITS["frontier"]
#: Most points a frontier holds (the tracer keeps points 0.1 % of T_min apart: hundreds).
MAX_POINTS = 100_000

_REGENERATE = "regenerate it with `perseus frontier` (or `perseus plan pick` for a plan)"
_PLAN_WHAT = "a plan/frontier JSON written by perseus"
_TORCH_NAME_RE = re.compile(r"^Schedule[A-Za-z0-9_]{1,60}$")


def _as_tuples(value: Any, depth: int = 0) -> Any:
    """JSON arrays as tuples, for strict validation of tuple fields (deeper than 16 levels is
    left to the schema). Objects are converted in place and each array is dropped once
    converted, so the document never exists twice."""
    if depth > 16:
        return value
    if isinstance(value, list):
        out = tuple([_as_tuples(v, depth + 1) for v in value])
        value.clear()
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            value[k] = _as_tuples(v, depth + 1)
    return value


def read_json_document(
    p: Path, what: str, error: type[ConfigError], limit_bytes: int = MAX_FILE_BYTES
) -> Any:
    """Read ``p`` (a bounded read) and parse it once as JSON; errors name the line and column.
    Callers validate the result as a Python value (``model_validate``; ``strict=True`` where
    the schema allows), never the text again.

    Equal integers share one object (a frontier repeats a few dozen clocks millions of times).
    NaN and Infinity pass here and are refused by the schema, which names the field.
    """
    data = read_bounded(p, limit_bytes=limit_bytes, what=what, error=error)
    if not data.strip():
        raise error(f"{p}: file is empty; pass {what}")
    text = decode_text(p, data, what, error, "utf-8-sig")  # a BOM, as profiles and signals
    del data
    ints: dict[int, int] = {}

    def parse_int(digits: str) -> int:
        value = int(digits)
        return ints.setdefault(value, value)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) < len(pairs):
            key = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
            raise error(
                f"{p}: key {show_value(key)} appears twice in one object (which one counts "
                f"would be a guess); keep one, or pass {what}"
            )
        return out

    try:
        return json.loads(text, parse_int=parse_int, object_pairs_hook=unique)
    except error:  # a key named twice
        raise
    except json.JSONDecodeError as e:
        raise error(f"{p}:{e.lineno}:{e.colno}: invalid JSON ({e.msg}); pass {what}") from None
    except RecursionError:
        raise error(f"{p}: invalid JSON (nested too deeply); pass {what}") from None
    except ValueError as e:  # an integer of thousands of digits
        raise error(f"{p}: invalid JSON ({clip_message(str(e), 120)}); pass {what}") from None


def _stale(where: object, field: str, why: str) -> PlanError:
    """``"<where>: field <field>: <why>; regenerate it ..."``: a file not as perseus wrote it."""
    return PlanError(f"{where}: field {field}: {why}; {_REGENERATE}")


def _schema_error(p: Path, e: ValidationError, loc: tuple[str | int, ...] = ()) -> PlanError:
    """The first schema error, with the fix a file not as perseus wrote it needs."""
    msg = describe_validation_error(str(p), e, loc=loc).replace(": Value error, ", ": ", 1)
    return PlanError(msg if "regenerate" in msg else f"{msg}; {_REGENERATE}")


def _check_counts(p: Path, doc: Any) -> None:
    """Refuse more points or ops than any plan holds before building models of them."""
    if not isinstance(doc, dict):
        return
    points, ops = doc.get("points"), doc.get("stage_ops")
    if isinstance(points, list) and len(points) > MAX_POINTS:
        raise _stale(
            p, "points", f"{len(points):,} points, more than the {MAX_POINTS:,} a frontier may hold"
        )
    if isinstance(ops, list):
        total = sum(len(r) for r in ops if isinstance(r, list))
        if total > MAX_JOB_OPS:
            why = f"{total:,} ops, more than the {MAX_JOB_OPS:,} of the largest job perseus plans"
            raise _stale(p, "stage_ops", why)


def _validate_points(p: Path, points: list[Any]) -> tuple[PlanPoint, ...]:
    """Each point validated on its own, its document dropped once its model exists."""
    for i, point in enumerate(points):
        try:
            points[i] = PlanPoint.model_validate(_as_tuples(point), strict=True)
        except ValidationError as e:
            raise _schema_error(p, e, ("points", i)) from None
    out = tuple(points)
    points.clear()
    return out


def read_frontier(path: str | os.PathLike[str]) -> Frontier:
    """Load and validate a frontier or plan file (at most :data:`MAX_FILE_BYTES`), checking
    the points' digest and that its job describes its ops (:func:`check_frontier_job`).

    Raises:
        PlanError: naming the file and the first bad field, line or the digest.
    """
    p = Path(path)
    doc = read_json_document(p, _PLAN_WHAT, PlanError, limit_bytes=MAX_FILE_BYTES)
    _check_counts(p, doc)
    if isinstance(doc, dict) and isinstance(doc.get("points"), list):
        doc["points"] = _validate_points(p, doc["points"])
    doc = _as_tuples(doc)
    try:
        frontier = Frontier.model_validate(doc, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "value_error" and "points_sha256" in first["msg"]:
            msg = first["msg"].removeprefix("Value error, ")
            msg = msg.replace("regenerate it (perseus frontier / perseus plan pick)", _REGENERATE)
            raise PlanError(f"{p}: field points: {msg}") from None
        raise _schema_error(p, e) from None
    logger.debug(
        "read %s: %d points, schema version %d", p, len(frontier.points), frontier.schema_version
    )
    if frontier.schema_version >= 2 and frontier.points_sha256 is None:
        why = "missing (schema_version 2+ files carry a digest of their points)"
        raise _stale(p, "points_sha256", why)
    check_frontier_job(frontier, os.fspath(path))
    return frontier


def check_frontier_job(frontier: Frontier, source: str) -> None:
    """Check that the file's job describes its ``stage_ops`` (schedule, sizes, op names).

    A frontier of a builder schedule (gpipe, 1f1b, interleaved, zb) must list exactly the ops
    that builder makes for the job's sizes; any other schedule (read from torch) must list
    each of its stages' F and B once per microbatch (and W for all or none).

    Raises:
        PlanError: naming the file and the field at fault.
    """
    j = frontier.job
    sizes = (j.schedule, j.stages, j.microbatches)
    check_job_size(f"{source}: field job", *sizes, j.virtual_stages)
    if j.backward_split is not None and j.schedule in SCHEDULE_NAMES and j.schedule != "zb":
        why = f"set for schedule {j.schedule!r}, which does not split backwards"
        raise _stale(source, "job.backward_split", why)
    _check_layers(frontier, source)
    if j.schedule in SCHEDULE_NAMES:
        try:
            sched = build_schedule(*sizes, virtual_stages=j.virtual_stages)
        except ConfigError as e:  # a ScheduleError: the sizes do not fit the schedule
            why = str(e).partition("\n")[0]
            raise _stale(source, "job", why) from None
        expected = sched.stage_ops()
        if sched.num_ranks != j.ranks:
            raise _stale(
                source,
                "job.ranks",
                f"{j.ranks}, but {j.schedule} with {j.stages} stages and {j.virtual_stages} "
                f"virtual stages has {sched.num_ranks}",
            )
        if frontier.stage_ops != expected:
            where = _first_difference(frontier.stage_ops, expected)
            job = f"{j.schedule}, {j.stages} stages x {j.microbatches} microbatches"
            raise _stale(source, f"stage_ops{where}", f"does not match job ({job})")
        return
    if not _TORCH_NAME_RE.match(j.schedule):
        raise _stale(
            source,
            "job.schedule",
            f"{show_value(j.schedule)} is neither a perseus schedule "
            f"({', '.join(SCHEDULE_NAMES)}) nor a torch schedule class (Schedule...)",
        )
    if j.ranks * j.virtual_stages != j.stages:
        why = f"{j.ranks} ranks x {j.virtual_stages} virtual stages = {j.ranks * j.virtual_stages}"
        raise _stale(source, "job.stages", f"{j.stages}, but {why}")
    _check_generic_ops(frontier, source)


def _check_layers(frontier: Frontier, source: str) -> None:
    """The job's layer split as :func:`perseus.job.make_job` would check it, blamed on the file."""
    j = frontier.job
    if j.layers_per_stage is None:
        if j.layer_time_fractions is not None:
            raise _stale(source, "job.layer_time_fractions", "set without job.layers_per_stage")
        switching = (i for i, p in enumerate(frontier.points) if p.num_two_clock_ops)
        if (i := next(switching, None)) is not None:
            why = "switches clock inside an op, which needs job.layers_per_stage (not set)"
            raise _stale(source, f"points.{i}.freqs_mhz", why)
        return
    try:
        build_layer_split(j.layers_per_stage, j.stages, j.layer_time_fractions)
    except ConfigError as e:
        why = clip_message(str(e).partition("; ")[0], 300)  # the fix a config needs is not it
        raise _stale(source, "job.layers_per_stage", why) from None


def _first_difference(got: tuple[tuple[str, ...], ...], want: tuple[tuple[str, ...], ...]) -> str:
    for r in range(min(len(got), len(want))):
        for i in range(min(len(got[r]), len(want[r]))):
            if got[r][i] != want[r][i]:
                return f"[{r}][{i}] ({show_value(got[r][i])}, expected {want[r][i]!r})"
        if len(got[r]) != len(want[r]):
            return f"[{r}] ({len(got[r])} ops, expected {len(want[r])})"
    return f" ({len(got)} ranks, expected {len(want)})"


def _check_generic_ops(frontier: Frontier, source: str) -> None:
    j = frontier.job
    seen: set[Action] = set()
    for r, actions in enumerate(frontier.rank_actions):
        for i, action in enumerate(actions):
            outside = action.microbatch_index >= j.microbatches or action.stage_index >= j.stages
            if outside or action in seen:
                why = f"is outside the job ({j.stages} stages x {j.microbatches} microbatches)"
                op = show_value(frontier.stage_ops[r][i])
                raise _stale(
                    source, f"stage_ops[{r}][{i}]", f"{op} {why if outside else 'appears twice'}"
                )
            seen.add(action)
    kinds = {a.kind for a in seen}
    per_kind = j.stages * j.microbatches
    for kind in (Kind.F, Kind.B) + ((Kind.W,) if Kind.W in kinds else ()):
        count = sum(1 for a in seen if a.kind is kind)
        if count != per_kind:
            why = f"the job ({j.stages} stages x {j.microbatches} microbatches) has {per_kind}"
            raise _stale(source, "stage_ops", f"{count} {kind.value} ops, {why}")


def write_frontier(frontier: Frontier, path: str | os.PathLike[str]) -> None:
    """Write ``frontier`` as compact JSON (one point per line) with its digest, atomically.

    Raises:
        PlanError: the file would be larger than :data:`MAX_FILE_BYTES` (more than
            :func:`read_frontier` reads back); nothing is written.
    """
    exclude: dict[str, Any] = {"points": True}
    if frontier.job.gpu is None:  # written as before the record existed
        exclude["job"] = {"gpu"}
    head = frontier.model_copy(
        update={"schema_version": SCHEMA_VERSION, "points_sha256": points_sha256(frontier.points)}
    ).model_dump_json(exclude=exclude)
    points = ",\n".join(p.model_dump_json(exclude_none=True) for p in frontier.points)
    data = (head[:-1] + ',\n"points":[\n' + points + "\n]}\n").encode("utf-8")
    del points
    if len(data) > MAX_FILE_BYTES:
        ops = sum(len(r) for r in frontier.stage_ops)
        raise PlanError(
            f"{path}: {len(data) / MB:.1f} MB of frontier JSON ({len(frontier.points):,} points x "
            f"{ops:,} ops), more than perseus reads back ({MAX_FILE_BYTES / MB:.0f} MB); nothing "
            "was written; plan fewer microbatches (the frontier per microbatch changes little "
            "past ~100) or keep fewer points (a larger `min_gap_fraction`)"
        )
    atomic_write_bytes(path, data)
