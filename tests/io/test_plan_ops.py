"""A plan file's ops are parsed once, at load, into the schedule's actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.errors import PlanError, ScheduleError
from perseus.io import load_profile
from perseus.io.frontier_files import read_frontier, write_frontier
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.schedule import Action, Kind, build_schedule, parse_op_name
from tests.runtime.plans import tiny_plan


def _interleaved() -> tuple[Frontier, tuple[tuple[Action, ...], ...]]:
    """A plan whose ranks hold two stages each (ops spelled ``F3@5``)."""
    job = make_job(
        load_profile("a100"), "interleaved", 8, 4, blocking_power_w=83.64, virtual_stages=2
    )
    return job.frontier([job.point(job.allmax())]), job.schedule.rank_actions


def test_a_plan_file_is_read_as_the_schedule_actions_and_written_back_byte_for_byte(
    tmp_path: Path,
) -> None:
    plan, actions = _interleaved()
    path = tmp_path / "plan.json"
    write_frontier(plan, path)
    read = read_frontier(path)
    assert read.rank_actions == actions
    assert "F0@4" in read.stage_ops[0]  # the file's spelling, as ever
    assert tuple(tuple(map(read.op_name, ops)) for ops in read.rank_actions) == read.stage_ops
    again = tmp_path / "again.json"
    write_frontier(read, again)
    assert again.read_bytes() == path.read_bytes()


def test_a_malformed_op_is_refused_at_load_named_by_its_place(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_frontier(tiny_plan(), path)
    doc = json.loads(path.read_text())
    doc["stage_ops"][1][2] = "X1"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        PlanError, match=r"plan\.json: field stage_ops\.1\.2: not an op name .*'X1'"
    ):
        read_frontier(path)


def test_op_names_parse_into_the_actions_they_name() -> None:
    assert parse_op_name("F3", 1) == Action(1, Kind.F, 3)
    assert parse_op_name("W0@5", 1) == Action(5, Kind.W, 0)
    for bad in ("F", "f3", "F3@", "X3", "1F3", "F3@5@6", "F1234567890"):
        with pytest.raises(ScheduleError, match="not an op name"):
            parse_op_name(bad, 0)
    sched = build_schedule("zb", 4, 4)
    for rank, (names, actions) in enumerate(
        zip(sched.stage_ops(), sched.rank_actions, strict=True)
    ):
        assert tuple(parse_op_name(n, rank) for n in names) == actions
