"""The recurring-job store on both engines: what tests/recurring does not already run on both
(schema checks, a writer killed inside a transaction, URLs, roles)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perseus.errors import ConfigError
from perseus.recurring.database import open_store, parse_url
from perseus.recurring.policy import Observation
from perseus.recurring.store import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
SIZES = [8, 16, 32, 64, 128]


def _obs(size: int, cost: float = 100.0) -> Observation:
    return Observation(size, 150.0, cost, 1.0, cost, True)


def test_the_checks_refuse_bad_rows(store_url: str, request: pytest.FixtureRequest) -> None:
    store = open_store(store_url)
    request.addfinalizer(store.close)
    store.register_job("j", {"batch_sizes": SIZES})
    # The schema refuses what the store never writes: the same constraints on both engines.
    bad_rows = [
        ("INSERT INTO power_limits VALUES ('j', 'A40', 7, 100.0, '{}')", "batch_sizes"),
        ("INSERT INTO power_limits VALUES ('j', 'V100', 8, -1.0, '{}')", "cached_power_limit"),
        ("INSERT INTO jobs VALUES ('k', '[1]', 0.0)", "config_object"),
        (
            "INSERT INTO runs (run_id, job, status, phase, batch_size, energy_j, started_s) "
            "VALUES ('r', 'j', 'running', 'explore', 8, -5.0, 0.0)",
            "energy_finite",
        ),
        (
            "INSERT INTO runs (run_id, job, status, phase, batch_size, started_s) "
            "VALUES ('r', 'j', 'done', 'explore', 8, 0.0)",
            "done_has_figures",
        ),
    ]
    for sql, constraint in bad_rows:
        with pytest.raises(ConfigError, match=constraint), store._write() as con:
            store._x(con, sql)
    assert [r["run_id"] for r in store.runs("j")] == []


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from perseus.recurring.database import open_store
    from perseus.recurring.policy import Decision
    store = open_store(sys.argv[1])
    store.register_job("j", {"batch_sizes": [8, 16, 32, 64, 128]})
    run = store.begin_run("j", lambda h, p: Decision(64, "default", None))
    with store._write() as con:  # killed inside a write transaction
        store._x(con, "UPDATE runs SET energy_j = 1.0, time_s = 1.0, cost = 1.0 WHERE run_id = ?",
                 (run.run_id,))
        print(run.run_id, flush=True)
        time.sleep(600)
    """
)


def test_sigkill_mid_transaction_leaves_the_store_consistent(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    proc = _spawn(_HOLDER, store_url)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.communicate(timeout=30)[1]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    store = open_store(store_url, busy_timeout_s=30)
    request.addfinalizer(store.close)
    # The killed transaction rolled back whole: its figures are not there.
    (row,) = store.runs("j")
    assert (row["run_id"], row["status"], row["cost"]) == (run_id, "running", None)
    # The next decision finds the holder gone and goes on; its run counts once, as failed.
    started = store.begin_run("j", lambda h, p: _decision_after(h, p))
    assert store.finish_run(started.run_id, _obs(32)) is True
    rows = {r["run_id"]: r for r in store.runs("j")}
    assert (rows[run_id]["status"], rows[run_id]["end_reason"]) == ("abandoned", "process gone")
    assert [(o.batch_size, o.reached) for o in store.history("j")] == [(64, False), (32, True)]


def _decision_after(history, pending):  # type: ignore[no-untyped-def]
    from perseus.recurring.policy import Decision

    assert pending == [] and [o.batch_size for o in history] == [64]
    return Decision(32, "explore", None)


def test_urls_select_the_engine_and_never_carry_a_password(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    assert isinstance(store, SQLiteStore) and store.path == tmp_path / "a.sqlite"
    assert parse_url("sqlite:///jobs.sqlite").path == "jobs.sqlite"
    assert parse_url(str(tmp_path / "b.db")).engine == "sqlite"
    assert parse_url("postgresql://fleet@db.example:5433/perseus").engine == "postgresql"
    with pytest.raises(ConfigError, match="PGPASSWORD"):
        parse_url("postgresql://fleet:secret@db.example/perseus")
    with pytest.raises(ConfigError, match="not a database"):
        parse_url("mysql://fleet@db.example/perseus")


def test_a_role_needs_what_the_database_must_allow(postgres_url: str) -> None:
    """The role in the URL creates the schema on first use (CREATE on the schema), or gets a
    one-line refusal; a server that cannot be reached is one line too."""
    import psycopg

    from perseus.errors import PerseusError

    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("DROP ROLE IF EXISTS fleet_role")
        con.execute("CREATE ROLE fleet_role LOGIN")
    url = postgres_url.replace("perseus@", "fleet_role@")
    with pytest.raises(PerseusError, match="permission denied for schema public"):
        open_store(url, connect_timeout_s=5).history("j")
    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("GRANT CREATE ON SCHEMA public TO fleet_role")
    with open_store(url, connect_timeout_s=5) as store, store._read() as con:
        assert store._x(con, "SELECT current_user").fetchone()[0] == "fleet_role"
        assert store.history("j") == []
    closed = url.rsplit(":", 1)[0] + ":1/postgres"  # nothing listens on port 1
    with pytest.raises(PerseusError, match="cannot connect"):
        open_store(closed, connect_timeout_s=1).history("j")


def test_a_role_with_only_the_documented_grants_uses_the_store_and_the_fleet(
    postgres_url: str,
) -> None:
    """docs/fleet.md: after a first run by the owner, a role needs SELECT, INSERT, UPDATE and
    DELETE on the tables, no CREATE on the schema: every CREATE ... IF NOT EXISTS of the store
    and the fleet needed it, even where the table was there."""
    import psycopg

    from perseus.device.clock import VirtualClock
    from perseus.fleet.registry import FleetRegistry
    from perseus.recurring.policy import Decision
    from perseus.solver.fleet import FleetJob

    with FleetRegistry(postgres_url) as fleet:  # the owner's first run creates the tables
        fleet.status()
    tables = "jobs, runs, power_limits, perseus_schema, fleet_state, fleet_members, fleet_log"
    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("DROP INDEX IF EXISTS fleet_members_by_status")  # a fleet from before
        con.execute("DROP ROLE IF EXISTS dml_role")
        con.execute("CREATE ROLE dml_role LOGIN")
        con.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO dml_role")
    url = postgres_url.replace("perseus@", "dml_role@")
    with open_store(url, connect_timeout_s=5) as store:
        store.register_job("j", {"batch_sizes": [32]})
        run = store.begin_run("j", lambda h, p: Decision(32, "default", None))
        assert store.finish_run(run.run_id, Observation(32, 150.0, 1.0, 1.0, 1.0, True))
        assert len(store.history("j")) == 1
    job = FleetJob("a", 1.0, (0, 1), (1.0, 2.0), (200.0, 100.0), (250.0, 120.0))
    with FleetRegistry(url, clock=VirtualClock(10.0)) as fleet:
        fleet.register(job, lease_s=60.0)
        fleet.set_budget(150.0)
        assert fleet.replan() == 1
        assert fleet.assignment("a") is not None


def test_the_planners_poll_reads_the_running_members_by_index(tmp_path: Path) -> None:
    """Finished and expired members stay in fleet_members; the planner's poll (under SQLite's
    write lock, which every member's heartbeat waits for) scanned them all: 112 ms a poll at
    100,000 members that once ran, 1.2 ms by the index (created in a fleet from before too)."""
    import contextlib
    import sqlite3

    from perseus.fleet.registry import _RUNNING, FleetRegistry

    path = tmp_path / "fleet.sqlite"
    with FleetRegistry(f"sqlite:///{path}") as fleet:
        fleet.status()
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.execute("DROP INDEX IF EXISTS fleet_members_by_status")  # a fleet from before
    with FleetRegistry(f"sqlite:///{path}") as fleet:
        fleet.status()
        with fleet.store._read() as con:
            plan = " ".join(str(r[-1]) for r in con.execute("EXPLAIN QUERY PLAN " + _RUNNING))
    assert "USING INDEX fleet_members_by_status" in plan and "SCAN" not in plan, plan


def test_a_poll_that_changes_nothing_parses_no_curve(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner's poll (under the write lock every member's heartbeat waits for) parsed
    every running member's power curve even when nothing changed: 215 ms a poll at 1,000
    members of 100 points, 2.0 s at 1,000 points; 2 ms and 35 ms now. A re-solve reads
    the live members' curves, the expired ones' not."""
    from perseus.device.clock import VirtualClock
    from perseus.fleet import registry
    from perseus.solver.fleet import FleetJob

    parsed: list[str] = []
    parse = registry._job
    monkeypatch.setattr(registry, "_job", lambda *row: parsed.append(row[0]) or parse(*row))
    clock = VirtualClock(1000.0)
    with registry.FleetRegistry(store_url, clock=clock) as fleet:
        for name in ("a", "b", "c"):
            job = FleetJob(name, 1.0, (0, 1), (1.0, 1.1), (100.0, 60.0), (100.0, 60.0))
            fleet.register(job, lease_s=30.0)
        fleet.set_budget(250.0)
        assert fleet.replan() == 1 and parsed == ["a", "b", "c"]
        parsed.clear()
        for _ in range(3):
            assert fleet.replan() is None
        assert parsed == []
        clock.advance(31.0)
        fleet.heartbeat("a")
        fleet.heartbeat("c")
        assert fleet.replan() == 2 and parsed == ["a", "c"]
        assert fleet.assignment("b") is None
        assert [fleet.assignment(n).point for n in "ac"] == [0, 0]  # type: ignore[union-attr]
