"""The store's schema: a version-1 file migrates in place with its history; bad rows are
refused at insert or named with how to repair them; a damaged file is one clear error."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from perseus.device.clock import VirtualClock
from perseus.errors import ConfigError
from perseus.recurring.policy import BatchSizeOptimizer, Observation
from perseus.recurring.schema import SCHEMA_VERSION
from perseus.recurring.store import SQLiteStore

SIZES = [32, 64, 128]

# The store's format as first published (schema version 1), copied here as the fixture of an
# old file: the migration must read it as it is, whatever the code's current DDL says.
V1_DDL = """
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

_CONFIG = json.dumps({"batch_sizes": SIZES, "default_batch_size": 64}, sort_keys=True)
_GOOD_RUNS = [
    # run_id, status, phase, batch_size, limit, energy, time, cost, reached, epochs
    ("r1", "done", "default", 64, 250.0, 1000.0, 10.0, 1100.0, 1, 4),
    ("r2", "done", "explore", 32, None, 1500.0, 20.0, 1700.0, 0, 9),
    ("r3", "abandoned", "explore", 128, None, None, None, None, None, None),
    ("r4", "running", "explore", 128, None, None, None, None, None, None),
]


def _v1_file(
    path: Path,
    runs: list[tuple[object, ...]] = _GOOD_RUNS,
    config: object = _CONFIG,
    limit: object = 175.0,
) -> Path:
    con = sqlite3.connect(path)
    con.executescript(V1_DDL)
    con.execute("INSERT INTO jobs VALUES ('j', ?, 1.0)", (config,))
    for r in runs:
        con.execute(
            "INSERT INTO runs (run_id, job, status, phase, batch_size, power_limit_w, energy_j, "
            "time_s, cost, reached, epochs, started_s) VALUES (?, 'j', ?, ?, ?, ?, ?, ?, ?, ?, ?, 5.0)",
            r,
        )
    con.execute("INSERT INTO power_limits VALUES ('j', 'A40', 64, ?, '{}')", (limit,))
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    return path


def _version(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


def test_a_version_1_store_migrates_in_place_with_its_history(tmp_path: Path) -> None:
    path = _v1_file(tmp_path / "v1.db")
    store = SQLiteStore(path, clock=VirtualClock(10_000.0))
    h = store.history("j")
    assert len(h) == 2  # done runs; the v1 abandoned run (an exception) does not count
    assert h[0] == Observation(64, 250.0, 1000.0, 10.0, 1100.0, True, 4)
    assert (h[1].batch_size, h[1].cost, h[1].reached, h[1].epochs) == (32, 1700.0, False, 9)
    assert math.isnan(h[1].power_limit_w)  # NULL: no limit
    assert _version(path) == SCHEMA_VERSION
    rows = {r["run_id"]: r for r in store.runs("j")}
    assert [r["seq"] for r in store.runs("j")] == [1, 2, 3, 4]
    assert rows["r3"]["end_reason"] == "exception"  # v1 abandoned only on exceptions
    assert store.cached_power_limit_w("j", "A40", 64) == 175.0
    store.register_job("j", json.loads(_CONFIG))  # the same job, its config intact
    # The old "running" row (a run preempted under version 1) has no lease: expired at once,
    # a preempted run of 128 (retried: no evidence about 128), not a size blocked for a week.
    policy = BatchSizeOptimizer(SIZES, 64)
    started = store.begin_run(
        "j", lambda h, p: policy.decide(h, np.random.default_rng(0), pending=p)
    )
    assert {r["run_id"]: r for r in store.runs("j")}["r4"]["end_reason"] == "lease expired"
    assert [(o.batch_size, o.preempted) for o in store.history("j")] == [
        (64, False),
        (32, False),
        (128, True),
    ]
    assert (started.decision.batch_size, started.decision.phase) == (128, "explore")
    # New rows carry the constraints now.
    con = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="cost_finite"):
        con.execute("UPDATE runs SET cost = -1 WHERE run_id = 'r1'")
    con.close()


def _bad(**change: object) -> list[tuple[object, ...]]:
    fields = [
        "run_id",
        "status",
        "phase",
        "batch_size",
        "power_limit_w",
        "energy_j",
        "time_s",
        "cost",
        "reached",
        "epochs",
    ]
    row = dict(zip(fields, _GOOD_RUNS[0], strict=True))
    row.update(change)
    return [tuple(row.values())]


BAD_V1 = {
    "NULL figure": (_bad(energy_j=None), "energy_j is None"),
    "size not in the list": (_bad(batch_size=48), "one of the job's batch_sizes"),
    "text in a numeric column": (_bad(cost="cheap"), "cost is 'cheap'"),
    "negative cost": (_bad(cost=-5.0), "cost is -5.0"),
    "infinite time": (_bad(time_s=math.inf), "time_s is inf"),
    "reached is 7": (_bad(reached=7), "reached is 7"),
    "negative epochs": (_bad(epochs=-1), "epochs is -1"),
    "status": (_bad(status="paused"), None),  # v1's own CHECK refuses it at insert
}


@pytest.mark.parametrize("case", list(BAD_V1), ids=list(BAD_V1))
def test_a_bad_row_in_an_old_file_is_named_and_nothing_changes(tmp_path: Path, case: str) -> None:
    runs, expected = BAD_V1[case]
    if expected is None:
        with pytest.raises(sqlite3.IntegrityError):
            _v1_file(tmp_path / "v1.db", runs)
        return
    path = _v1_file(tmp_path / "v1.db", runs)
    with pytest.raises(ConfigError) as e:
        SQLiteStore(path).history("j")
    message = str(e.value)
    assert "\n" not in message
    assert "runs row seq=1" in message and expected in message
    assert "WHERE seq = 1" in message and "DELETE FROM runs" in message
    assert _version(path) == 1  # the migration rolled back: the file is as it was
    # Repaired as the message says, it migrates.
    con = sqlite3.connect(path)
    con.execute("DELETE FROM runs WHERE seq = 1")
    con.commit()
    con.close()
    assert SQLiteStore(path).history("j") == []
    assert _version(path) == SCHEMA_VERSION


@pytest.mark.parametrize("config", ["[1, 2]", "not json", '"text"'])
def test_a_job_config_that_is_not_an_object_is_named(tmp_path: Path, config: str) -> None:
    path = _v1_file(tmp_path / "v1.db", config=config)
    with pytest.raises(ConfigError, match=r"jobs row 'j': config .* is not a JSON object; repair"):
        SQLiteStore(path).history("j")


@pytest.mark.parametrize("limit", ["x", -3.0, math.inf])
def test_a_bad_cached_power_limit_is_named(tmp_path: Path, limit: object) -> None:
    path = _v1_file(tmp_path / "v1.db", limit=limit)
    with pytest.raises(
        ConfigError, match=r"power_limits row \(job 'j', gpu 'A40', batch size 64\)"
    ):
        SQLiteStore(path).history("j")


def _v2(tmp_path: Path) -> tuple[SQLiteStore, sqlite3.Connection]:
    store = SQLiteStore(tmp_path / "v2.db")
    store.register_job("j", {"batch_sizes": SIZES})
    started = store.begin_run(
        "j",
        lambda h, p: BatchSizeOptimizer(SIZES, 64).decide(h, np.random.default_rng(0), pending=p),
    )
    store.finish_run(started.run_id, Observation(64, 250.0, 10.0, 1.0, 11.0, True, 2))
    store.save_power_limit_w("j", "A40", 64, 200.0, {})
    con = sqlite3.connect(tmp_path / "v2.db", isolation_level=None)
    return store, con


HAND_MADE: dict[str, tuple[str, str]] = {
    "NULL figure": ("UPDATE runs SET energy_j = NULL", "done_has_figures"),
    "size not in the list": ("UPDATE runs SET batch_size = 48", "batch_sizes"),
    "text in a numeric column": ("UPDATE runs SET cost = 'cheap'", "cost_finite"),
    "negative cost": ("UPDATE runs SET cost = -1", "cost_finite"),
    "infinite cost": ("UPDATE runs SET cost = 1e999", "cost_finite"),
    "config not an object": ("UPDATE jobs SET config = '[1]'", "config_object"),
    "cached limit text": ("UPDATE power_limits SET power_limit_w = 'x'", "cached_power_limit"),
    "cached size not in the list": (
        "INSERT INTO power_limits VALUES ('j', 'A40', 48, 200.0, '{}')",
        "batch_sizes",
    ),
    "unknown status": ("UPDATE runs SET status = 'paused'", "run_status"),
}


@pytest.mark.parametrize("case", list(HAND_MADE), ids=list(HAND_MADE))
def test_hand_made_bad_rows_are_refused_at_insert(tmp_path: Path, case: str) -> None:
    sql, constraint = HAND_MADE[case]
    store, con = _v2(tmp_path)
    with pytest.raises(sqlite3.IntegrityError, match=constraint):
        con.execute(sql)
    assert len(store.history("j")) == 1


CHECKS_BYPASSED: dict[str, tuple[str, str]] = {
    "NULL figure": ("UPDATE runs SET time_s = NULL", "time_s is None"),
    "text in a numeric column": ("UPDATE runs SET energy_j = 'lots'", "energy_j is 'lots'"),
    "negative cost": ("UPDATE runs SET cost = -1", "cost is -1.0"),
    "size not in the list": ("UPDATE runs SET batch_size = 48", "batch_sizes [32, 64, 128]"),
}


@pytest.mark.parametrize("case", list(CHECKS_BYPASSED), ids=list(CHECKS_BYPASSED))
def test_rows_that_bypassed_the_checks_are_one_clear_error(tmp_path: Path, case: str) -> None:
    sql, expected = CHECKS_BYPASSED[case]
    store, con = _v2(tmp_path)
    con.execute("PRAGMA ignore_check_constraints = ON")
    con.execute("DROP TRIGGER runs_size_in_job_update")
    con.execute(sql)
    with pytest.raises(ConfigError) as e:
        store.history("j")
    assert "runs row seq=1" in str(e.value) and expected in str(e.value)
    assert "repair it (UPDATE runs SET" in str(e.value)


def test_invalid_figures_are_refused_before_they_are_written(tmp_path: Path) -> None:
    store, _con = _v2(tmp_path)
    started = store.begin_run(
        "j",
        lambda h, p: BatchSizeOptimizer(SIZES, 64).decide(h, np.random.default_rng(0), pending=p),
    )
    for bad in (
        Observation(64, 250.0, -1.0, 1.0, 1.0, True),
        Observation(64, 250.0, 1.0, math.inf, 1.0, True),
    ):
        with pytest.raises(ConfigError, match="not a finite number >= 0"):
            store.finish_run(started.run_id, bad)
    with pytest.raises(ConfigError, match="finite number > 0"):
        store.save_power_limit_w("j", "A40", 32, math.nan, {})


def _corrupt(path: Path) -> None:
    """Overwrite the tables' root pages (page 1 holds the header and the schema)."""
    con = sqlite3.connect(path)
    roots = [r for (r,) in con.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1")]
    con.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for root in roots:
        data[(root - 1) * page : root * page] = b"\xde\xad" * (page // 2)
    path.write_bytes(bytes(data))


def test_a_damaged_file_is_one_clear_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.register_job("j", {"batch_sizes": SIZES, "pad": "x" * 5000})
    for _ in range(30):
        started = store.begin_run(
            "j",
            lambda h, p: BatchSizeOptimizer(SIZES, 64).decide(
                h, np.random.default_rng(0), pending=p
            ),
        )
        store.finish_run(started.run_id, Observation(64, 250.0, 10.0, 1.0, 11.0, True, 2))
    store.close()  # the last connection: the WAL is checkpointed into the file
    _corrupt(tmp_path / "db.sqlite")
    with pytest.raises(ConfigError, match=r"not a usable SQLite database .*\.recover"):
        SQLiteStore(tmp_path / "db.sqlite").history("j")


def test_a_newer_schema_and_a_non_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(ConfigError, match="written by a newer perseus"):
        SQLiteStore(path).history("j")
    import os

    os.mkfifo(tmp_path / "fifo.db")
    with pytest.raises(ConfigError, match="is not a regular file"):
        SQLiteStore(tmp_path / "fifo.db").history("j")


def test_a_file_shorter_than_sqlites_header_is_refused_not_overwritten(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"x")  # SQLite alone took it for a new database and wrote over it
    with pytest.raises(ConfigError, match="not a usable SQLite database"):
        SQLiteStore(notes).history("j")
    assert notes.read_bytes() == b"x"
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty file is a new database, as SQLite has it
    assert SQLiteStore(empty).history("j") == []


def test_a_refused_schema_leaves_no_connection_open(tmp_path: Path) -> None:
    import os

    path = tmp_path / "new.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    store = SQLiteStore(path)
    for _ in range(3):  # a caller that retries: each try opened one more
        with pytest.raises(ConfigError, match="written by a newer perseus"):
            store.history("j")
    fds = Path("/proc/self/fd")
    held = [fd for fd in fds.iterdir() if os.path.realpath(fd) == os.path.realpath(path)]
    assert held == []


def test_a_cached_limit_outside_the_gpus_range_is_named(tmp_path: Path) -> None:
    store, _con = _v2(tmp_path)
    check: Callable[[], float | None] = lambda: store.cached_power_limit_w(  # noqa: E731
        "j", "A40", 64, range_w=(100.0, 150.0)
    )
    with pytest.raises(ConfigError, match=r"outside this GPU's range 100\.\.150 W; drop it"):
        check()
