"""A fleet database at its limits: a URL libpq cannot parse, a database that is not perseus's,
a member's curve edited by hand: one line naming the database, exit 2, never an internal
error."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.errors import ConfigError
from perseus.fleet.registry import FleetRegistry
from perseus.solver.fleet import FleetJob

GOOD = {
    "points": [0, 1],
    "time_s": [1.0, 1.05],
    "average_power_w": [100.0, 40.0],
    "peak_power_w": [100.0, 40.0],
    "fastest_time_s": 1.0,
}
CURVES = [
    json.dumps({**GOOD, "average_power_w": [float("nan"), 40.0]}),
    json.dumps({**GOOD, "average_power_w": ["1e999", 40.0]}),
    json.dumps({**GOOD, "average_power_w": [-100.0, -40.0]}),
    json.dumps({**GOOD, "time_s": [0.0, 0.0]}),
    json.dumps({**GOOD, "fastest_time_s": 0}),
    "[" * 100_000 + "]" * 100_000,
]


def _one_line(capsys: pytest.CaptureFixture[str], code: int, where: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and where in err, err
    return err


@pytest.mark.parametrize("curve", CURVES, ids=range(len(CURVES)))
def test_a_curve_edited_by_hand_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], curve: str
) -> None:
    db = tmp_path / "fleet.db"
    with FleetRegistry(f"sqlite:///{db}") as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0)))
        fleet.set_budget(150.0)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE fleet_members SET curve = ?", (curve,))
    con.close()
    code = main(["fleet", "serve", "--once", "--db", f"sqlite:///{db}"])
    assert "edited by hand" in _one_line(capsys, code, str(db))


@pytest.mark.parametrize("tail", ["%ff", "%00", "perseus?bogus=1"])
def test_a_url_libpq_cannot_parse_is_one_line(
    capsys: pytest.CaptureFixture[str], tail: str
) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[postgres]')")
    code = main(["fleet", "status", "--db", f"postgresql://fleet@127.0.0.1:1/{tail}"])
    assert "not a PostgreSQL URL" in _one_line(capsys, code, "--db postgresql://")


@pytest.mark.parametrize(
    "tables",
    [
        ["CREATE TABLE jobs (id INTEGER, other TEXT)"],
        ["CREATE TABLE fleet_state (id INTEGER, other TEXT)"],
        ["CREATE TABLE perseus_schema (version TEXT)", "INSERT INTO perseus_schema VALUES ('x')"],
    ],
    ids=["jobs", "fleet_state", "version"],
)
def test_a_database_that_is_not_perseuss_is_one_line(
    postgres_url: str, capsys: pytest.CaptureFixture[str], tables: list[str]
) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as con:
        for sql in tables:
            con.execute(sql)
    for command in (["status"], ["budget", "--set-w", "100"]):
        code = main(["fleet", *command, "--db", postgres_url])
        assert "perseus's own" in _one_line(capsys, code, postgres_url)


def test_a_member_that_finishes_while_the_database_does_not_answer_ends_cleanly(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``close()`` at the end of a training raised the database's error out of the training
    program (a server stopped or restarted then): the lease gives the share back anyway."""
    from perseus.fleet.member import FleetMember
    from perseus.io import load_profile
    from perseus.job import make_job
    from perseus.runtime.emulation import take_stages
    from perseus.solver import trace

    job = make_job(take_stages(load_profile("a100"), 2), "1f1b", 2, 2, blocking_power_w=83.64)
    frontier = trace(job, min_gap_fraction=0.05).frontier
    member = FleetMember(store_url, "a", frontier, lease_s=60.0)
    member.registry.store.busy_timeout_s = 0.2
    member.start()
    with FleetRegistry(store_url) as holder, holder._write() as con:
        # SQLite: the write lock; PostgreSQL: the state row finish() locks
        holder.store._x(con, "SELECT budget_w FROM fleet_state" + " FOR UPDATE" * holder._postgres)
        member.close()
    assert any("does not answer" in r.getMessage() for r in caplog.records)


def test_a_deleted_state_row_names_the_fix(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planner's state row deleted by hand under a running planner: it said 'repair or
    delete the row' of a row that is gone; the budget command adds it back."""
    with FleetRegistry(store_url) as fleet:
        fleet.set_budget(150.0)
        with fleet._write() as con:
            fleet.store._x(con, "DELETE FROM fleet_state")
        with pytest.raises(ConfigError, match=r"fleet_state has no row.*fleet budget"):
            fleet.replan()
    assert main(["fleet", "budget", "--db", store_url, "--set-w", "120"]) == 0
    assert main(["fleet", "status", "--db", store_url]) == 0
    assert "budget 120.0 W" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["", "x" * 201, "a\x00b", "\udcff"], ids=range(4))
def test_a_member_name_the_table_cannot_hold_is_named(store_url: str, name: str) -> None:
    """A job's name (from its scheduler's environment) the table refuses was 'the database
    refused a value ...; this is a bug or a row edited by hand'."""
    job = FleetJob(name, 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0))
    with (
        FleetRegistry(store_url) as fleet,
        pytest.raises(ConfigError, match=r"fleet member name .*pass another name") as raised,
    ):
        fleet.register(job)
    assert "by hand" not in str(raised.value)


def test_port_zero_and_a_role_without_grants_are_input_errors(postgres_url: str) -> None:
    """Both were exit 1 (a server fault), a role without grants without the fix."""
    import psycopg

    from perseus.recurring.database import open_store, parse_url

    with pytest.raises(ConfigError, match="port 0"):
        parse_url("postgresql://fleet@127.0.0.1:0/perseus")
    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("DROP ROLE IF EXISTS bare_role")
        con.execute("CREATE ROLE bare_role LOGIN")
    url = postgres_url.replace("perseus@", "bare_role@")
    with pytest.raises(ConfigError, match=r"permission denied.*grant the URL's role"):
        open_store(url, connect_timeout_s=5).history("j")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpus": 3}, "0.gpus: job 'a'"),
        ({"gpus": True}, "0.gpus"),
        ({"weight": "2"}, "0.weight"),
        ({"name": "a\x1b[2J"}, "0.name"),
    ],
    ids=["gpus 3", "gpus true", "weight text", "name escape"],
)
def test_a_jobs_file_entry_is_read_strictly_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, object], field: str
) -> None:
    """gpus true ran as 1 GPU and weight "2" as 2.0; gpus 3 (of 2 ranks) did not name the
    file: 'job 'a': gpus 3 is not a positive multiple ...'."""
    from perseus.io import load_profile
    from perseus.io.frontier_files import write_frontier
    from perseus.job import make_job
    from perseus.runtime.emulation import take_stages
    from perseus.solver import trace

    job = make_job(take_stages(load_profile("a100"), 2), "1f1b", 2, 2, blocking_power_w=83.64)
    write_frontier(trace(job, min_gap_fraction=0.05).frontier, tmp_path / "f.json")
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"name": "a", "frontier": "f.json", **extra}]))
    code = main(["fleet", "plan", str(jobs), "--budget-w", "1000"])
    assert f"jobs.json: entry {field}" in _one_line(capsys, code, str(jobs))


def test_an_infinite_cap_edited_by_hand_is_not_served(store_url: str) -> None:
    """A cap_w of infinity passes the table's CHECK (cap_w > 0); served, the power runtime
    read it as no cap and the job ran uncapped on power planned for the others."""
    with FleetRegistry(store_url) as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0)))
        fleet.set_budget(150.0)
        fleet.replan()
        infinity = "'Infinity'" if fleet._postgres else "9e999"
        with fleet._write() as con:
            fleet.store._x(con, f"UPDATE fleet_members SET cap_w = {infinity}")
        with pytest.raises(ConfigError, match="edited by hand"):
            fleet.assignment("a")


def test_a_running_member_holds_its_plan_when_its_row_is_edited_by_hand(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A row perseus cannot use (a cap edited to infinity) ended the training with a
    ConfigError once the member read it; a running member holds its last plan instead, as for
    a database that does not answer."""
    from perseus.fleet.member import FleetMember
    from perseus.io.bundled import load_profile
    from perseus.job import make_job
    from perseus.runtime.emulation import take_stages
    from perseus.runtime.power.cap import CAP_KEY
    from perseus.solver import trace

    job = make_job(take_stages(load_profile("a100"), 2), "1f1b", 2, 2, blocking_power_w=83.64)
    member = FleetMember(store_url, "a", trace(job, min_gap_fraction=0.05).frontier)
    with member:
        with FleetRegistry(store_url) as fleet:
            fleet.set_budget(1e6)
            fleet.replan()
        assert member.check([CAP_KEY])
        held = member.get(CAP_KEY)
        infinity = "'Infinity'" if "postgresql" in store_url else "9e999"
        with FleetRegistry(store_url) as fleet, fleet._write() as con:
            fleet.store._x(con, f"UPDATE fleet_members SET cap_w = {infinity}")
        assert member.check([CAP_KEY]) and member.get(CAP_KEY) == held
    assert any("edited by hand" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("column", ["lease_s", "heartbeat_s"])
def test_a_lease_edited_to_infinity_still_lapses(store_url: str, column: str) -> None:
    """A member's lease_s or heartbeat_s edited by hand to infinity never lapsed: a dead
    member kept its share of the budget for good."""
    from perseus.device.clock import VirtualClock

    clock = VirtualClock(1000.0)
    with FleetRegistry(store_url, clock=clock) as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0)))
        fleet.set_budget(150.0)
        fleet.replan()
        infinity = "'Infinity'" if fleet._postgres else "9e999"
        with fleet._write() as con:
            fleet.store._x(con, f"UPDATE fleet_members SET {column} = {infinity}")
        clock.advance(3600.0)
        fleet.replan()
        assert fleet.assignment("a") is None
        assert {m.name: m.status for m in fleet.status()[2]} == {"a": "expired"}
