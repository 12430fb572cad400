"""The recurring-job store on both engines: the same tests on SQLite and on a real PostgreSQL."""

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
from perseus.recurring.store import RecurringStore, SQLiteStore

REPO = Path(__file__).resolve().parents[2]
SIZES = [8, 16, 32, 64, 128]


def _obs(size: int, cost: float = 100.0) -> Observation:
    return Observation(size, 150.0, cost, 1.0, cost, True)


def test_finish_is_exactly_once_and_abandoned_runs_do_not_count(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(store_url)
    assert isinstance(store, RecurringStore)
    request.addfinalizer(store.close)
    store.register_job("j", {"batch_sizes": SIZES})
    store.register_job("j", {"batch_sizes": SIZES})  # the same config again: fine
    with pytest.raises(ConfigError, match="batch_sizes"):
        store.register_job("j", {"batch_sizes": [8]})
    first = store.begin_run("j", lambda h, p: _decision(32))
    second = store.begin_run("j", lambda h, p: _decision(64, pending=p))
    assert store.finish_run(first.run_id, _obs(32)) is True
    assert store.finish_run(first.run_id, _obs(32)) is False  # never twice
    store.abandon_run(second.run_id, "exception")
    assert store.finish_run(second.run_id, _obs(64)) is False
    history = store.history("j")
    assert [(o.batch_size, o.cost) for o in history] == [(32, 100.0)]
    assert [r["status"] for r in store.runs("j")] == ["done", "abandoned"]


def _decision(size: int, pending: object = None):  # type: ignore[no-untyped-def]
    from perseus.recurring.policy import Decision

    if pending is not None:
        assert pending == [32]  # the first run is pending while the second is decided
    return Decision(size, "explore", None)


def test_power_limit_cache_first_writer_wins_and_checks_refuse_bad_rows(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(store_url)
    request.addfinalizer(store.close)
    store.register_job("j", {"batch_sizes": SIZES})
    assert store.cached_power_limit_w("j", "A40", 64) is None
    assert store.save_power_limit_w("j", "A40", 64, 175.0, {"175.0": 1}) == 175.0
    with open_store(store_url) as other:
        assert other.save_power_limit_w("j", "A40", 64, 200.0, {}) == 175.0
    assert store.cached_power_limit_w("j", "A40", 64) == 175.0
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


_WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from perseus.recurring.database import open_store
    from perseus.recurring.policy import BatchSizeOptimizer, Observation
    url, tag, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(url, busy_timeout_s=60)
    store.register_job("j", {"batch_sizes": [8, 16, 32, 64, 128]})
    policy = BatchSizeOptimizer([8, 16, 32, 64, 128], 64)
    rng = np.random.default_rng(int(tag))
    for i in range(runs):
        started = store.begin_run("j", lambda h, p: policy.decide(h, rng, pending=p))
        b = started.decision.batch_size
        cost = 100.0 + abs(b - 32)
        ok = store.finish_run(started.run_id, Observation(b, 150.0, cost, 1.0, cost, True))
        again = store.finish_run(started.run_id, Observation(b, 150.0, cost, 1.0, cost, True))
        assert ok and not again
        print(started.run_id, flush=True)
    """
)


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_concurrent_writers_lose_and_double_nothing(store_url: str) -> None:
    writers, runs = 4, 12
    procs = [_spawn(_WORKER, store_url, str(k), str(runs)) for k in range(writers)]
    ids: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        ids.extend(out.split())
    assert len(ids) == writers * runs == len(set(ids))
    with open_store(store_url) as store:
        rows = store.runs("j")
        history = store.history("j")
    assert sorted(r["run_id"] for r in rows) == sorted(ids)
    assert all(r["status"] == "done" for r in rows)
    assert len(history) == writers * runs
    explore = [r for r in rows if r["phase"] == "explore"]
    assert len({r["batch_size"] for r in explore}) == len(explore)  # pending counts as tried


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


def test_a_lease_expires_on_both_engines(store_url: str, request: pytest.FixtureRequest) -> None:
    now = [1000.0]
    store = open_store(store_url, lease_s=60.0, clock=lambda: now[0])
    request.addfinalizer(store.close)
    store.register_job("j", {"batch_sizes": SIZES})
    run = store.begin_run("j", lambda h, p: _decision(64))
    assert store.heartbeat(run.run_id, Observation(64, 150.0, 5.0, 1.0, 5.0, False))
    now[0] += 61.0
    later = open_store(store_url, lease_s=60.0, clock=lambda: now[0])
    request.addfinalizer(later.close)
    seen: list[list[int]] = []
    later.begin_run("j", lambda h, p: seen.append(p) or _decision(32))  # type: ignore[func-returns-value]
    assert seen == [[]]
    row = next(r for r in later.runs("j") if r["run_id"] == run.run_id)
    # the holder (this process) is alive, so only the lease can have ended it
    assert (row["status"], row["end_reason"]) == ("abandoned", "lease expired")


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
