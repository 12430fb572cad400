"""The recurring store's schema: versioned migrations, constraints, and row checks.

:data:`MIGRATIONS` are ``(version, sql)`` steps applied in place in one transaction
(:func:`migrate`); the tables' ``CHECK`` constraints refuse a bad value at insert, and rows
from before are checked when read (:func:`check_run_row`), a bad one named with the SQL to
repair or drop it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigError
from perseus.validate import show_value

__all__ = [
    "ABANDON_REASONS",
    "COUNTED_REASONS",
    "MIGRATIONS",
    "POSTGRES",
    "SCHEMA_VERSION",
    "SQLITE",
    "Dialect",
    "check_power_limit_row",
    "check_run_row",
    "is_figure",
    "job_sizes",
    "jobs_table",
    "migrate",
    "parse_job_config",
    "power_limits_table",
    "runs_table",
    "statements",
    "too_new",
]

#: Why a run was abandoned. Preemptions (:data:`COUNTED_REASONS`) are in the history as
#: preempted runs; the others are not (the size is tried again).
COUNTED_REASONS = ("signal", "process gone", "lease expired")
ABANDON_REASONS = ("exception", "not started", *COUNTED_REASONS, "unmeasured")
_V2_REASONS = ABANDON_REASONS[:5]

# Version 1, as first published (kept verbatim: it is what existing files hold).
_V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    job TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    created_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    job TEXT NOT NULL REFERENCES jobs(job),
    status TEXT NOT NULL CHECK (status IN ('running', 'done', 'abandoned')),
    phase TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    power_limit_w REAL,
    energy_j REAL,
    time_s REAL,
    cost REAL,
    reached INTEGER,
    epochs INTEGER,
    started_s REAL NOT NULL,
    finished_s REAL
);
CREATE INDEX IF NOT EXISTS runs_by_job ON runs (job, status, seq);
CREATE TABLE IF NOT EXISTS power_limits (
    job TEXT NOT NULL,
    gpu TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    power_limit_w REAL NOT NULL,
    profile TEXT NOT NULL,
    PRIMARY KEY (job, gpu, batch_size)
);
"""


def _size_triggers(table: str) -> str:
    """Triggers keeping ``table``'s batch sizes in the job's ``batch_sizes``."""
    return "".join(
        f"""
CREATE TRIGGER {table}_size_in_job{suffix} BEFORE {event} ON {table}
WHEN json_type((SELECT config FROM jobs WHERE job = NEW.job), '$.batch_sizes') = 'array'
 AND NOT EXISTS (
    SELECT 1 FROM json_each((SELECT config FROM jobs WHERE job = NEW.job), '$.batch_sizes')
    WHERE value = NEW.batch_size)
BEGIN
    SELECT RAISE(ABORT, '{table}.batch_size is not one of the job''s batch_sizes');
END;
"""
        for suffix, event in (("", "INSERT"), ("_update", "UPDATE OF batch_size, job"))
    )


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one engine spells the tables (SQLite also checks each value's type)."""

    int: str
    real: str
    seq: str
    json_object: str
    typed: bool

    def check(self, column: str, kind: str, condition: str) -> str:
        """``condition`` on ``column``, and on SQLite its type ``kind``."""
        return f"typeof({column}) = '{kind}' AND {condition}" if self.typed else condition

    def figure(self, c: str, null: bool = True) -> str:
        """A finite number >= 0 (NaN is above every number in PostgreSQL), or NULL."""
        figure = self.check(c, "real", f"{c} >= 0 AND {c} <= 1e300")
        return f"{c} IS NULL OR ({figure})" if null else figure


_SQLITE_JSON = "json_valid({c}) AND json_type({c}) = 'object'"
SQLITE = Dialect("INTEGER", "REAL", "INTEGER PRIMARY KEY AUTOINCREMENT", _SQLITE_JSON, True)
_PG_SEQ = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
POSTGRES = Dialect(
    "BIGINT", "DOUBLE PRECISION", _PG_SEQ, "jsonb_typeof({c}::jsonb) = 'object'", False
)


def jobs_table(d: Dialect, name: str = "jobs") -> str:
    """The ``jobs`` table's definition (V2 and later)."""
    return f"""
CREATE TABLE {name} (
    job TEXT PRIMARY KEY NOT NULL
        CONSTRAINT job_name CHECK ({d.check("job", "text", "length(job) BETWEEN 1 AND 1000")}),
    config TEXT NOT NULL CONSTRAINT config_object CHECK ({d.json_object.format(c="config")}),
    created_s {d.real} NOT NULL CONSTRAINT created_time CHECK ({d.figure("created_s", False)})
);
"""


def runs_table(d: Dialect, name: str, reasons: tuple[str, ...], measured: bool = False) -> str:
    """The ``runs`` table's definition (V2 and later; SQLite rebuilds it under ``name``)."""
    known = ", ".join(f"'{r}'" for r in reasons)
    limit = d.check("power_limit_w", "real", "power_limit_w > 0 AND power_limit_w <= 1e5")
    done_measured = """,
    CONSTRAINT done_measured CHECK (status <> 'done' OR (energy_j > 0 AND time_s > 0 AND cost > 0))"""
    return f"""
CREATE TABLE {name} (
    seq {d.seq},
    run_id TEXT NOT NULL UNIQUE,
    job TEXT NOT NULL REFERENCES jobs(job),
    status TEXT NOT NULL
        CONSTRAINT run_status CHECK (status IN ('running', 'done', 'abandoned')),
    phase TEXT NOT NULL
        CONSTRAINT run_phase CHECK (phase IN ('default', 'explore', 'thompson')),
    batch_size {d.int} NOT NULL
        CONSTRAINT batch_size_positive CHECK ({d.check("batch_size", "integer", "batch_size >= 1")}),
    power_limit_w {d.real} CONSTRAINT power_limit_range CHECK (power_limit_w IS NULL OR ({limit})),
    energy_j {d.real} CONSTRAINT energy_finite CHECK ({d.figure("energy_j")}),
    time_s {d.real} CONSTRAINT time_finite CHECK ({d.figure("time_s")}),
    cost {d.real} CONSTRAINT cost_finite CHECK ({d.figure("cost")}),
    reached {d.int} CONSTRAINT reached_flag CHECK (
        reached IS NULL OR ({d.check("reached", "integer", "reached IN (0, 1)")})),
    epochs {d.int} CONSTRAINT epochs_count CHECK (
        epochs IS NULL OR ({d.check("epochs", "integer", "epochs >= 0")})),
    started_s {d.real} NOT NULL CONSTRAINT started_time CHECK ({d.figure("started_s", False)}),
    finished_s {d.real} CONSTRAINT finished_time CHECK ({d.figure("finished_s")}),
    pid {d.int} CONSTRAINT lease_pid CHECK (pid IS NULL OR ({d.check("pid", "integer", "pid > 0")})),
    host TEXT CONSTRAINT lease_host CHECK (host IS NULL OR {d.check("host", "text", "TRUE")}),
    process_start TEXT CONSTRAINT lease_start CHECK (
        process_start IS NULL OR {d.check("process_start", "text", "TRUE")}),
    heartbeat_s {d.real} CONSTRAINT heartbeat_time CHECK ({d.figure("heartbeat_s")}),
    end_reason TEXT CONSTRAINT end_reason_known CHECK (
        end_reason IS NULL OR end_reason IN ({known})),
    CONSTRAINT abandoned_has_reason CHECK ((status = 'abandoned') = (end_reason IS NOT NULL)),
    CONSTRAINT done_has_figures CHECK (status <> 'done' OR (
        energy_j IS NOT NULL AND time_s IS NOT NULL AND cost IS NOT NULL AND reached IS NOT NULL)){done_measured if measured else ""}
);
"""


def power_limits_table(d: Dialect, name: str = "power_limits") -> str:
    """The ``power_limits`` table's definition (V2 and later)."""
    limit = d.check("power_limit_w", "real", "power_limit_w > 0 AND power_limit_w <= 1e5")
    return f"""
CREATE TABLE {name} (
    job TEXT NOT NULL,
    gpu TEXT NOT NULL,
    batch_size {d.int} NOT NULL
        CONSTRAINT cached_batch_size CHECK ({d.check("batch_size", "integer", "batch_size >= 1")}),
    power_limit_w {d.real} NOT NULL CONSTRAINT cached_power_limit CHECK ({limit}),
    profile TEXT NOT NULL CONSTRAINT profile_object CHECK ({d.json_object.format(c="profile")}),
    PRIMARY KEY (job, gpu, batch_size)
);
"""


# Version 2: constraints, the run lease and why a run was abandoned. SQLite adds constraints
# only by rebuilding a table (the store turns foreign keys off meanwhile; migrate() checks them
# after).
_V2 = f"""
{jobs_table(SQLITE, "jobs_v2")}
INSERT INTO jobs_v2 (job, config, created_s) SELECT job, config, created_s FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v2 RENAME TO jobs;

{runs_table(SQLITE, "runs_v2", _V2_REASONS)}
INSERT INTO runs_v2 (seq, run_id, job, status, phase, batch_size, power_limit_w, energy_j,
                     time_s, cost, reached, epochs, started_s, finished_s, heartbeat_s,
                     end_reason)
    SELECT seq, run_id, job, status, phase, batch_size, power_limit_w, energy_j, time_s, cost,
           reached, epochs, started_s, finished_s, started_s,
           CASE status WHEN 'abandoned' THEN 'exception' END
    FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX runs_by_job ON runs (job, status, seq);

{power_limits_table(SQLITE, "power_limits_v2")}
INSERT INTO power_limits_v2 SELECT job, gpu, batch_size, power_limit_w, profile
    FROM power_limits;
DROP TABLE power_limits;
ALTER TABLE power_limits_v2 RENAME TO power_limits;
{_size_triggers("runs")}
{_size_triggers("power_limits")}
"""

# Version 3: a finished run measured something (0 J or 0 s becomes abandoned, "unmeasured");
# a cached limit whose profile measured no power or throughput is dropped (profiled again).
_UNMEASURED = "status = 'done' AND NOT (energy_j > 0 AND time_s > 0 AND cost > 0)"
_ZERO_PROFILE = """EXISTS (
    SELECT 1 FROM json_each({profile}) AS m
    WHERE json_type(m.value) = 'object' AND NOT (
        coalesce(json_extract(m.value, '$.avg_power_w'), 1) > 0
        AND coalesce(json_extract(m.value, '$.samples_per_s'), 1) > 0))"""
_V3 = f"""
{runs_table(SQLITE, "runs_v3", ABANDON_REASONS, measured=True)}
INSERT INTO runs_v3 (seq, run_id, job, status, phase, batch_size, power_limit_w, energy_j,
                     time_s, cost, reached, epochs, started_s, finished_s, pid, host,
                     process_start, heartbeat_s, end_reason)
    SELECT seq, run_id, job, CASE WHEN {_UNMEASURED} THEN 'abandoned' ELSE status END, phase,
           batch_size, power_limit_w, energy_j, time_s, cost, reached, epochs, started_s,
           finished_s, pid, host, process_start, heartbeat_s,
           CASE WHEN {_UNMEASURED} THEN 'unmeasured' ELSE end_reason END
    FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_by_job ON runs (job, status, seq);
{_size_triggers("runs")}
DELETE FROM power_limits WHERE {_ZERO_PROFILE.format(profile="power_limits.profile")};
CREATE TRIGGER power_limits_profile_measured BEFORE INSERT ON power_limits
WHEN {_ZERO_PROFILE.format(profile="NEW.profile")}
BEGIN
    SELECT RAISE(ABORT, 'power_limits.profile measured no power or no throughput at a limit');
END;
"""

#: ``(version, sql)`` steps, oldest first; a database at version v gets every later step.
MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _V1), (2, _V2), (3, _V3))
SCHEMA_VERSION = MIGRATIONS[-1][0]


def too_new(source: str, version: int, latest: int) -> ConfigError:
    """The error for a store whose schema a newer perseus wrote."""
    return ConfigError(
        f"{source}: schema version {version} was written by a newer perseus (this one reads "
        f"up to {latest}); upgrade perseus or pass another database"
    )


def statements(script: str) -> Iterator[str]:
    """The SQL statements of ``script`` (a trigger's body keeps its inner semicolons)."""
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \n;"):
                yield buffer.strip()
            buffer = ""
    if buffer.strip(" \n;"):
        yield buffer.strip()


def migrate(con: sqlite3.Connection, source: str, version: int) -> None:
    """Apply every step after ``version`` on ``con`` (inside the caller's transaction).

    Raises:
        ConfigError: a bad row, or a step the database refused.
    """
    if version >= 1:
        _check_old_rows(con, source)
    for step, sql in MIGRATIONS:
        if step <= version:
            continue
        try:
            for statement in statements(sql):
                con.execute(statement)
        except sqlite3.IntegrityError as e:
            raise ConfigError(
                f"{source}: cannot upgrade the store to schema version {step} ({e}); repair or "
                "drop the row the constraint names, then run again (nothing was changed)"
            ) from None
    bad = con.execute("PRAGMA foreign_key_check").fetchone()
    if bad is not None:
        raise ConfigError(
            f"{source}: cannot upgrade the store: a {bad[0]} row (rowid {bad[1]}) names a "
            f"{bad[2]} entry that does not exist; drop it (DELETE FROM {bad[0]} WHERE rowid = "
            f"{bad[1]}) and run again (nothing was changed)"
        )
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _check_old_rows(con: sqlite3.Connection, source: str) -> None:
    jobs = con.execute("SELECT job, config FROM jobs")
    configs = {job: parse_job_config(source, job, text) for job, text in jobs}
    cur = con.execute("SELECT * FROM runs ORDER BY seq")
    names = [d[0] for d in cur.description]
    for values in cur:
        row = dict(zip(names, values, strict=True))
        check_run_row(source, row, job_sizes(configs.get(row["job"], {})), measured=False)
    for row in con.execute("SELECT job, gpu, batch_size, power_limit_w, profile FROM power_limits"):
        check_power_limit_row(source, row, measured=False)


def _json_object(text: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if isinstance(text, (str, bytes)) else None
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def parse_job_config(source: str, job: str, text: Any) -> dict[str, Any]:
    """A ``jobs`` row's config as a dict; :class:`ConfigError` naming the row if it is not
    a JSON object."""
    config = _json_object(text)
    if config is None:
        where = f"job = {_sql(job)}"
        raise ConfigError(
            f"{source}: jobs row {show_value(job)}: config {show_value(text)} is not a JSON "
            f"object; repair it (UPDATE jobs SET config = '{{...}}' WHERE {where}) or drop the "
            f"job (DELETE FROM runs WHERE {where}; DELETE FROM jobs WHERE {where})"
        )
    return config


def job_sizes(config: Mapping[str, Any]) -> frozenset[int] | None:
    """The batch sizes a job's config lists, or None when it lists none."""
    sizes = config.get("batch_sizes")
    if not isinstance(sizes, list):
        return None
    return frozenset(b for b in sizes if isinstance(b, int) and not isinstance(b, bool))


def _sql(value: object) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''")[:200] + "'"
    return repr(value)


def _is_count(value: Any, low: int, *, null: bool = False) -> bool:
    if value is None:
        return null
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_figure(
    value: Any, *, positive: bool = False, upper: float = 1e300, null: bool = False
) -> bool:
    """A finite number >= 0 (> 0 with ``positive``) up to ``upper``, or None with ``null``."""
    if value is None:
        return null
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (value > 0 if positive else value >= 0) and value <= upper


def check_run_row(
    source: str, row: Mapping[str, Any], sizes: frozenset[int] | None, *, measured: bool = True
) -> None:
    """Refuse a ``runs`` row whose values the store cannot use: its status and batch size;
    for a row of the history, every figure; with ``measured`` (all but rows a migration is
    about to repair), a done run's energy, time and cost above zero.

    Raises:
        ConfigError: naming the row, the field and the SQL to repair or drop it.
    """
    status, size, listed = row.get("status"), row.get("batch_size"), sorted(sizes or ())
    checks = [
        ("status", status in ("running", "done", "abandoned"), "running, done or abandoned"),
        ("batch_size", _is_count(size, 1), "a positive integer"),
        ("batch_size", sizes is None or size in sizes, f"one of the job's batch_sizes {listed}"),
    ]
    done = status == "done"
    if done or (status == "abandoned" and row.get("end_reason") in COUNTED_REASONS):
        for field in ("energy_j", "time_s", "cost"):
            # a run preempted before its first heartbeat has NULL figures
            checks.append((field, is_figure(row.get(field), null=not done), "a finite number >= 0"))
            if measured and done:
                expected = "a measured figure > 0 (a run that measured nothing is no run)"
                checks.append((field, is_figure(row.get(field), positive=True), expected))
        limit_ok = is_figure(row.get("power_limit_w"), positive=True, upper=1e5, null=True)
        checks += [
            ("power_limit_w", limit_ok, "a power limit in watts > 0, or NULL"),
            ("reached", not done or row.get("reached") in (0, 1), "0 or 1"),
            ("epochs", _is_count(row.get("epochs"), 0, null=True), "an integer >= 0, or NULL"),
        ]
    seq = row.get("seq")
    for field, ok, expected in checks:
        if not ok:
            raise ConfigError(
                f"{source}: runs row seq={seq} (job {show_value(row.get('job'))}, run "
                f"{show_value(row.get('run_id'))}): {field} is {show_value(row.get(field))}, "
                f"expected {expected}; repair it (UPDATE runs SET {field} = ... WHERE seq = "
                f"{seq}) or drop it (DELETE FROM runs WHERE seq = {seq})"
            )


_PROFILE_FIGURES = ("samples_per_s", "avg_power_w")


def check_power_limit_row(
    source: str,
    row: Sequence[Any],
    range_w: Sequence[float] | None = None,
    *,
    measured: bool = True,
) -> float:
    """A cached power limit from its ``(job, gpu, batch_size, power_limit_w, profile)`` row,
    checked (within the GPU's ``range_w`` when given; with ``measured``, a profile above zero
    at every limit).

    Raises:
        ConfigError: naming the row and the SQL that drops it.
    """
    job, gpu, batch_size, power_limit_w, profile = row
    where = f"job = {_sql(job)} AND gpu = {_sql(gpu)} AND batch_size = {_sql(batch_size)}"
    shown = f"{source}: power_limits row (job {show_value(job)}, gpu {show_value(gpu)}, batch size {show_value(batch_size)})"
    fix = f"drop it (DELETE FROM power_limits WHERE {where}) and the next run profiles again"
    if not is_figure(power_limit_w, positive=True, upper=1e5):
        raise ConfigError(
            f"{shown}: power_limit_w is {show_value(power_limit_w)}, expected watts > 0; {fix}"
        )
    if not _is_count(batch_size, 1):
        raise ConfigError(f"{shown}: batch_size is not a positive integer; {fix}")
    parsed = _json_object(profile)
    if parsed is None:
        raise ConfigError(f"{shown}: profile {show_value(profile)} is not a JSON object; {fix}")
    for limit, m in parsed.items() if measured else ():
        figures = [m[k] for k in _PROFILE_FIGURES if isinstance(m, dict) and k in m]
        if not all(is_figure(v, positive=True) for v in figures):
            raise ConfigError(
                f"{shown}: profile at {show_value(limit)} W measured {show_value(m)}, expected "
                f"{' and '.join(_PROFILE_FIGURES)} > 0 (a limit chosen from nothing); {fix}"
            )
    if range_w is not None and not range_w[0] <= power_limit_w <= range_w[1]:
        raise ConfigError(
            f"{shown}: cached limit {power_limit_w:g} W is outside this GPU's range "
            f"{range_w[0]:g}..{range_w[1]:g} W; {fix}"
        )
    return float(power_limit_w)
