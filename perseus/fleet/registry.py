"""The fleet in the database: members, their power curves and leases, the budget, the plan.

Tables ``fleet_state`` (one row), ``fleet_members`` and ``fleet_log`` (the last plans, for plots)
sit next to the recurring store's; the planner re-solves when a job registers or finishes, a
lease runs out or the budget changes. Every change is one transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from perseus.device.clock import WALL_CLOCK, Clock
from perseus.errors import ConfigError, InfeasibleError
from perseus.recurring.database import open_store, parse_url
from perseus.recurring.store import SQLStore
from perseus.solver.fleet import FleetJob, plan_fleet
from perseus.validate import show_value

__all__ = ["Assignment", "FleetRegistry", "MemberStatus"]

log = logging.getLogger(__name__)

#: (what it creates, how): created where missing.
_DDL = (
    (
        "fleet_state",
        """CREATE TABLE IF NOT EXISTS fleet_state (
    id INTEGER PRIMARY KEY CONSTRAINT one_row CHECK (id = 1),
    budget_w DOUBLE PRECISION CONSTRAINT budget_positive CHECK (budget_w IS NULL OR budget_w > 0),
    epoch BIGINT NOT NULL CONSTRAINT epoch_count CHECK (epoch >= 0),
    dirty INTEGER NOT NULL CONSTRAINT dirty_flag CHECK (dirty IN (0, 1)),
    updated_s DOUBLE PRECISION NOT NULL
)""",
    ),
    (
        "fleet_members",
        """CREATE TABLE IF NOT EXISTS fleet_members (
    name TEXT PRIMARY KEY CONSTRAINT member_name CHECK (length(name) BETWEEN 1 AND 200),
    weight DOUBLE PRECISION NOT NULL CONSTRAINT weight_range CHECK (weight >= 0 AND weight <= 1e9),
    curve TEXT NOT NULL,
    status TEXT NOT NULL CONSTRAINT member_status CHECK (status IN ('running', 'finished', 'expired')),
    heartbeat_s DOUBLE PRECISION NOT NULL,
    lease_s DOUBLE PRECISION NOT NULL CONSTRAINT lease_positive CHECK (lease_s > 0),
    point BIGINT,
    cap_w DOUBLE PRECISION CONSTRAINT cap_positive CHECK (cap_w IS NULL OR cap_w > 0),
    epoch BIGINT,
    ack_point BIGINT,
    ack_iteration BIGINT
)""",
    ),
    # The planner's poll reads the running members; without this it scans every member
    # that ever ran (finished and expired ones stay), holding SQLite's write lock meanwhile.
    (
        "fleet_members_by_status",
        "CREATE INDEX IF NOT EXISTS fleet_members_by_status ON fleet_members (status, name)",
    ),
    (
        "fleet_log",
        """CREATE TABLE IF NOT EXISTS fleet_log (
    t_s DOUBLE PRECISION NOT NULL,
    epoch BIGINT NOT NULL,
    name TEXT,
    budget_w DOUBLE PRECISION,
    point BIGINT,
    average_power_w DOUBLE PRECISION
)""",
    ),
)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A member's plan: the frontier point, its average power (the job's cap) and the epoch."""

    point: int
    cap_w: float
    epoch: int


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member as ``perseus fleet status`` shows it."""

    name: str
    status: str
    point: int | None
    cap_w: float | None
    epoch: int | None
    ack_point: int | None
    ack_iteration: int | None
    heartbeat_age_s: float


_INDEX = "fleet_members_by_status"
_RUNNING = (
    "SELECT name, heartbeat_s, lease_s FROM fleet_members WHERE status = 'running' ORDER BY name"
)
#: Read (and parsed) only for a re-solve: a poll that changes nothing reads no curve.
_CURVES = "SELECT name, weight, curve FROM fleet_members WHERE status = 'running' ORDER BY name"
_CURVE = ("points", "time_s", "average_power_w", "peak_power_w", "fastest_time_s")
_LOG = "INSERT INTO fleet_log (t_s, epoch, name, budget_w, point, average_power_w) VALUES "
#: Plans ``fleet_log`` keeps: at least this many, at most :data:`_LOG_PRUNE_EVERY` more
#: (members + 1 rows each; 43 bytes a row in SQLite). Unbounded, a fleet re-planning every 5 s
#: for a year logged 6.3 million plans: 3 GB at 10 members, 27 GB at 100, all read by
#: :meth:`FleetRegistry.timeline`.
LOG_PLANS = 10_000
#: Plans between two prunes of ``fleet_log`` (each a scan of the table, no index needed:
#: 0.04 s at 10 members, 0.24 s at 100 in SQLite).
_LOG_PRUNE_EVERY = 1_000


def _curve(job: FleetJob) -> str:
    return json.dumps({key: getattr(job, key) for key in _CURVE})


def _job(name: str, weight: float, text: str) -> FleetJob:
    try:
        c = json.loads(text)
    except RecursionError:
        raise ValueError("curve nested too deep") from None
    curve = {key: tuple(map(float, c[key])) for key in _CURVE[1:4]}
    fastest = c["fastest_time_s"]
    fastest = None if fastest is None else float(fastest)
    numbers = [*(v for values in curve.values() for v in values), *([fastest] if fastest else ())]
    if not all(math.isfinite(v) and v > 0 for v in numbers) or fastest == 0:
        raise ValueError(f"member {name!r}: curve times and powers must be finite numbers > 0")
    points = tuple(int(p) for p in c["points"])
    return FleetJob(name, float(weight), points, **curve, fastest_time_s=fastest)


class FleetRegistry:
    """The fleet's tables in a recurring store's database (created on first use).

    Args:
        url: The database (:func:`~perseus.recurring.database.parse_url`).
        clock: Wall clock (tests inject one); leases compare its readings across machines.
    """

    def __init__(self, url: str, *, clock: Clock = WALL_CLOCK) -> None:
        self.store: SQLStore = open_store(url, clock=clock)
        self._clock = clock
        self._ready = False
        self._postgres = parse_url(url).engine == "postgresql"

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> FleetRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> Any:
        return self._read(write=True)

    @contextlib.contextmanager
    def _read(self, *, write: bool = False) -> Iterator[Any]:
        """The fleet's tables, rows decoded inside: one perseus did not write (text in a number
        column, a curve that is not its JSON) fails as one line naming the database."""
        self._ensure()
        with self.store._write() if write else self.store._read() as con:
            try:
                yield con
            except (TypeError, ValueError, KeyError, OverflowError) as e:
                raise ConfigError(
                    f"{self.store._name}: a fleet row holds a value perseus did not write "
                    f"({type(e).__name__}: {e}); this is a bug or a row edited by hand: repair "
                    "or delete the row"
                ) from e

    def _ensure(self) -> None:
        if not self._ready:
            with self.store._write() as con:
                missing: tuple[tuple[str, str], ...] = _DDL
                if self._postgres:
                    self.store._x(con, "SELECT pg_advisory_xact_lock(7370657273657502)")
                    # CREATE ... IF NOT EXISTS needs CREATE on the schema even where the table
                    # is there: a role granted only what docs/fleet.md lists creates nothing.
                    missing = tuple((n, ddl) for n, ddl in _DDL if not self._exists(con, n))
                for name, ddl in missing:
                    if name == _INDEX and self._postgres and not self._may_index(con):
                        log.info(
                            "fleet: index %s is missing and this role cannot create it (the "
                            "owner of fleet_members can: run `perseus fleet status` as it)",
                            _INDEX,
                        )
                        continue
                    self.store._x(con, ddl)
                self.store._x(
                    con,
                    "INSERT INTO fleet_state (id, budget_w, epoch, dirty, updated_s) "
                    "VALUES (1, NULL, 0, 0, ?) ON CONFLICT DO NOTHING",
                    (self._clock.now(),),
                )
            self._ready = True

    def _exists(self, con: Any, name: str) -> bool:
        """Whether table or index ``name`` is in the PostgreSQL search path."""
        return self.store._x(con, "SELECT to_regclass(?)", (name,)).fetchone()[0] is not None

    def _may_index(self, con: Any) -> bool:
        """Whether this PostgreSQL role may index ``fleet_members`` (its owner, with CREATE on
        its schema); one granted only what docs/fleet.md lists may not."""
        row = self.store._x(
            con,
            "SELECT pg_has_role(relowner, 'USAGE') AND has_schema_privilege(relnamespace, "
            "'CREATE') FROM pg_class WHERE oid = to_regclass('fleet_members')",
        ).fetchone()
        return row is not None and bool(row[0])

    def _state(self, con: Any, *, lock: bool = False) -> tuple[float | None, int, bool]:
        sql = "SELECT budget_w, epoch, dirty FROM fleet_state WHERE id = 1"
        if lock and self._postgres:
            sql += " FOR UPDATE"
        row = self.store._x(con, sql).fetchone()
        if row is None:
            raise ConfigError(
                f"{self.store._name}: table fleet_state has no row (deleted by hand); set the "
                "budget again with `perseus fleet budget` (it adds the row back)"
            )
        budget, epoch, dirty = row
        return (None if budget is None else float(budget)), int(epoch), bool(dirty)

    def _many(self, con: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            con.cursor().executemany(sql.replace("?", self.store._param), rows)

    def _dirty(self, con: Any) -> None:
        self.store._x(con, "UPDATE fleet_state SET dirty = 1 WHERE id = 1")

    def register(self, job: FleetJob, *, lease_s: float = 60.0) -> None:
        """Add (or re-add) ``job`` as running, holding a lease of ``lease_s``."""
        if not (math.isfinite(lease_s) and lease_s > 0):
            raise ConfigError(f"`lease_s` must be a positive number of seconds, got {lease_s}")
        name = job.name
        if not (1 <= len(name) <= 200 and name.isprintable()):  # the table's CHECK, no NUL
            raise ConfigError(
                f"fleet member name {show_value(name)}: must be 1 to 200 printable characters "
                "(a job's name in the fleet); pass another name"
            )
        now = self._clock.now()
        with self._write() as con:
            self._state(con, lock=True)
            self.store._x(con, "DELETE FROM fleet_members WHERE name = ?", (job.name,))
            self.store._x(
                con,
                "INSERT INTO fleet_members (name, weight, curve, status, heartbeat_s, lease_s) "
                "VALUES (?, ?, ?, 'running', ?, ?)",
                (job.name, job.weight, _curve(job), now, float(lease_s)),
            )
            self._dirty(con)

    def heartbeat(self, name: str) -> bool:
        """Renew ``name``'s lease; False if it is not running (finished or expired)."""
        self._ensure()
        return self.store._update(
            "UPDATE fleet_members SET heartbeat_s = ? WHERE name = ? AND status = 'running'",
            (self._clock.now(), name),
        )

    def finish(self, name: str) -> None:
        """``name`` ended: its power goes back to the others at the next plan."""
        with self._write() as con:
            self._state(con, lock=True)
            self.store._x(
                con,
                "UPDATE fleet_members SET status = 'finished' WHERE name = ? AND status = 'running'",
                (name,),
            )
            self._dirty(con)

    def assignment(self, name: str) -> Assignment | None:
        """``name``'s current plan, or None before the first plan that includes it."""
        with self._read() as con:
            row = self.store._x(
                con,
                "SELECT point, cap_w, epoch FROM fleet_members WHERE name = ? AND "
                "status = 'running'",
                (name,),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            if not math.isfinite(cap_w := float(row[1])):  # its job would run uncapped
                raise ValueError(f"member {name!r}: cap_w {cap_w}")
            return Assignment(int(row[0]), cap_w, int(row[2]))

    def acknowledge(self, name: str, point: int, iteration: int | None) -> None:
        """Record that ``name`` runs ``point`` from ``iteration`` on."""
        self._ensure()
        self.store._update(
            "UPDATE fleet_members SET ack_point = ?, ack_iteration = ? WHERE name = ?",
            (point, iteration, name),
        )

    def set_budget(self, budget_w: float) -> None:
        """Set the fleet's budget (re-solved at the planner's next look)."""
        if not (math.isfinite(budget_w) and budget_w > 0):
            raise ConfigError(f"`budget_w` must be a positive number of watts, got {budget_w}")
        now = self._clock.now()
        with self._write() as con:
            self._state(con, lock=True)
            self.store._x(
                con,
                "UPDATE fleet_state SET budget_w = ?, dirty = 1, updated_s = ? WHERE id = 1",
                (float(budget_w), now),
            )

    def replan(self, *, force: bool = False) -> int | None:
        """Expire lapsed leases and re-solve if anything changed (or ``force``); the new
        epoch, or None if nothing changed or no budget is set."""
        now = self._clock.now()
        with self._write() as con:
            budget_w, epoch, dirty = self._state(con, lock=True)
            for name, beat, lease in self.store._x(con, _RUNNING).fetchall():
                if beat >= now - lease and math.isfinite(beat + lease):  # inf: edited by hand
                    continue
                log.warning("fleet member %s missed its lease: its power is reassigned", name)
                self.store._x(
                    con,
                    "UPDATE fleet_members SET status = 'expired', point = NULL, cap_w = NULL "
                    "WHERE name = ?",
                    (name,),
                )
                dirty = True
            if budget_w is None or not (dirty or force):
                return None
            epoch += 1
            self.store._x(
                con,
                "UPDATE fleet_state SET epoch = ?, dirty = 0, updated_s = ? WHERE id = 1",
                (epoch, now),
            )
            self.store._x(con, _LOG + "(?, ?, NULL, ?, NULL, NULL)", (now, epoch, budget_w))
            if epoch % _LOG_PRUNE_EVERY == 0:
                self.store._x(con, "DELETE FROM fleet_log WHERE epoch <= ?", (epoch - LOG_PLANS,))
            live = [_job(*row) for row in self.store._x(con, _CURVES).fetchall()]
            plan = _solve(live, budget_w)
            self._many(
                con,
                "UPDATE fleet_members SET point = ?, cap_w = ?, epoch = ? WHERE name = ?",
                [(point, cap_w, epoch, name) for name, point, cap_w in plan],
            )
            self._many(
                con,
                _LOG + "(?, ?, ?, ?, ?, ?)",
                [(now, epoch, name, budget_w, point, cap_w) for name, point, cap_w in plan],
            )
            return epoch

    def status(self) -> tuple[float | None, int, list[MemberStatus]]:
        """The budget, the plan's epoch and every member."""
        now = self._clock.now()
        with self._read() as con:
            budget_w, epoch, _ = self._state(con)
            rows = self.store._x(
                con,
                "SELECT name, status, point, cap_w, epoch, ack_point, ack_iteration, "
                "heartbeat_s FROM fleet_members ORDER BY name",
            ).fetchall()
            n = _number
            members = [
                MemberStatus(
                    str(name),
                    str(status),
                    n(point),
                    n(cap),
                    n(ep),
                    n(ack),
                    n(since),
                    now - float(beat),
                )
                for name, status, point, cap, ep, ack, since, beat in rows
            ]
        return budget_w, epoch, members

    def running(self) -> tuple[float | None, int]:
        """The budget and how many members run (by the index: :meth:`status` reads every
        member that ever ran)."""
        with self._read() as con:
            budget_w, _, _ = self._state(con)
            count = self.store._x(
                con, "SELECT count(*) FROM fleet_members WHERE status = 'running'"
            ).fetchone()[0]
        return budget_w, int(count)

    def timeline(self) -> list[tuple[float, float | None, dict[str, tuple[float, float]]]]:
        """The plans kept (the last :data:`LOG_PLANS` or more), oldest first: each one's
        time, the budget and each job's (average power, iteration time)."""
        with self._read() as con:
            rows = self.store._x(
                con,
                "SELECT t_s, epoch, name, budget_w, point, average_power_w FROM fleet_log "
                "ORDER BY epoch, name IS NOT NULL, name",
            ).fetchall()
            curves = {
                name: _job(name, weight, curve)
                for name, weight, curve in self.store._x(
                    con, "SELECT name, weight, curve FROM fleet_members"
                ).fetchall()
            }
            out: list[tuple[float, float | None, dict[str, tuple[float, float]]]] = []
            for t_s, _, name, budget_w, point, power_w in rows:
                if name is None:
                    out.append((float(t_s), budget_w, {}))
                elif name in curves and out:
                    job = curves[name]
                    out[-1][2][name] = (float(power_w), job.time_s[job.points.index(int(point))])
        return out


def _number(value: Any) -> Any:
    """A number column's value (or NULL); anything else raises ValueError."""
    return value if value is None or type(value) in (int, float) else float(value)


def _solve(jobs: list[FleetJob], budget_w: float) -> list[tuple[str, int, float]]:
    """Each job's (name, point, average power); over budget, everyone's lowest-power plan."""
    if not jobs:
        return []
    try:
        return [(a.name, a.point, a.average_power_w) for a in plan_fleet(jobs, budget_w).jobs]
    except InfeasibleError as e:
        log.warning("fleet: %s; every job runs its lowest-power plan", e)
    lowest = [min(range(len(j.points)), key=j.average_power_w.__getitem__) for j in jobs]
    return [(j.name, j.points[k], j.average_power_w[k]) for j, k in zip(jobs, lowest, strict=True)]
