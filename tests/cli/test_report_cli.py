"""``perseus report``: the demo's report for a frontier file, with predicted vs measured."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.io.bundled import load_profile
from perseus.io.frontier_files import write_frontier
from perseus.job import make_job
from perseus.report import REPORT_FILES


@pytest.fixture(scope="module")
def frontier_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from perseus.solver import trace_frontier

    job = make_job(
        load_profile("a100"),
        "1f1b",
        8,
        8,
        blocking_power_w=83.64,
        profile_name="gpt3-175b+a100_sxm_bf16",
    )
    path = tmp_path_factory.mktemp("frontier") / "frontier.json"
    write_frontier(trace_frontier(job), path)
    return path


def _run_summary(tmp_path: Path, frontier_file: Path) -> Path:
    """A run's summary of the frontier's job (its all-max and fastest plan, measured +1 %)."""
    doc = json.loads(frontier_file.read_text())
    base, fast = doc["baseline"], doc["points"][0]
    p = tmp_path / "run.json"
    p.write_text(
        json.dumps(
            {
                "kind": "perseus.run-summary",
                "predicted": {"time_s": fast["time_s"], "energy_j": fast["energy_j"]},
                "measured": {"time_s": fast["time_s"] * 1.01, "energy_j": fast["energy_j"] * 1.01},
                "allmax": {
                    "predicted": {"time_s": base["time_s"], "energy_j": base["energy_j"]},
                    "measured": {
                        "time_s": base["time_s"] * 1.01,
                        "energy_j": base["energy_j"] * 1.01,
                    },
                },
            }
        )
    )
    return p


def test_report_with_measured_run(
    tmp_path: Path, frontier_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    argv = [
        "report",
        str(frontier_file),
        "--summary",
        str(_run_summary(tmp_path, frontier_file)),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    page = (out / "report.html").read_text()
    assert "Predicted vs measured" in page
    assert page.count("data:image/png;base64,") == 4  # frontier, timeline, power, straggler
    assert "energy saved at T*" in capsys.readouterr().out


def test_report_directories_under_umask_0_are_not_writable_by_others(
    tmp_path: Path, frontier_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mkdir -p`` under umask 0 makes 0777 directories; the report's and its missing
    parent are 0755."""
    mask = os.umask(0)
    try:
        assert main(["report", str(frontier_file), "--out", str(tmp_path / "p" / "r")]) == 0
    finally:
        os.umask(mask)
    for made in (tmp_path / "p", tmp_path / "p" / "r"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o755


def test_report_without_profile_skips_timeline(tmp_path: Path, frontier_file: Path) -> None:
    data = json.loads(frontier_file.read_text())
    data["job"]["profile_name"] = "not-a-bundled-profile"
    other = tmp_path / "f.json"
    other.write_text(json.dumps(data))
    out = tmp_path / "r"
    assert main(["report", str(other), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert "timeline.png" not in names and "frontier.png" in names


@pytest.mark.parametrize(
    ("make_args", "match"),
    [
        (lambda d, f: ["report", str(d / "missing.json"), "--out", str(d / "r")], "file not found"),
        (
            lambda d, f: [
                "report",
                str(f),
                "--out",
                str(d / "r"),
                "--summary",
                str(d / "nope.json"),
            ],
            "file not found",
        ),
        (lambda d, f: ["report", str(f), "--out", str(d / "r"), "--profile", "a40"], "another job"),
        (lambda d, f: ["report", str(f), "--out", str(d / "r"), "--pipelines", "1"], "pipelines"),
        (lambda d, f: ["report", str(f)], "--out"),
    ],
)
def test_bad_inputs_exit_2_without_output(
    tmp_path: Path,
    frontier_file: Path,
    capsys: pytest.CaptureFixture[str],
    make_args: Callable[[Path, Path], list[str]],
    match: str,
) -> None:
    assert main(make_args(tmp_path, frontier_file)) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_bad_summary_file_exit_2(
    tmp_path: Path, frontier_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "run.json"
    bad.write_text('{"predicted": {"time_s": 1}}')
    assert (
        main(["report", str(frontier_file), "--summary", str(bad), "--out", str(tmp_path / "r")])
        == 2
    )
    err = capsys.readouterr().err
    assert str(bad) in err and "expected" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("field", ["time_s", "energy_j"])
def test_summary_figure_past_the_plan_files_bound_exit_2(
    tmp_path: Path, frontier_file: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """A measured figure beyond what a plan file accepts (1e7 s, 1e15 J: a corrupted file) is
    one error line naming the field; before, 1e308 was plotted (numpy's overflow warnings on
    stderr) and the report written with exit 0."""
    run = _run_summary(tmp_path, frontier_file)
    doc = json.loads(run.read_text())
    doc["measured"][field] = 1e308
    run.write_text(json.dumps(doc))
    out = tmp_path / "r"
    assert main(["report", str(frontier_file), "--summary", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run}: field measured.{field}: ") and err.count("\n") == 1
    assert not out.exists()
