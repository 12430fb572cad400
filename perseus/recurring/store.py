"""Where a recurring job's history lives: a store Protocol and its SQLite implementation.

Every process of a job (several may run at once on one machine) reads and writes the same
history, so the decision for a new run and the claim of that run happen in **one write
transaction** (``BEGIN IMMEDIATE``: SQLite takes the database's write lock up front, and a
second writer waits up to ``busy_timeout_s``). Two concurrent runs therefore see each other
(a started run is *pending*, and the policy never explores a batch size twice at once), and
every finished run is stored exactly once: ``finish_run`` only moves a row from ``running``
to ``done``, so a retried call cannot double an observation and a crashed writer's
transaction rolls back whole. The journal is WAL, so readers never block the writer.

**A shared database for a cluster.** SQLite's locking needs one machine's file system (not
NFS). Jobs on several machines need a server database; the :class:`RecurringStore` Protocol
is what the rest of perseus uses, so a PostgreSQL store is a drop-in: the same three tables
(``jobs``, ``runs``, ``power_limits``), ``BEGIN ISOLATION LEVEL SERIALIZABLE`` (or
``SELECT ... FOR UPDATE`` on the job's ``jobs`` row, which serialises its decisions exactly
as ``BEGIN IMMEDIATE`` does here) in :meth:`~RecurringStore.begin_run`, ``INSERT ... ON
CONFLICT DO NOTHING`` for the power-limit cache, and ``UPDATE ... WHERE status = 'running'``
in :meth:`~RecurringStore.finish_run`. It is not implemented here (no server dependency).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from perseus.errors import ConfigError, PerseusError
from perseus.recurring.policy import Decision, Observation

__all__ = ["RecurringStore", "SQLiteStore", "StartedRun"]

_SCHEMA_VERSION = 1
_SCHEMA = """
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

Decide = Callable[[Sequence[Observation], Sequence[int]], Decision]


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A run claimed in the store: its id and the decision taken for it."""

    run_id: str
    decision: Decision


@runtime_checkable
class RecurringStore(Protocol):
    """What a recurring job needs from its database (SQLite here; PostgreSQL for clusters)."""

    def register_job(self, job: str, config: Mapping[str, Any]) -> None:
        """Create the job, or check that ``config`` matches the stored one."""
        ...

    def begin_run(self, job: str, decide: Decide) -> StartedRun:
        """Atomically: read history and pending runs, ``decide``, record the run as running."""
        ...

    def finish_run(self, run_id: str, observation: Observation) -> bool:
        """Record a run's result once; False if it was already finished or abandoned."""
        ...

    def abandon_run(self, run_id: str) -> None:
        """Drop a running run without an observation (it crashed for reasons of its own)."""
        ...

    def history(self, job: str) -> list[Observation]:
        """Finished runs, oldest first."""
        ...

    def cached_power_limit_w(self, job: str, gpu: str, batch_size: int) -> float | None:
        """The JIT profiler's choice for (job, GPU, batch size), or None if never profiled."""
        ...

    def save_power_limit_w(
        self, job: str, gpu: str, batch_size: int, power_limit_w: float, profile: Mapping[str, Any]
    ) -> float:
        """Cache a profiler's choice; the first one stored wins and is returned."""
        ...


class SQLiteStore:
    """:class:`RecurringStore` in one SQLite file, safe for concurrent processes on one host.

    The constructor does no I/O; the file is opened (and the schema created) on first use, and
    again after ``fork``. Connections run in autocommit mode with explicit transactions.

    Args:
        path: Database file (created with its directory).
        busy_timeout_s: How long a writer waits for another's transaction.
        stale_after_s: A run still ``running`` after this long is not counted as pending
            (its process most likely died).
        clock: Wall clock (tests inject one).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        stale_after_s: float = 7 * 24 * 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._con: sqlite3.Connection | None = None
        self._pid = 0
        self._lock = threading.RLock()

    # -----------------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._con is None or self._pid != os.getpid():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                con = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                con.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                con.execute("PRAGMA journal_mode = WAL")
                con.execute("PRAGMA synchronous = NORMAL")
                con.execute("PRAGMA foreign_keys = ON")
                version = con.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, _SCHEMA_VERSION):
                    raise ConfigError(
                        f"{self.path}: schema version {version}, this perseus reads "
                        f"{_SCHEMA_VERSION}; use a new database file"
                    )
                with self._transaction(con):
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            con.execute(statement)
                    con.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            except sqlite3.DatabaseError as e:
                raise ConfigError(
                    f"{self.path}: not a usable SQLite database ({e}); use another database file"
                ) from e
            self._con, self._pid = con, os.getpid()
        return self._con

    @contextlib.contextmanager
    def _transaction(self, con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            con = self._connection()
            try:
                with self._transaction(con) as c:
                    yield c
            except sqlite3.OperationalError as e:
                raise PerseusError(f"{self.path}: database busy or failed: {e}") from e

    def close(self) -> None:
        """Close the connection (reopened on next use)."""
        con, self._con = self._con, None
        if con is not None and self._pid == os.getpid():
            con.close()

    # -----------------------------------------------------------------------------------------
    # RecurringStore

    def register_job(self, job: str, config: Mapping[str, Any]) -> None:
        """Create ``job`` or check its configuration.

        Raises:
            ConfigError: if the job exists with a different configuration.
        """
        text = json.dumps(dict(config), sort_keys=True)
        with self._write() as con:
            row = con.execute("SELECT config FROM jobs WHERE job = ?", (job,)).fetchone()
            if row is None:
                con.execute(
                    "INSERT INTO jobs (job, config, created_s) VALUES (?, ?, ?)",
                    (job, text, self._clock()),
                )
                return
        if row[0] != text:
            stored = json.loads(row[0])
            diff = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
            raise ConfigError(
                f"{self.path}: job {job!r} is stored with different {', '.join(diff)} "
                f"({ {k: stored.get(k) for k in diff} }); use a new job name or database"
            )

    def _history(self, con: sqlite3.Connection, job: str) -> list[Observation]:
        rows = con.execute(
            "SELECT batch_size, power_limit_w, energy_j, time_s, cost, reached, epochs FROM runs "
            "WHERE job = ? AND status = 'done' ORDER BY seq",
            (job,),
        ).fetchall()
        return [
            Observation(
                int(b),
                math.nan if p is None else float(p),  # SQLite stores NaN (no limit) as NULL
                e,
                t,
                c,
                bool(r),
                None if k is None else int(k),
            )
            for b, p, e, t, c, r, k in rows
        ]

    def begin_run(self, job: str, decide: Decide) -> StartedRun:
        run_id = uuid.uuid4().hex
        with self._write() as con:
            history = self._history(con, job)
            pending = [
                int(b)
                for (b,) in con.execute(
                    "SELECT batch_size FROM runs WHERE job = ? AND status = 'running' "
                    "AND started_s > ?",
                    (job, self._clock() - self.stale_after_s),
                )
            ]
            decision = decide(history, pending)
            con.execute(
                "INSERT INTO runs (run_id, job, status, phase, batch_size, started_s) "
                "VALUES (?, ?, 'running', ?, ?, ?)",
                (run_id, job, decision.phase, decision.batch_size, self._clock()),
            )
        return StartedRun(run_id, decision)

    def finish_run(self, run_id: str, observation: Observation) -> bool:
        o = observation
        with self._write() as con:
            cur = con.execute(
                "UPDATE runs SET status = 'done', batch_size = ?, power_limit_w = ?, "
                "energy_j = ?, time_s = ?, cost = ?, reached = ?, epochs = ?, finished_s = ? "
                "WHERE run_id = ? AND status = 'running'",
                (
                    o.batch_size,
                    o.power_limit_w,
                    o.energy_j,
                    o.time_s,
                    o.cost,
                    int(o.reached),
                    o.epochs,
                    self._clock(),
                    run_id,
                ),
            )
            return cur.rowcount == 1

    def abandon_run(self, run_id: str) -> None:
        with self._write() as con:
            con.execute(
                "UPDATE runs SET status = 'abandoned', finished_s = ? "
                "WHERE run_id = ? AND status = 'running'",
                (self._clock(), run_id),
            )

    def history(self, job: str) -> list[Observation]:
        with self._lock:
            return self._history(self._connection(), job)

    def runs(self, job: str) -> list[dict[str, Any]]:
        """Every run row of ``job`` (any status), oldest first, as dicts (for reports)."""
        with self._lock:
            cur = self._connection().execute(
                "SELECT * FROM runs WHERE job = ? ORDER BY seq", (job,)
            )
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def cached_power_limit_w(self, job: str, gpu: str, batch_size: int) -> float | None:
        with self._lock:
            row = (
                self._connection()
                .execute(
                    "SELECT power_limit_w FROM power_limits WHERE job = ? AND gpu = ? AND "
                    "batch_size = ?",
                    (job, gpu, batch_size),
                )
                .fetchone()
            )
        return None if row is None else float(row[0])

    def save_power_limit_w(
        self, job: str, gpu: str, batch_size: int, power_limit_w: float, profile: Mapping[str, Any]
    ) -> float:
        with self._write() as con:
            con.execute(
                "INSERT OR IGNORE INTO power_limits (job, gpu, batch_size, power_limit_w, "
                "profile) VALUES (?, ?, ?, ?, ?)",
                (job, gpu, batch_size, power_limit_w, json.dumps(dict(profile), sort_keys=True)),
            )
            row = con.execute(
                "SELECT power_limit_w FROM power_limits WHERE job = ? AND gpu = ? AND "
                "batch_size = ?",
                (job, gpu, batch_size),
            ).fetchone()
        return float(row[0])
