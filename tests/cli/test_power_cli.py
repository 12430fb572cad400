"""``plan pick --power-cap-w/--peak-power-w``, ``plan schedule``, ``frontier --power-curve`` and
``perseus power set|clear`` (against a real TCP store in this process)."""

from __future__ import annotations

import json
import math
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from perseus.cli.main import main
from perseus.io.frontier_files import read_frontier
from perseus.io.power_files import read_schedule
from perseus.plan import Frontier


@pytest.fixture(scope="module")
def frontier_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("power") / "f.json"
    curve = path.with_name("curve.csv")
    assert main([
        "frontier", "a40", "--microbatches", "4", "--no-progress", "-o", str(path),
        "--power-curve", str(curve),
    ]) == 0  # fmt: skip
    return path


@pytest.fixture(scope="module")
def frontier(frontier_path: Path) -> Frontier:
    return read_frontier(frontier_path)


def test_frontier_writes_power_figures_and_the_curve(
    frontier_path: Path, frontier: Frontier
) -> None:
    assert json.loads(frontier_path.read_text())["schema_version"] == 3
    assert all(p.power is not None for p in frontier.points)
    lines = frontier_path.with_name("curve.csv").read_text().splitlines()
    assert len(lines) == len(frontier.points) + 1
    t, avg, peak, slope = (float(x) for x in lines[1].split(","))
    assert (t, avg) == (frontier.points[0].time_s, frontier.points[0].avg_power_w)
    assert peak >= avg and slope < 0  # slower plans draw less power


def test_pick_under_an_average_cap_and_per_gpu(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    pts = frontier.points
    cap = (pts[0].avg_power_w + frontier.min_energy.avg_power_w) / 2
    out = tmp_path / "p.json"
    assert (
        main(["plan", "pick", str(frontier_path), "--power-cap-w", repr(cap), "-o", str(out)]) == 0
    )
    got = read_frontier(out).points[0]
    assert got.avg_power_w <= cap
    assert all(p.avg_power_w > cap for p in pts if p.time_s < got.time_s)
    assert "average" in capsys.readouterr().out
    ranks = frontier.job.ranks
    out2 = tmp_path / "p2.json"
    assert main([
        "plan", "pick", str(frontier_path), "--power-cap-w", repr(cap / ranks), "--per-gpu",
        "-o", str(out2),
    ]) == 0  # fmt: skip
    assert read_frontier(out2).points == read_frontier(out).points


def test_pick_under_a_peak_budget(tmp_path: Path, frontier_path: Path, frontier: Frontier) -> None:
    peaks = sorted(p.power.peak_power_w for p in frontier.points if p.power is not None)
    budget = peaks[len(peaks) // 2]
    out = tmp_path / "p.json"
    assert (
        main(["plan", "pick", str(frontier_path), "--peak-power-w", repr(budget), "-o", str(out)])
        == 0
    )
    got = read_frontier(out).points[0]
    assert got.power is not None and got.power.peak_power_w <= budget
    assert all(
        p.power is not None and p.power.peak_power_w > budget
        for p in frontier.points
        if p.time_s < got.time_s
    )


def test_unmet_budget_is_one_line_naming_the_lowest_figure(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    assert main(["plan", "pick", str(frontier_path), "--power-cap-w", "10", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    lowest = min(p.avg_power_w for p in frontier.points)
    assert err == (
        f"error: no plan's average power is at most 10 W; the lowest any plan reaches is "
        f"{lowest:.6g} W\n"
    )
    assert not out.exists()
    assert (
        main(["plan", "pick", str(frontier_path), "--slowdown", "1.1", "--per-gpu", "-o", str(out)])
        == 2
    )


def test_plan_schedule_writes_a_schedule_and_refuses_an_impossible_n(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    signal = tmp_path / "signal.csv"
    signal.write_text(
        "start,value\n" + "".join(f"{h * 3600},{100 + 50 * math.cos(h)}\n" for h in range(24))
    )
    out = tmp_path / "s.json"
    n = int(0.6 * 86400 / frontier.fastest.time_s)
    argv = [
        "plan",
        "schedule",
        str(frontier_path),
        "--signal",
        str(signal),
        "--deadline-s",
        "86400",
    ]
    assert main([*argv, "--iterations", str(n), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "saving" in printed and "exact optimum" in printed
    doc = read_schedule(out)
    assert doc.iterations == n and doc.cost <= doc.baseline_cost  # type: ignore[operator]
    assert main([*argv, "--iterations", str(10 * n), "-o", str(tmp_path / "no.json")]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {10 * n} iterations cannot finish by 86400 s")
        and err.count("\n") == 1
    )
    assert not (tmp_path / "no.json").exists()
    # The suggested deadline, passed back, is enough.
    suggested = err.strip().rsplit(" ", 1)[-1]
    argv[-1] = suggested
    assert main([*argv, "--iterations", str(10 * n), "-o", str(tmp_path / "yes.json")]) == 0
    capsys.readouterr()
    # Prices near the float limit: one clean line, exit 2.
    argv[-1] = "86400"
    signal.write_text("0,1\n5,1e308\n")
    assert main([*argv, "--iterations", "1", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "value '1e308' must be a finite number within" in err and err.count("\n") == 1


def test_plan_schedule_charges_idle_gpus_and_names_the_signal(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = (
        Path(__file__).parents[1] / "solver" / "signals" / "de_lu_2023-06-27_negative_prices.csv"
    )
    start = datetime(2023, 6, 27, tzinfo=UTC)
    carbon = tmp_path / "carbon.csv"  # synthetic carbon on the real price week's hours
    carbon.write_text(
        "start,carbon_g_per_kwh_location_average\n"
        + "".join(f"{(start + timedelta(hours=h)).isoformat()},{300 - 100 * math.sin(h / 4)}\n" for h in range(168))
    )  # fmt: skip
    out = tmp_path / "s.json"
    n = int(0.4 * 168 * 3600 / frontier.fastest.time_s)
    argv = ["plan", "schedule", str(frontier_path), "--signal", str(prices), "--signal",
            str(carbon), "--iterations", str(n), "--deadline-s", str(168 * 3600), "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "signal:   price in EUR/MWh from 2023-06-27T00:00:00+00:00" in printed
    assert "idle at 30 W each x 8 (the a40 preset)" in printed  # the A40 preset's idle power
    assert "EUR (exact optimum over plan mixes" in printed
    assert "kgCO2 (carbon in gCO2/kWh (location-based, average))" in printed
    doc = read_schedule(out)
    assert doc.schema_version == 2 and doc.idle_power_w == 30.0 * frontier.job.ranks
    assert doc.signal == "price in EUR/MWh"
    assert sum(iv.idle_energy_j for iv in doc.intervals) > 0
    assert main([*argv, "--objective", "carbon", "--idle-power-w", "0"]) == 0
    printed = capsys.readouterr().out
    assert "signal:   carbon in gCO2/kWh (location-based, average)" in printed
    assert "idle at 0 W each" in printed
    assert read_schedule(out).idle_power_w == 0.0


def _store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )


def test_power_set_is_acknowledged_by_a_running_job(
    frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    from perseus.runtime.power import PowerRuntime, read_cap

    store = _store()
    address = f"127.0.0.1:{store.port}"
    runtime = PowerRuntime(frontier, store=store)
    stop = threading.Event()

    def job() -> None:  # global rank 0 at its iteration boundaries, every 20 ms
        i = 0
        while not stop.is_set():
            runtime.read_cap_w(i)
            i += 1
            time.sleep(0.02)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    try:
        assert main(["power", "set", "--store", address, "--cap-w", "300", "--per-gpu"]) == 0
        assert "acknowledged by the job at iteration" in capsys.readouterr().out
        assert read_cap(store)[:2] == (300.0, "gpu")  # type: ignore[index]
        assert main(["power", "clear", "--store", address]) == 0
        assert read_cap(store) is None
    finally:
        stop.set()
        thread.join(5)
    # Nobody reads the store now.
    assert main(["power", "set", "--store", address, "--cap-w", "500", "--wait-s", "0.2"]) == 1
    assert "no running job has read it yet" in capsys.readouterr().out


def test_peak_budget_below_every_plan_falls_back_to_a_power_limit_and_says_so(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    lowest = min(p.power.peak_power_w for p in frontier.points if p.power is not None)
    out = tmp_path / "p.json"
    budget = 0.9 * lowest
    argv = ["plan", "pick", str(frontier_path), "--peak-power-w", repr(budget), "-o", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    per_gpu = budget / frontier.job.ranks
    assert f"falling back to a uniform power limit of {per_gpu:.6g} W per GPU" in said
    got = read_frontier(out).points[0]
    assert got.power is not None and got.power.peak_power_w == lowest


def test_average_cap_names_a_faster_time_share_of_two_plans(
    tmp_path: Path, frontier_path: Path, frontier: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    pts = frontier.points
    # A budget between two adjacent plans' average powers: no single plan meets it exactly.
    a, b = pts[len(pts) // 3], pts[len(pts) // 3 + 1]
    budget = (a.avg_power_w + b.avg_power_w) / 2
    out = tmp_path / "p.json"
    assert (
        main(["plan", "pick", str(frontier_path), "--power-cap-w", repr(budget), "-o", str(out)])
        == 0
    )
    said = capsys.readouterr().out
    single = read_frontier(out).points[0].time_s
    line = next(ln for ln in said.splitlines() if ln.startswith("time-sharing:"))
    mean_s = float(line.split(" averages ")[1].split(" s ")[0])
    assert mean_s < single


def test_peak_pick_off_the_frontier_on_a_small_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --off-frontier the pick may leave the frontier; never slower than its pick."""
    path, profile = tmp_path / "f.json", tmp_path / "p.csv"
    assert main(["profile", "slice", "a100", "--stages", "2", "-o", str(profile)]) == 0
    assert main(["frontier", str(profile), "--microbatches", "2", "--blocking-power-w", "83.64", "--no-progress", "-o", str(path)]) == 0  # fmt: skip
    frontier = read_frontier(path)
    peaks = sorted(p.power.peak_power_w for p in frontier.points if p.power is not None)
    budget = peaks[len(peaks) // 2]
    out = tmp_path / "p.json"
    argv = ["plan", "pick", str(path), "--peak-power-w", repr(budget), "-o", str(out)]
    assert main(argv) == 0
    on = read_frontier(out).points[0]
    assert main([*argv, "--off-frontier", "--profile", str(profile)]) == 0
    said = capsys.readouterr().out
    off = read_frontier(out).points[0]
    assert "off the frontier (" in said
    assert off.power is not None and off.power.peak_power_w <= budget * (1 + 1e-12)
    assert off.time_s <= on.time_s
    assert (
        main(["plan", "pick", str(path), "--slowdown", "1.1", "--off-frontier", "-o", str(out)])
        == 2
    )
    # An average cap has no off-frontier search, and --profile serves only that search: both
    # were taken and ignored.
    cap = ["plan", "pick", str(path), "--power-cap-w", repr(budget), "-o", str(out)]
    assert main([*cap, "--off-frontier"]) == 2
    assert main([*cap, "--profile", str(profile)]) == 2
    assert main([*argv, "--profile", str(profile)]) == 2
    assert "--profile: only with --off-frontier" in capsys.readouterr().err
