"""``perseus straggler-sweep``: prints and writes the saving table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.io.frontier_files import write_frontier
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint


@pytest.fixture
def frontier_file(tmp_path: Path) -> Path:
    job = JobSpec(
        schedule="1f1b", ranks=1, stages=1, microbatches=1, blocking_power_w=80, profile_sha256="x"
    )
    f = Frontier(
        job=job,
        stage_ops=(("F0", "B0"),),
        baseline=Baseline(time_s=1.0, energy_j=100.0),
        points=tuple(
            PlanPoint(time_s=t, energy_j=e, freqs_mhz=((1410, 1410),))
            for t, e in [(1.0, 95.0), (1.1, 85.0), (1.2, 80.0)]
        ),
    )
    p = tmp_path / "frontier.json"
    write_frontier(f, p)
    return p


def test_sweep_prints_and_writes(
    tmp_path: Path, frontier_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    argv = [
        "straggler-sweep",
        str(frontier_file),
        "--pipelines",
        "16",
        "--factors",
        "1.05:1.5:0.05",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| slowdown |" in printed and "| 1.50 |" in printed
    data = json.loads(out.read_text())
    assert data["pipelines"] == 16
    assert [c["factor"] for c in data["cases"]] == pytest.approx(
        [1.05 + 0.05 * i for i in range(10)]
    )
    assert all(0 < c["saving_vs_allmax"] < 1 for c in data["cases"])


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--pipelines", "1"], "--pipelines: expected an integer >= 2"),
        (["--pipelines", "4", "--factors", "0.5"], "outside [1, 1000]"),
        (["--pipelines", "4", "--factors", "a:b:c"], "not numbers"),
        ([], "--pipelines"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path,
    frontier_file: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    match: str,
) -> None:
    out = tmp_path / "sweep.json"
    assert main(["straggler-sweep", str(frontier_file), "-o", str(out), *extra]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()
