"""Where a recurring job's history lives: a store Protocol, its SQL, and SQLite.

A run's decision and claim are one write transaction, so concurrent runs see each other and a
run is recorded once; a running row holds a lease (its process and a heartbeat), and each
decision first abandons the runs whose process is gone or whose lease expired (a preemption).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from perseus.device.clock import REAL_CLOCK, WALL_CLOCK, Clock, retry
from perseus.device.private_dir import check_private_file
from perseus.errors import ConfigError, PerseusError
from perseus.io.process_identity import ProcessRecord, liveness, pid_namespace, this_process
from perseus.recurring.policy import Decision, Observation
from perseus.recurring.schema import (
    ABANDON_REASONS,
    COUNTED_REASONS,
    SCHEMA_VERSION,
    check_power_limit_row,
    check_run_row,
    is_figure,
    job_sizes,
    migrate,
    parse_job_config,
    too_new,
)

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; the package supports 3.10

__all__ = ["RecurringStore", "SQLStore", "SQLiteStore", "StartedRun"]

log = logging.getLogger(__name__)

Decide = Callable[[Sequence[Observation], Sequence[int]], Decision]

#: How long an urgent abandon (from a signal handler) waits for the database.
_URGENT_TIMEOUT_S = 1.0
_SQLITE_SIBLINGS = ("-wal", "-shm", "-journal")
_CACHED_LIMIT = (
    "SELECT power_limit_w, profile FROM power_limits WHERE job = ? AND gpu = ? AND batch_size = ?"
)
_ABANDON = (
    "UPDATE runs SET status = 'abandoned', end_reason = ?, finished_s = ? "
    "WHERE {} = ? AND status = 'running'"
)


@functools.cache
def _host() -> str:
    """This machine and its pid namespace, as a lease records them (``"node7 pid:[4026531836]"``;
    the process's start, ``"<boot id>:<ticks>"``, tells a reused pid apart)."""
    return f"{socket.gethostname()} {pid_namespace() or ''}".strip()


def _holder_gone(pid: int | None, host: str | None, start: str | None) -> bool:
    """Whether the process holding a lease is certainly gone (one of another host or pid
    namespace never is: its lease expires instead)."""
    if pid is None or host != _host() or int(pid) <= 0:
        return False
    return liveness(ProcessRecord(int(pid), start)) == "gone"


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A run claimed in the store: its id and the decision taken for it."""

    run_id: str
    decision: Decision


@runtime_checkable
class RecurringStore(Protocol):
    """What a recurring job needs from its database (SQLite here; PostgreSQL for clusters)."""

    def register_job(self, job: str, config: Mapping[str, Any]) -> None:
        """Create the job, or :class:`ConfigError` if it is stored with another ``config``."""

    def begin_run(self, job: str, decide: Decide) -> StartedRun:
        """Atomically: expire dead runs, ``decide`` from history and pending runs, record the
        run as running under this process's lease."""

    def heartbeat(self, run_id: str, so_far: Observation) -> bool:
        """Renew a run's lease with its figures so far; False if it is not running any more."""

    def finish_run(self, run_id: str, observation: Observation) -> bool:
        """Record a run's result once; False if it was already finished or abandoned."""

    def abandon_run(self, run_id: str, reason: str = "exception", *, urgent: bool = False) -> None:
        """Drop a running run for one of :data:`~perseus.recurring.schema.ABANDON_REASONS`
        (``urgent``: from a signal handler, wait briefly and on nothing held)."""

    def history(self, job: str) -> list[Observation]:
        """Finished runs and preempted ones (``preempted``), oldest first."""

    def cached_power_limit_w(
        self, job: str, gpu: str, batch_size: int, *, range_w: Sequence[float] | None = None
    ) -> float | None:
        """The profiler's choice for (job, GPU, batch size), or None if never profiled."""

    def save_power_limit_w(
        self, job: str, gpu: str, batch_size: int, power_limit_w: float, profile: Mapping[str, Any]
    ) -> float:
        """Cache a profiler's choice; the first one stored wins and is returned."""


class SQLStore:
    """:class:`RecurringStore` in SQL both engines speak (``?`` placeholders); a subclass
    supplies the connection, transactions, migrations and errors.

    Args:
        name: How messages name the database (a path, or a URL without credentials).
        busy_timeout_s: How long a writer waits for a lock another holds.
        lease_s: A running run whose heartbeat is older than this many seconds is abandoned
            (some minutes, well above the job's heartbeat interval).
        clock: What the recorded times are read on (default the wall clock: hosts compare them).
    """

    #: The connection and the pid that opened it (a forked child opens its own).
    _con: Any = None
    _pid = 0
    #: How the engine's driver writes a parameter (the SQL here writes ``?``).
    _param = "?"

    def __init__(
        self,
        name: str,
        *,
        busy_timeout_s: float = 30.0,
        lease_s: float = 600.0,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        if not (math.isfinite(lease_s) and lease_s > 0):
            raise ConfigError(f"lease_s must be a finite number of seconds > 0, got {lease_s!r}")
        self._name = name
        self.busy_timeout_s = busy_timeout_s
        self.lease_s = lease_s
        self._clock = clock
        self._lock = threading.RLock()

    def _connect(self) -> Any:
        """A new connection, its schema created or migrated."""
        raise NotImplementedError

    def _connection(self) -> Any:
        if self._con is None or self._pid != os.getpid():
            self._con, self._pid = self._connect(), os.getpid()
        return self._con

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def _transaction(self, con: Any) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def _x(self, con: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (``?`` placeholders); returns the cursor."""
        return con.execute(sql.replace("?", self._param), params)

    def _lock_job(self, con: Any, job: str) -> None:
        """Serialise the decisions of ``job`` (inside the write transaction)."""

    def _abandon_urgently(self, sql: str, params: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def _refused(self, detail: object) -> ConfigError:
        return ConfigError(
            f"{self._name}: the database refused a value ({detail}); this is a bug or a row "
            "edited by hand: repair or drop the row the constraint names"
        )

    def _busy(self, detail: str = "") -> PerseusError:
        return PerseusError(
            f"{self._name}: database busy for over {self.busy_timeout_s:g} s{detail}; try again"
        )

    def close(self) -> None:
        """Close the connection (reopened on next use)."""
        con, self._con = self._con, None
        if con is not None and self._pid == os.getpid():
            con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Any]:
        with self._lock, self._errors(), self._transaction(self._connection()) as con:
            yield con

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        with self._lock, self._errors():
            yield self._connection()

    def _config(self, con: Any, job: str) -> dict[str, Any] | None:
        row = self._x(con, "SELECT config FROM jobs WHERE job = ?", (job,)).fetchone()
        return None if row is None else parse_job_config(self._name, job, row[0])

    def _rows(self, con: Any, job: str, where: str = "TRUE") -> list[dict[str, Any]]:
        cur = self._x(con, f"SELECT * FROM runs WHERE job = ? AND {where} ORDER BY seq", (job,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]

    def _history(self, con: Any, job: str, rows: list[dict[str, Any]]) -> list[Observation]:
        config = self._config(con, job)
        sizes = job_sizes(config) if config is not None else None
        out = []
        for row in rows:
            done = row["status"] == "done"
            if not done and not (
                row["status"] == "abandoned" and row["end_reason"] in COUNTED_REASONS
            ):
                continue
            check_run_row(self._name, row, sizes)
            limit = row["power_limit_w"]
            out.append(
                Observation(
                    batch_size=int(row["batch_size"]),
                    # NULL: no limit (_figures writes the NaN as NULL, on either engine)
                    power_limit_w=math.nan if limit is None else float(limit),
                    energy_j=float(row["energy_j"] or 0.0),
                    time_s=float(row["time_s"] or 0.0),
                    cost=float(row["cost"] or 0.0),
                    reached=bool(row["reached"]) if done else False,
                    epochs=None if row["epochs"] is None else int(row["epochs"]),
                    preempted=not done,
                )
            )
        return out

    def _expire(self, con: Any, job: str, now: float) -> None:
        """Mark abandoned the job's running rows whose process is gone or lease expired."""
        for row in self._rows(con, job, "status = 'running'"):
            beat = row["heartbeat_s"] if row["heartbeat_s"] is not None else row["started_s"]
            if _holder_gone(row["pid"], row["host"], row["process_start"]):
                reason = "process gone"
            elif not isinstance(beat, (int, float)) or beat < now - self.lease_s:
                reason = "lease expired"
            else:
                continue
            log.warning(
                "%s: run %s of job %s (batch size %s) abandoned: %s; its size is retried",
                *(self._name, row["run_id"], job, row["batch_size"], reason),
            )
            self._x(con, _ABANDON.format("seq"), (reason, now, row["seq"]))

    def register_job(self, job: str, config: Mapping[str, Any]) -> None:
        text = json.dumps(dict(config), sort_keys=True)
        with self._write() as con:
            self._x(
                con,
                "INSERT INTO jobs (job, config, created_s) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (job, text, self._clock.now()),
            )
            stored = self._config(con, job)
        if stored is not None and stored != json.loads(text):
            diff = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
            raise ConfigError(
                f"{self._name}: job {job!r} is stored with different {', '.join(diff)} "
                f"({ {k: stored.get(k) for k in diff} }); use a new job name or database"
            )

    def begin_run(self, job: str, decide: Decide) -> StartedRun:
        run_id = uuid.uuid4().hex
        me = this_process()
        lease = (me.pid, _host(), me.start)
        with self._write() as con:
            self._lock_job(con, job)
            now = self._clock.now()
            self._expire(con, job, now)
            # One statement, one snapshot: a run finishing meanwhile is pending or in history.
            rows = self._rows(con, job)
            pending = [int(r["batch_size"]) for r in rows if r["status"] == "running"]
            decision = decide(self._history(con, job, rows), pending)
            self._x(
                con,
                "INSERT INTO runs (run_id, job, status, phase, batch_size, started_s, pid, host, "
                "process_start, heartbeat_s) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (run_id, job, decision.phase, decision.batch_size, now, *lease, now),
            )
        return StartedRun(run_id, decision)

    def _update(self, sql: str, params: Sequence[Any]) -> bool:
        """One statement in its own transaction; whether it changed a row."""
        with self._write() as con:
            return int(self._x(con, sql, params).rowcount) == 1

    def heartbeat(self, run_id: str, so_far: Observation) -> bool:
        figures = _figures(self._name, run_id, so_far)
        return self._update(
            "UPDATE runs SET heartbeat_s = ?, power_limit_w = ?, energy_j = ?, time_s = ?, "
            "cost = ?, epochs = ? WHERE run_id = ? AND status = 'running'",
            (self._clock.now(), *figures, so_far.epochs, run_id),
        )

    def finish_run(self, run_id: str, observation: Observation) -> bool:
        """Record ``run_id``'s result once; a run abandoned by a SIGTERM it survived or by an
        expired lease is finished all the same (its process is alive and has the figures)."""
        o = observation
        figures = _figures(self._name, run_id, o)
        return self._update(
            "UPDATE runs SET status = 'done', end_reason = NULL, batch_size = ?, "
            "power_limit_w = ?, energy_j = ?, time_s = ?, cost = ?, reached = ?, epochs = ?, "
            "finished_s = ? WHERE run_id = ? AND (status = 'running' OR (status = "
            "'abandoned' AND end_reason IN ('signal', 'lease expired')))",
            (o.batch_size, *figures, int(o.reached), o.epochs, self._clock.now(), run_id),
        )

    def abandon_run(self, run_id: str, reason: str = "exception", *, urgent: bool = False) -> None:
        """Mark ``run_id`` abandoned; ``urgent``: never this store's lock (the interrupted
        code may hold it) and no exception (the next decision finds the process gone)."""
        if reason not in ABANDON_REASONS:
            raise ConfigError(f"abandon reason {reason!r} is not one of {ABANDON_REASONS}")
        sql, params = _ABANDON.format("run_id"), (reason, self._clock.now(), run_id)
        if not urgent:
            self._update(sql, params)
            return
        try:
            self._abandon_urgently(sql, params)
        except Exception as e:  # a signal handler must not raise
            log.warning("%s: could not mark run %s abandoned (%s)", self._name, run_id, e)

    def history(self, job: str) -> list[Observation]:
        with self._read() as con:
            return self._history(con, job, self._rows(con, job))

    def runs(self, job: str) -> list[dict[str, Any]]:
        """Every run row of ``job`` (any status), oldest first, as dicts (for reports)."""
        with self._read() as con:
            return self._rows(con, job)

    def cached_power_limit_w(
        self, job: str, gpu: str, batch_size: int, *, range_w: Sequence[float] | None = None
    ) -> float | None:
        with self._read() as con:
            row = self._x(con, _CACHED_LIMIT, (job, gpu, batch_size)).fetchone()
        if row is None:
            return None
        return check_power_limit_row(self._name, (job, gpu, batch_size, *row), range_w)

    def save_power_limit_w(
        self, job: str, gpu: str, batch_size: int, power_limit_w: float, profile: Mapping[str, Any]
    ) -> float:
        if not (math.isfinite(power_limit_w) and power_limit_w > 0):
            raise ConfigError(f"power limit {power_limit_w!r} W is not a finite number > 0")
        text = json.dumps(dict(profile), sort_keys=True)
        with self._write() as con:
            self._x(
                con,
                "INSERT INTO power_limits (job, gpu, batch_size, power_limit_w, profile) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (job, gpu, batch_size, float(power_limit_w), text),
            )
            row = self._x(con, _CACHED_LIMIT, (job, gpu, batch_size)).fetchone()
        return check_power_limit_row(self._name, (job, gpu, batch_size, *row))


class SQLiteStore(SQLStore):
    """:class:`RecurringStore` in one SQLite file, safe for concurrent processes on one host
    (a local file system, not NFS); opened (and migrated) on first use and after ``fork``.

    Args:
        path: Database file (``~`` expanded), a regular file of this user in a directory
            nobody else controls (created if missing).
        options: ``busy_timeout_s``, ``lease_s``, ``clock``, as for :class:`SQLStore`.
    """

    def __init__(self, path: str | Path, **options: Any) -> None:
        self.path = Path(path).expanduser()
        super().__init__(str(self.path), **options)

    def _open(self, timeout_s: float) -> sqlite3.Connection:
        # SQLite opens the file and its siblings itself, following links and waiting on FIFOs:
        # the directory must be private and what is there already our own regular files.
        check_private_file(
            self.path, what="recurring store", siblings=_SQLITE_SIBLINGS, shared_dir_ok=False
        )
        # SQLite takes a file shorter than its header for a new database and writes over it;
        # no database is under one 512-byte page. By stat, not open: closing a descriptor of
        # the file would drop the locks this process's SQLite connections hold on it.
        with contextlib.suppress(FileNotFoundError):
            if 0 < os.stat(self.path).st_size < 512:
                raise sqlite3.DatabaseError("file is not a database")
        con = sqlite3.connect(
            self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
        con.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        return con

    def _connect(self) -> sqlite3.Connection:
        with self._errors():
            con = self._open(self.busy_timeout_s)
            try:
                # SQLite answers "locked" at once, not after its busy timeout, while another
                # process switches the same new file to WAL: try again for that long.
                retry(
                    lambda: con.execute("PRAGMA journal_mode = WAL"),
                    transient=lambda e: (
                        isinstance(e, sqlite3.OperationalError) and "locked" in str(e)
                    ),
                    backoff_s=[0.01] * int(self.busy_timeout_s / 0.01),
                )
                con.execute("PRAGMA synchronous = NORMAL")
                self._migrate(con)
                con.execute("PRAGMA foreign_keys = ON")
            except BaseException:  # a refused schema: not one open file per try
                con.close()
                raise
        return con

    def _migrate(self, con: sqlite3.Connection) -> None:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise too_new(str(self.path), version, SCHEMA_VERSION)
        if version == SCHEMA_VERSION:
            return
        con.execute("PRAGMA foreign_keys = OFF")  # tables are rebuilt: see schema.migrate
        with self._transaction(con):
            # Another process may have migrated while this one waited for the write lock.
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                log.info(
                    "%s: migrating the store from schema %d to %d",
                    self.path,
                    version,
                    SCHEMA_VERSION,
                )
                migrate(con, str(self.path), version)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors as perseus's: busy -> PerseusError, damage -> ConfigError."""
        try:
            yield
        except sqlite3.OperationalError as e:
            text = str(e)
            if "locked" in text or "busy" in text:
                raise self._busy(f" ({text})") from e
            # SQLITE_FULL (13), SQLITE_IOERR (10): the disk, not the database; the transaction
            # rolled back. Python 3.10 has no error code on the exception: its message then.
            code = getattr(e, "sqlite_errorcode", None)
            disk = (
                (code & 0xFF) in (13, 10)
                if code is not None
                else "disk is full" in text or "disk I/O error" in text
            )
            if disk:
                raise PerseusError(
                    f"{self.path}: cannot write the database ({text}): the disk is full, over "
                    "quota or failing; free space and try again (the database is not damaged)"
                ) from e
            raise self._damaged(e) from e
        except sqlite3.IntegrityError as e:
            raise self._refused(e) from e
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from e

    def _damaged(self, e: sqlite3.Error) -> ConfigError:
        return ConfigError(
            f"{self.path}: not a usable SQLite database ({e}); restore it from a backup, "
            f"recover what is left (sqlite3 {self.path} .recover | sqlite3 new.db), or pass "
            "another --db path"
        )

    @contextlib.contextmanager
    def _transaction(self, con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            if con.in_transaction:  # a SIGTERM's abandon may have committed it (abandon_run)
                con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    def _abandon_urgently(self, sql: str, params: tuple[Any, ...]) -> None:
        """From a signal handler: end this process's own open transaction (which cannot finish
        while the handler runs) with the abandon, else write on a fresh connection."""
        deadline = REAL_CLOCK.now() + _URGENT_TIMEOUT_S  # another process's lock: real time
        while True:
            own = self._con if self._pid == os.getpid() else None
            if own is not None and own.in_transaction:
                own.execute(sql, params)
                if own.in_transaction:
                    own.execute("COMMIT")
                return
            con = self._open(0.05)
            try:
                con.execute(sql, params)
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or REAL_CLOCK.now() > deadline:
                    raise
            finally:
                con.close()


def _figures(source: str, run_id: str, o: Observation) -> tuple[float | None, ...]:
    """The observation's limit, energy, time and cost for the row, each finite and >= 0."""
    for name in ("energy_j", "time_s", "cost"):
        if not is_figure(value := getattr(o, name)):
            raise ConfigError(
                f"{source}: run {run_id}: {name} {value!r} is not a finite number >= 0; not "
                "recorded (a GPU energy counter that was reset mid-run gives this)"
            )
    limit = None if math.isnan(o.power_limit_w) else float(o.power_limit_w)
    return limit, float(o.energy_j), float(o.time_s), float(o.cost)
