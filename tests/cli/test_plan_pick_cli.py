from __future__ import annotations

import pytest

from perseus.cli.main import main
from perseus.io import read_frontier, write_frontier
from perseus.solver import trace_frontier

from ..solver.conftest import small_job


@pytest.fixture(scope="module")
def frontier_file(tmp_path_factory):
    job = small_job("1f1b", 3, 4, seed=1)
    path = tmp_path_factory.mktemp("pick") / "frontier.json"
    frontier = trace_frontier(job)
    write_frontier(frontier, path)
    return path, frontier


def test_pick_by_time(frontier_file, tmp_path):
    path, frontier = frontier_file
    mid = frontier.points[len(frontier.points) // 2]
    out = tmp_path / "plan.json"
    assert main(["plan", "pick", str(path), "--time-s", repr(mid.time_s), "-o", str(out)]) == 0
    plan = read_frontier(out)
    assert plan.points == (frontier.cheapest_within(mid.time_s),)
    assert plan.job == frontier.job and plan.stage_ops == frontier.stage_ops


def test_pick_by_slowdown(frontier_file, tmp_path):
    path, frontier = frontier_file
    out = tmp_path / "plan.json"
    assert main(["plan", "pick", str(path), "--slowdown", "1.05", "-o", str(out)]) == 0
    (point,) = read_frontier(out).points
    assert point.time_s <= frontier.fastest.time_s * 1.05
    assert point == frontier.cheapest_within(frontier.fastest.time_s * 1.05)


def test_straggler_beyond_t_star_picks_min_energy(frontier_file, tmp_path):
    path, frontier = frontier_file
    out = tmp_path / "plan.json"
    far = frontier.min_energy.time_s * 3
    assert main(["plan", "pick", str(path), "--straggler-time-s", repr(far), "-o", str(out)]) == 0
    assert read_frontier(out).points == (frontier.min_energy,)


def test_deadline_below_fastest_is_exit_2_naming_fastest(frontier_file, tmp_path, capsys):
    path, frontier = frontier_file
    out = tmp_path / "plan.json"
    too_fast = frontier.fastest.time_s / 2
    assert main(["plan", "pick", str(path), "--time-s", repr(too_fast), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--time-s" in err and "below the fastest plan" in err
    assert f"{frontier.fastest.time_s:.6g}" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "flag,value", [("--slowdown", "0.5"), ("--time-s", "-3"), ("--time-s", "nan")]
)
def test_bad_values_are_exit_2(frontier_file, tmp_path, flag, value):
    path, _ = frontier_file
    assert main(["plan", "pick", str(path), flag, value, "-o", str(tmp_path / "p.json")]) == 2


def test_needs_exactly_one_criterion(frontier_file, tmp_path):
    path, _ = frontier_file
    out = str(tmp_path / "p.json")
    assert main(["plan", "pick", str(path), "-o", out]) == 2
    assert main(["plan", "pick", str(path), "--time-s", "1", "--slowdown", "2", "-o", out]) == 2


def test_missing_frontier_file_is_exit_2(tmp_path):
    assert (
        main(
            [
                "plan",
                "pick",
                str(tmp_path / "nope.json"),
                "--time-s",
                "1",
                "-o",
                str(tmp_path / "p.json"),
            ]
        )
        == 2
    )


def test_off_frontier_below_every_peak_without_power_figures_is_one_line(tmp_path, capsys):
    """A frontier without power figures (`perseus demo`'s) under an --off-frontier peak
    budget below every plan fell back to the points' peaks: an internal error."""
    path = tmp_path / "f.json"
    assert main(["frontier", "a100", "--microbatches", "4", "--no-progress", "-o", str(path)]) == 0
    frontier = read_frontier(path)
    points = tuple(p.model_copy(update={"power": None}) for p in frontier.points)
    write_frontier(frontier.model_copy(update={"points": points}), path)
    capsys.readouterr()
    argv = ["plan", "pick", str(path), "--peak-power-w", "1", "--off-frontier"]
    assert main([*argv, "-o", str(tmp_path / "p.json")]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: no plan found whose peak power is at most 1 W")
        and err.count("\n") == 1
    )
    assert not (tmp_path / "p.json").exists()
