"""Signal CSVs, schedule JSON and the power curve CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.errors import ConfigError, PlanError
from perseus.io.power_files import (
    MAX_SIGNAL_ROWS,
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
    p.write_text("# prices\nstart,value\n100, 3.5\n\n160,0\n400,-12\n")
    signal = read_signal(p)
    assert signal.starts_s.tolist() == [0.0, 60.0, 300.0] and signal.origin is None
    assert signal.series[0].values_per_kwh.tolist() == [3.5, 0.0, -12.0]  # zero, negative


def test_signal_in_iso_times(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text(
        "2026-11-23T00:00:00+00:00,200\n2026-11-23T01:00:00+00:00,150\n"
        "2026-11-23T01:30:00+00:00,90\n"
    )
    signal = read_signal(p)
    assert signal.starts_s.tolist() == [0.0, 3600.0, 5400.0]
    assert signal.series[0].values_per_kwh.tolist() == [200.0, 150.0, 90.0]
    assert signal.origin is not None and signal.origin.isoformat() == "2026-11-23T00:00:00+00:00"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0,1\n10\n", r":2: 1 fields, expected 2"),
        ("0,1\n10,x\n", r":2: value 'x' is not a number"),
        ("0,1\n10,-1e308\n", r":2: value '-1e308' must be a finite number within"),
        ("start,price_eur_per_gwh\n0,1\n", r":1: column 'price_eur_per_gwh' is not one of"),
        ("start,carbon_g_per_kwh\n0,1\n", r":1: column 'carbon_g_per_kwh' does not say its basis"),
        ("start,price_per_mwh,value\n0,1\n", r":2: 2 fields, expected 3"),
        ("0,1\n10,inf\n", r":2: value 'inf' must be a finite number"),
        ("0,1\nsoon,2\n", r":2: start 'soon' is neither seconds nor an ISO 8601 time"),
        ("0,1\n2026-11-23T00:00:00,2\n", r":2: start .* mixes seconds and ISO times"),
        ("0,1\n10,2\n10,3\n", r"row 3: start is not after the previous row's"),
        ("start,value\n", r"no rows"),
        ("0001-01-01T00:00:00+14:00,1\n", r":1: start .* is before year 1 or after 9999 in UTC"),
        ("0001-01-01T00:00:00,1\n9999-12-31T00:00:00,2\n", r":2: start .* 1000 years after"),
    ],
)
def test_bad_signals_are_one_line_config_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "s.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        read_signal(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_two_signals_with_and_without_a_time_zone_are_a_config_error(tmp_path: Path) -> None:
    aware, naive = tmp_path / "aware.csv", tmp_path / "naive.csv"
    aware.write_text("2026-11-23T00:00:00Z,1\n")
    naive.write_text("2026-11-23T00:00:00,1\n")
    with pytest.raises(ConfigError, match=r"naive.csv: .*time zone") as e:
        read_signal(aware, naive)
    assert "\n" not in str(e.value)


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


def test_units_and_basis_are_declared_in_the_header(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text(
        "start,price_eur_per_mwh,carbon_g_per_kwh_market_marginal\n"
        "2026-06-13T10:00:00Z,-11.5,120\n2026-06-13T11:00:00Z,0,95\n"
    )
    signal = read_signal(p)
    price, carbon = signal.series
    assert price.values_per_kwh.tolist() == [-0.0115, 0.0]  # per MWh read as per kWh
    assert price.describe() == "price in EUR/MWh"
    assert carbon.describe() == "carbon in gCO2/kWh (market-based, marginal)"
    assert signal.pick("carbon") is carbon and signal.pick(None) is price
    assert price.amount(12.5) == "12.5 EUR" and carbon.amount(2500) == "2.5 kgCO2"
    with pytest.raises(ConfigError, match="objective `value`: the signal has 0 such columns"):
        signal.pick("value")


def test_prices_and_carbon_in_two_files_are_aligned_on_the_clock(tmp_path: Path) -> None:
    prices = tmp_path / "p.csv"
    prices.write_text(
        "start,price_per_kwh\n2026-06-13T00:00:00+00:00,0.1\n2026-06-13T01:00:00+00:00,-0.02\n"
        "2026-06-13T02:00:00+00:00,0.3\n"
    )
    carbon = tmp_path / "c.csv"  # quarter-hourly, starting 30 minutes later
    carbon.write_text(
        "start,carbon_g_per_kwh_location_average\n2026-06-13T00:30:00+00:00,300\n"
        "2026-06-13T01:15:00+00:00,250\n"
    )
    signal = read_signal(prices, carbon)
    assert signal.origin is not None and signal.origin.isoformat() == "2026-06-13T00:30:00+00:00"
    assert signal.starts_s.tolist() == [0.0, 1800.0, 2700.0, 5400.0]
    assert signal.series[0].values_per_kwh.tolist() == [0.1, -0.02, -0.02, 0.3]
    assert signal.series[1].values_per_kwh.tolist() == [300.0, 300.0, 250.0, 250.0]
    seconds = tmp_path / "s.csv"
    seconds.write_text("0,1\n")
    with pytest.raises(ConfigError, match="one signal uses ISO times and the other seconds"):
        read_signal(prices, seconds)


def test_a_signal_at_the_row_limit_reads_and_one_more_row_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    rows = "\n".join(f"{60 * k},{(k % 97) - 20}" for k in range(MAX_SIGNAL_ROWS))
    p.write_text(rows + "\n")
    signal = read_signal(p)
    assert signal.starts_s.size == MAX_SIGNAL_ROWS and signal.starts_s[-1] == 60 * (
        MAX_SIGNAL_ROWS - 1
    )
    p.write_text(rows + f"\n{60 * MAX_SIGNAL_ROWS},1\n")
    with pytest.raises(ConfigError, match="more than 1,000,000 rows; resample it"):
        read_signal(p)
