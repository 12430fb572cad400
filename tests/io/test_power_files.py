"""Signal CSVs, schedule JSON and the power curve CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.errors import ConfigError, PlanError
from perseus.io.power_files import (
    power_curve_rows,
    read_schedule,
    read_signal,
    write_power_curve,
    write_schedule,
)
from perseus.plan import Frontier
from perseus.solver import trace_frontier
from perseus.solver.power import with_power
from perseus.solver.power_schedule import schedule_plans
from tests.solver.conftest import small_job


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    job = small_job(seed=4)
    return with_power(job, trace_frontier(job))


def test_signal_in_seconds_with_header_and_comments(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text("# prices\nstart,value\n100, 3.5\n\n160,0\n400,12\n")
    assert read_signal(p) == ([0.0, 60.0, 300.0], [3.5, 0.0, 12.0])


def test_signal_in_iso_times(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text(
        "2026-11-23T00:00:00+00:00,200\n2026-11-23T01:00:00+00:00,150\n"
        "2026-11-23T01:30:00+00:00,90\n"
    )
    assert read_signal(p) == ([0.0, 3600.0, 5400.0], [200.0, 150.0, 90.0])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0,1\n10\n", r":2: 1 fields, expected 2"),
        ("0,1\n10,x\n", r":2: value 'x' is not a number"),
        ("0,1\n10,-2\n", r":2: value '-2' must be a finite number >= 0"),
        ("0,1\n10,inf\n", r":2: value 'inf' must be a finite number"),
        ("0,1\nsoon,2\n", r":2: start 'soon' is neither seconds nor an ISO 8601 time"),
        ("0,1\n2026-11-23T00:00:00,2\n", r":2: start .* mixes seconds and ISO times"),
        ("0,1\n10,2\n10,3\n", r"row 3: start is not after the previous row's"),
        ("start,value\n", r"no rows"),
    ],
)
def test_bad_signals_are_one_line_config_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "s.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        read_signal(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_signal_is_a_bounded_read_of_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_signal(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match="directory"):
        read_signal(tmp_path)


def test_schedule_round_trips_and_is_bound_to_its_frontier(
    tmp_path: Path, frontier: Frontier
) -> None:
    t0 = frontier.fastest.time_s
    s = schedule_plans(
        frontier.points, [0.0, 10 * t0, 30 * t0], [5.0, 1.0, 3.0], iterations=25, deadline_s=40 * t0
    )
    path = tmp_path / "schedule.json"
    write_schedule(s, frontier, path)
    doc = read_schedule(path)
    assert doc.iterations == 25 and doc.cost == pytest.approx(s.cost)
    assert doc.segments == s.segments()
    assert sum(pc.iterations for iv in doc.intervals for pc in iv.plans) == 25
    # point_at follows the segments.
    for first, index in doc.segments:
        assert doc.point_at(first) == index
    doc.check_frontier(frontier, "schedule.json")
    other = frontier.with_points(frontier.points[1:])
    with pytest.raises(PlanError, match="made for another frontier"):
        doc.check_frontier(other, "schedule.json")
    raw = json.loads(path.read_text())
    raw["segments"] = [[0, 1], [0, 2]]
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="strictly increasing"):
        read_schedule(path)


def test_power_curve_rows_and_file(tmp_path: Path, frontier: Frontier) -> None:
    rows = power_curve_rows(frontier)
    assert len(rows) == len(frontier.points)
    for (t, avg, peak, slope), p, q in zip(
        rows, frontier.points, frontier.points[1:], strict=False
    ):
        assert (t, avg) == (p.time_s, p.avg_power_w)
        assert peak is not None and peak >= avg
        assert slope == pytest.approx((q.avg_power_w - p.avg_power_w) / (q.time_s - p.time_s))
    assert rows[-1][3] is None
    path = tmp_path / "curve.csv"
    write_power_curve(frontier, path)
    lines = path.read_text().splitlines()
    assert lines[0] == "time_s,avg_power_w,peak_power_w,dpower_dtime_w_per_s"
    assert len(lines) == len(rows) + 1 and lines[-1].endswith(",")
    assert float(lines[1].split(",")[3]) == pytest.approx(rows[0][3])
