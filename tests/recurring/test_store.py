"""The recurring-job store on both engines (a SQLite file, a real PostgreSQL database):
exactly-once observations, pending runs, two processes on one store."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.recurring.database import open_store, parse_url
from perseus.recurring.policy import BatchSizeOptimizer, Observation
from perseus.recurring.store import RecurringStore, SQLiteStore

REPO = Path(__file__).resolve().parents[2]
SIZES = [8, 16, 32, 64, 128]


def _decide(policy: BatchSizeOptimizer):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    return lambda history, pending: policy.decide(history, rng, pending=pending)


def test_finish_is_exactly_once_and_abandoned_runs_do_not_count(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(store_url)
    request.addfinalizer(store.close)
    assert isinstance(store, RecurringStore)
    store.register_job("j", {"batch_sizes": SIZES})
    policy = BatchSizeOptimizer(SIZES, 64)
    a = store.begin_run("j", _decide(policy))
    b = store.begin_run("j", _decide(policy))
    assert (a.decision.batch_size, b.decision.batch_size) == (64, 64)  # nothing finished yet
    o = Observation(64, 200.0, 10.0, 1.0, 12.0, True)
    assert store.finish_run(a.run_id, o) is True
    assert store.finish_run(a.run_id, o) is False  # a retry does not double it
    store.abandon_run(b.run_id)
    assert store.finish_run(b.run_id, o) is False
    assert store.history("j") == [o]
    e = store.begin_run("j", _decide(policy))
    store.finish_run(e.run_id, Observation(32, float("nan"), 1.0, 1.0, 1.0, True))
    assert math.isnan(store.history("j")[-1].power_limit_w)  # no limit known: NaN round-trips
    c = store.begin_run("j", _decide(policy))
    d = store.begin_run("j", _decide(policy))
    # A started run is pending: the next one explores another size.
    assert c.decision.batch_size != d.decision.batch_size


def test_job_config_mismatch(store_url: str, request: pytest.FixtureRequest) -> None:
    store = open_store(store_url)
    request.addfinalizer(store.close)
    store.register_job("j", {"eta": 0.5})
    store.register_job("j", {"eta": 0.5})
    with pytest.raises(ConfigError, match="different eta"):
        store.register_job("j", {"eta": 0.9})


def test_a_file_that_is_no_database_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(ConfigError, match="not a usable SQLite database"):
        SQLiteStore(bad).history("j")


def test_power_limit_cache_first_writer_wins(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(store_url)
    request.addfinalizer(store.close)
    assert store.cached_power_limit_w("j", "A40", 64) is None
    assert store.save_power_limit_w("j", "A40", 64, 175.0, {"175.0": 1}) == 175.0
    with open_store(store_url) as other:
        assert other.save_power_limit_w("j", "A40", 64, 200.0, {}) == 175.0
    assert store.cached_power_limit_w("j", "A40", 64) == 175.0
    assert store.cached_power_limit_w("j", "V100", 64) is None


_WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from perseus.recurring.policy import BatchSizeOptimizer, Observation
    from perseus.recurring.database import open_store
    url, tag, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(url, busy_timeout_s=60)
    store.register_job("j", {"batch_sizes": [8, 16, 32, 64, 128]})
    policy = BatchSizeOptimizer([8, 16, 32, 64, 128], 64)
    rng = np.random.default_rng(int(tag))
    for i in range(runs):
        started = store.begin_run(
            "j", lambda h, p: policy.decide(h, rng, pending=p))
        b = started.decision.batch_size
        cost = 100.0 + abs(b - 32)
        ok = store.finish_run(started.run_id, Observation(b, 150.0, cost, 1.0, cost, True))
        again = store.finish_run(started.run_id, Observation(b, 150.0, cost, 1.0, cost, True))
        assert ok and not again
        print(started.run_id, flush=True)
    """
)


def test_a_wal_switch_refused_at_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes opening one new store: SQLite answers the second's WAL switch "locked" at
    # once, without waiting its busy timeout (1 in 12-24 runs of the test below failed so).
    import sqlite3

    class Refusing:
        def __init__(self, con: sqlite3.Connection) -> None:
            self.con, self.refusals = con, 2

        def execute(self, sql: str, *args: object) -> object:
            if sql.startswith("PRAGMA journal_mode") and self.refusals:
                self.refusals -= 1
                raise sqlite3.OperationalError("database is locked")
            return self.con.execute(sql, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(self.con, name)

    opened = SQLiteStore._open
    monkeypatch.setattr(SQLiteStore, "_open", lambda self, t: Refusing(opened(self, t)))
    store = SQLiteStore(tmp_path / "new.sqlite")
    store.register_job("j", {"eta": 0.5})
    assert store.history("j") == []
    store.close()


def test_two_processes_on_one_store_lose_and_double_nothing(store_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, store_url, str(k), str(runs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for k in (1, 2)
    ]
    ids: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        ids.extend(out.split())
    assert len(ids) == 2 * runs == len(set(ids))
    with open_store(store_url) as store:
        rows = store.runs("j")
        history = store.history("j")
    assert sorted(r["run_id"] for r in rows) == sorted(ids)
    assert all(r["status"] == "done" for r in rows)
    assert len(history) == 2 * runs
    # Exploration never ran one batch size twice (a pending run counts as tried).
    explore = [r for r in rows if r["phase"] == "explore"]
    assert len({r["batch_size"] for r in explore}) == len(explore)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql://fleet@db.example/perseus", "'mysql://db.example/perseus'"),
        ("MySQL://fleet:secret@db.example:3306/p", "'MySQL://db.example:3306/p'"),
        ("redis://cache", "'redis://cache'"),
        # Never a password: in the query, or with a '/' that urllib would take for the path.
        ("mysql://fleet@db.example/p?password=secret", "'mysql://db.example/p'"),
        ("mysql://fleet:se/cret@db.example/p#x", "'mysql://db.example/p'"),
    ],
)
def test_an_unknown_database_url_is_named_as_written(
    url: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL is quoted whole (no repr of its scheme inside it: "'mysql'://"), without its
    user or password, with the forms the store takes; the CLI says it with its flag."""
    from perseus.cli.main import main

    said = f"{shown} is not a database this store speaks; pass sqlite:///FILE or "
    said += "postgresql://USER@HOST[:PORT]/DB"
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert str(info.value) == f"`db` {said}"
    assert main(["fleet", "status", "--db", url]) == 2
    assert capsys.readouterr().err == f"error: --db {said}\n"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://[x/db",
        "postgres://fleet@[::1/perseus",
        "postgresql://fleet@db:99999/perseus",  # these three were "cannot connect", exit 1
        "postgresql://fleet@db:port/perseus",
        "postgresql://fleet@db/perseus\n",  # and this one a message of two lines
    ],
)
def test_a_malformed_postgres_url_is_a_config_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """urllib's ValueError (a bracket not closed) was an internal error."""
    from perseus.cli.main import main

    with pytest.raises(ConfigError, match=r"^`db`: not a PostgreSQL URL \("):
        open_store(url)
    assert main(["fleet", "status", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --db: not a PostgreSQL URL (") and err.count("\n") == 1


def test_a_postgres_password_in_the_query_is_refused_as_in_the_user_part() -> None:
    """libpq takes ``?password=`` as it takes ``user:password@``: both show up in ps."""
    for url in (
        "postgresql://fleet:secret@db/p",
        "postgres://fleet@db/p?sslmode=require&password=s",
    ):
        with pytest.raises(ConfigError, match=r"^`db`: the URL carries a password; .*PGPASSWORD"):
            open_store(url)
    assert parse_url("postgresql://fleet@db/p?sslmode=require").conninfo.endswith("=require")
