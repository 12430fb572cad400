"""The recurring store on PostgreSQL (psycopg 3): the same tables and rows as SQLite's.

What differs from SQLite: the schema in PostgreSQL's types, the version in table
``perseus_schema``, ``SELECT ... FOR UPDATE`` on the job's row, and psycopg's errors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from perseus.errors import ConfigError, PerseusError
from perseus.recurring.schema import (
    ABANDON_REASONS,
    POSTGRES,
    jobs_table,
    power_limits_table,
    runs_table,
    too_new,
)
from perseus.recurring.store import SQLStore
from perseus.validate import show_value

__all__ = ["POSTGRES_MIGRATIONS", "PostgresStore", "connect"]

_PG_V2 = f"""
{jobs_table(POSTGRES)}
{runs_table(POSTGRES, "runs", ABANDON_REASONS[:5])}
CREATE INDEX runs_by_job ON runs (job, status, seq);
{power_limits_table(POSTGRES)}
CREATE FUNCTION perseus_size_in_job() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE sizes jsonb;
BEGIN
    SELECT config::jsonb -> 'batch_sizes' INTO sizes FROM jobs WHERE job = NEW.job;
    IF jsonb_typeof(sizes) = 'array' AND NOT sizes @> to_jsonb(NEW.batch_size) THEN
        RAISE EXCEPTION '%.batch_size is not one of the job''s batch_sizes', TG_TABLE_NAME
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_size_in_job BEFORE INSERT OR UPDATE OF batch_size, job ON runs
    FOR EACH ROW EXECUTE FUNCTION perseus_size_in_job();
CREATE TRIGGER power_limits_size_in_job BEFORE INSERT OR UPDATE OF batch_size, job
    ON power_limits FOR EACH ROW EXECUTE FUNCTION perseus_size_in_job();
"""

# v3: a finished run is measured (energy, time and cost > 0); a cached power profile is too.
_PG_V3 = """
ALTER TABLE runs DROP CONSTRAINT end_reason_known;
UPDATE runs SET status = 'abandoned', end_reason = 'unmeasured'
    WHERE status = 'done' AND NOT (energy_j > 0 AND time_s > 0 AND cost > 0);
ALTER TABLE runs ADD CONSTRAINT end_reason_known CHECK (end_reason IS NULL OR end_reason IN
    ('exception', 'not started', 'signal', 'process gone', 'lease expired', 'unmeasured'));
ALTER TABLE runs ADD CONSTRAINT done_measured
    CHECK (status <> 'done' OR (energy_j > 0 AND time_s > 0 AND cost > 0));
CREATE FUNCTION perseus_profile_unmeasured(profile TEXT) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (SELECT 1 FROM jsonb_each(profile::jsonb) AS m
        WHERE jsonb_typeof(m.value) = 'object' AND NOT (
            coalesce((m.value ->> 'avg_power_w')::float8, 1) > 0
            AND coalesce((m.value ->> 'samples_per_s')::float8, 1) > 0)) $$;
DELETE FROM power_limits WHERE perseus_profile_unmeasured(profile);
ALTER TABLE power_limits ADD CONSTRAINT profile_measured CHECK (NOT perseus_profile_unmeasured(profile));
"""
#: ``(version, sql)`` steps, numbered as SQLite's (:data:`~perseus.recurring.schema.MIGRATIONS`).
POSTGRES_MIGRATIONS: tuple[tuple[int, str], ...] = ((2, _PG_V2), (3, _PG_V3))
#: Any constant: the advisory lock that serialises migrations across processes.
_MIGRATION_LOCK = 0x7065727365757301
#: How long a signal handler waits for the server (connecting, the row).
_URGENT_S = 5.0


def connect(conninfo: str, *, timeout_s: float, lock_timeout_s: float) -> Any:
    """An autocommit psycopg connection (password from libpq's environment, never the URL).

    Raises:
        ConfigError: psycopg is not installed (``pip install 'perseus-energy[postgres]'``).
        PerseusError: the server cannot be reached or refused the login.
    """
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        conninfo_to_dict(conninfo)
    except ImportError as e:  # matched first: psycopg is then never looked up below
        raise ConfigError(
            "a postgresql:// store needs psycopg: pip install 'perseus-energy[postgres]'"
        ) from e
    except (psycopg.ProgrammingError, ValueError) as e:  # %ff, %00, ?unknown=...
        raise ConfigError(
            f"`db` {_shown(conninfo)}: not a PostgreSQL URL ({_first_line(e)}); pass "
            "postgresql://USER@HOST[:PORT]/DB"
        ) from None
    try:
        con = psycopg.connect(
            conninfo,
            autocommit=True,
            connect_timeout=max(1, round(timeout_s)),
            options=f"-c lock_timeout={int(lock_timeout_s * 1000)}",
        )
    except psycopg.OperationalError as e:
        raise PerseusError(f"{_shown(conninfo)}: cannot connect ({_first_line(e)})") from None
    return con


def _shown(conninfo: str) -> str:
    """The URL for messages (parse_url refused passwords; a query may still name one)."""
    return conninfo.split("?", 1)[0]


class PostgresStore(SQLStore):
    """:class:`~perseus.recurring.store.RecurringStore` on a PostgreSQL server; connected
    (and the schema created or migrated) on first use, and again after ``fork``.

    Args:
        conninfo: A ``postgresql://user@host[:port]/db`` URL (no password).
        connect_timeout_s: How long connecting to the server may take (whole seconds, at
            least 1).
        options: ``busy_timeout_s`` (PostgreSQL's ``lock_timeout``), ``lease_s``, ``clock``, as
            for :class:`~perseus.recurring.store.SQLStore`.
    """

    _param = "%s"

    def __init__(self, conninfo: str, *, connect_timeout_s: float = 10.0, **options: Any) -> None:
        super().__init__(_shown(conninfo), **options)
        self.conninfo = conninfo
        self.connect_timeout_s = connect_timeout_s

    def _connect(self) -> Any:
        con = connect(
            self.conninfo, timeout_s=self.connect_timeout_s, lock_timeout_s=self.busy_timeout_s
        )
        try:
            self._migrate(con)
        except BaseException:
            con.close()
            raise
        return con

    def _migrate(self, con: Any) -> None:
        with self._transaction(con):
            con.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            # CREATE ... IF NOT EXISTS needs CREATE on the schema even where the table is there:
            # a role granted only SELECT, INSERT, UPDATE and DELETE (docs/fleet.md) looks first.
            if con.execute("SELECT to_regclass('perseus_schema')").fetchone()[0] is None:
                con.execute("CREATE TABLE IF NOT EXISTS perseus_schema (version INTEGER NOT NULL)")
            row = con.execute("SELECT version FROM perseus_schema").fetchone()
            version = 0 if row is None else row[0]
            if type(version) is not int:  # a table of that name perseus did not create
                raise ConfigError(
                    f"{self._name}: perseus_schema holds version {show_value(version)}, not a "
                    "perseus schema version; pass a database of perseus's own"
                )
            latest = POSTGRES_MIGRATIONS[-1][0]
            if version > latest:
                raise too_new(self._name, version, latest)
            for step, sql in POSTGRES_MIGRATIONS:
                if step > version:
                    con.execute(sql)
            if row is None:
                con.execute("INSERT INTO perseus_schema (version) VALUES (%s)", (latest,))
            elif version < latest:
                con.execute("UPDATE perseus_schema SET version = %s", (latest,))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """psycopg's errors as perseus's (a refused value: ConfigError; the rest PerseusError,
        and the connection is reopened on next use)."""
        import psycopg

        try:
            yield
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as e:
            raise self._refused(_first_line(e)) from e
        except (
            psycopg.errors.UndefinedColumn,
            psycopg.errors.UndefinedTable,
            psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject,
            psycopg.errors.DuplicateFunction,
            psycopg.errors.WrongObjectType,
        ) as e:  # a table of the same name, not perseus's
            raise ConfigError(
                f"{self._name}: {_first_line(e)}; its tables are not perseus's (another "
                "program's, or altered by hand): pass a database of perseus's own"
            ) from e
        except psycopg.errors.InsufficientPrivilege as e:
            raise ConfigError(
                f"{self._name}: {_first_line(e)}; grant the URL's role what docs/fleet.md lists "
                "(CREATE on the schema for the first run, then SELECT, INSERT, UPDATE, DELETE "
                "on perseus's tables), or pass another role"
            ) from e
        except psycopg.errors.LockNotAvailable as e:
            raise self._busy() from e
        except psycopg.Error as e:
            self.close()
            raise PerseusError(f"{self._name}: {_first_line(e)}") from e

    @contextlib.contextmanager
    def _transaction(self, con: Any) -> Iterator[Any]:
        con.execute("BEGIN")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            try:
                if not con.closed:
                    con.execute("ROLLBACK")
            except Exception:  # the connection is gone (a signal handler ended its server
                self.close()  # process): the original error is the one to raise
            raise

    def _lock_job(self, con: Any, job: str) -> None:
        con.execute("SELECT 1 FROM jobs WHERE job = %s FOR UPDATE", (job,))

    def _abandon_urgently(self, sql: str, params: tuple[Any, ...]) -> None:
        """From a signal handler, on a fresh connection; a transaction of this process that
        the signal interrupted (holding the run's row) has its server process ended first."""
        con = connect(self.conninfo, timeout_s=_URGENT_S, lock_timeout_s=_URGENT_S)
        try:
            own = self._con
            if own is not None and self._pid == os.getpid() and not own.closed:
                import psycopg.pq

                if own.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    con.execute(
                        "SELECT pg_terminate_backend(%s, %s)",
                        (own.info.backend_pid, int(_URGENT_S * 1000)),
                    )
            self._x(con, sql, params)
        finally:
            con.close()


def _first_line(e: BaseException) -> str:
    return str(e).strip().partition("\n")[0] or type(e).__name__
