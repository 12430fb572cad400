"""``perseus export --format zeus-pfo``: Zeus PFO frequency schedules from a frontier."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.io.frontier_files import read_frontier, write_frontier
from perseus.io.zeus_export import ZEUS_PFO_FILES, zeus_frequency_schedules
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint


def _frontier() -> Frontier:
    job = JobSpec(
        schedule="1f1b",
        ranks=2,
        stages=2,
        microbatches=2,
        blocking_power_w=80,
        profile_sha256="0" * 64,
    )
    ops = (("F0", "F1", "B0", "B1"), ("F0", "B0", "F1", "B1"))
    return Frontier(
        job=job,
        stage_ops=ops,
        baseline=Baseline(time_s=1.0, energy_j=100.0),
        points=(
            PlanPoint(time_s=1.0, energy_j=90.0, freqs_mhz=((1410, 1200, 1410, 1395), (1410,) * 4)),
            PlanPoint(time_s=1.2, energy_j=80.0, freqs_mhz=((1005,) * 4, (990, 1005, 1020, 1035))),
        ),
    )


@pytest.fixture
def frontier_file(tmp_path: Path) -> Path:
    p = tmp_path / "frontier.json"
    write_frontier(_frontier(), p)
    return p


def test_schedules_follow_stage_ops() -> None:
    f = _frontier()
    scheds = zeus_frequency_schedules(f, f.points[0])
    assert scheds[0] == {
        "rank": 0,
        "frequencies": [
            ["forward", 1410],
            ["forward", 1200],
            ["backward", 1410],
            ["backward", 1395],
        ],
    }
    assert [s["rank"] for s in scheds] == [0, 1]


@pytest.mark.parametrize(
    ("extra", "index"),
    [
        ([], 0),
        (["--plan", "min-energy"], 1),
        (["--plan", "1"], 1),
        (["--max-time-s", "1.1"], 0),
        (["--max-time-s", "5"], 1),
    ],
)
def test_export_writes_zeus_files(
    tmp_path: Path, frontier_file: Path, extra: list[str], index: int
) -> None:
    out = tmp_path / "zeus"
    assert main(["export", str(frontier_file), "--format", "zeus-pfo", "-o", str(out), *extra]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(ZEUS_PFO_FILES)
    f = _frontier()
    point = f.points[index]
    sched = json.loads((out / "0.sched.json").read_text())
    assert [[freq for _, freq in s["frequencies"]] for s in sched] == [
        list(r) for r in point.freqs_mhz
    ]
    solution = ast.literal_eval((out / "point_solution.py").read_text())
    assert solution == [[tuple(f) for f in s["frequencies"]] for s in sched]
    assert read_frontier(out / "perseus_plan.json").points == (point,)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--plan", "7"], "points 0..1"),
        (["--plan", "cheapest"], "fastest, min-energy"),
        (["--max-time-s", "0.5"], "below the fastest"),
        (["--format", "zeus"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_without_output(
    tmp_path: Path,
    frontier_file: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    match: str,
) -> None:
    out = tmp_path / "zeus"
    argv = ["export", str(frontier_file), "-o", str(out), *extra]
    if "--format" not in extra:
        argv += ["--format", "zeus-pfo"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not out.exists()


def test_bad_frontier_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "f.json"
    bad.write_text("{}")
    assert main(["export", str(bad), "--format", "zeus-pfo", "-o", str(tmp_path / "z")]) == 2
    assert str(bad) in capsys.readouterr().err
    assert not (tmp_path / "z").exists()
