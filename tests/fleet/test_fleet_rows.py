"""Fleet rows edited by hand: one line naming the database, exit 2, never an internal error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.fleet.registry import FleetRegistry
from perseus.solver.fleet import FleetJob

EDITS = [
    "UPDATE fleet_state SET epoch = 'x'",
    "UPDATE fleet_state SET epoch = 9223372036854775807",
    "UPDATE fleet_members SET heartbeat_s = 'x'",
    "UPDATE fleet_members SET lease_s = X'00ff'",
    "UPDATE fleet_members SET cap_w = 'x'",
    "UPDATE fleet_members SET point = X'00ff'",
    "UPDATE fleet_members SET curve = '{}'",
    "UPDATE fleet_members SET curve = 'x'",
]
COMMANDS = [["status"], ["status", "--json"], ["serve", "--once", "--budget-w", "120"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("edit", EDITS)
def test_a_row_edited_by_hand_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str, command: list[str]
) -> None:
    db = tmp_path / "fleet.db"
    with FleetRegistry(f"sqlite:///{db}") as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0)))
        fleet.set_budget(150.0)
        fleet.replan()
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA ignore_check_constraints = 1")
        con.execute(edit)
    con.close()
    code = main(["fleet", command[0], "--db", f"sqlite:///{db}", *command[1:]])
    err = capsys.readouterr().err
    if code == 0:  # an edit this command does not read
        return
    assert code == 2, err
    assert err.count("\n") == 1 and str(db) in err and "edited by hand" in err, err


def test_a_plan_without_its_cap_shows_no_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "fleet.db"
    with FleetRegistry(f"sqlite:///{db}") as fleet:
        fleet.register(FleetJob("a", 1.0, (0, 1), (1.0, 1.05), (100.0, 40.0), (100.0, 40.0)))
        fleet.set_budget(150.0)
        fleet.replan()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE fleet_members SET cap_w = NULL")
    con.close()
    assert main(["fleet", "status", "--db", f"sqlite:///{db}"]) == 0
    assert "  a: running, -," in capsys.readouterr().out
