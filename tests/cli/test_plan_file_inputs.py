"""Bad plan/frontier files and flags of the commands that read them: one line naming the file,
the field (or flag) and the fix, exit code 2, nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from perseus.cli.main import main
from perseus.io.frontier_files import write_frontier
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint, points_sha256


def _frontier() -> Frontier:
    job = JobSpec(
        schedule="1f1b",
        ranks=2,
        stages=2,
        microbatches=2,
        blocking_power_w=80,
        profile_sha256="0" * 64,
    )
    return Frontier(
        job=job,
        stage_ops=(("F0", "F1", "B0", "B1"), ("F0", "B0", "F1", "B1")),
        baseline=Baseline(time_s=1.0, energy_j=100.0),
        points=(
            PlanPoint(time_s=1.0, energy_j=90.0, freqs_mhz=((1410,) * 4, (1410,) * 4)),
            PlanPoint(time_s=1.2, energy_j=80.0, freqs_mhz=((1005,) * 4, (990,) * 4)),
        ),
    )


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    """``doc`` as a plan file with its points' digest brought up to date."""
    points = [PlanPoint.model_validate(p) for p in doc["points"]]
    doc["points_sha256"] = points_sha256(points)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    return path


def _doc(tmp_path: Path) -> dict[str, Any]:
    write_frontier(_frontier(), tmp_path / "good.json")
    doc: dict[str, Any] = json.loads((tmp_path / "good.json").read_text())
    return doc


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err, err
    return err


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"layers_per_stage": [1, 1, 1]}, "field job.layers_per_stage: layers_per_stage has 3"),
        ({"layer_time_fractions": [[1.0]]}, "field job.layer_time_fractions: set without"),
    ],
)
def test_layer_split_that_does_not_fit_the_job_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], job: dict[str, Any], field: str
) -> None:
    doc = _doc(tmp_path)
    doc["job"].update(job)
    path = _write(tmp_path, doc)
    out = tmp_path / "plan.json"
    err = _one_line_error(capsys, ["plan", "pick", str(path), "--time-s", "5", "-o", str(out)])
    assert f"{path}: {field}" in err and "regenerate it" in err
    assert not out.exists()


def test_export_of_a_two_clock_point_names_the_file_point_and_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(tmp_path)
    doc["job"]["layers_per_stage"] = [2, 2]
    doc["points"][1]["freqs_mhz"][1][2] = [990, 1005, 1]
    path = _write(tmp_path, doc)
    out = tmp_path / "zeus"
    argv = ["export", str(path), "--format", "zeus-pfo", "-o", str(out), "--plan", "1"]
    err = _one_line_error(capsys, argv)
    assert f"{path}: field points.1.freqs_mhz: rank 1 op 2 (F1) has a two-clock setting" in err
    assert "--plan" in err
    assert not out.exists()
    assert main([*argv[:-1], "0"]) == 0  # the one-clock point exports


@pytest.mark.parametrize("plan", ["\u0663", "\uff11", "-1", "+1", "9" * 5000])
def test_export_plan_index_is_ascii_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plan: str
) -> None:
    path = _write(tmp_path, _doc(tmp_path))
    out = tmp_path / "zeus"
    argv = ["export", str(path), "--format", "zeus-pfo", "-o", str(out), "--plan", plan]
    err = _one_line_error(capsys, argv)
    assert "--plan" in err and "use fastest, min-energy or an index 0..1" in err
    assert not out.exists()


def test_peak_pick_on_points_without_power_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(tmp_path)
    for point in doc["points"]:
        point.pop("power", None)
    doc["schema_version"] = 2
    path = _write(tmp_path, doc)
    out = tmp_path / "plan.json"
    argv = ["plan", "pick", str(path), "--peak-power-w", "500", "-o", str(out)]
    err = _one_line_error(capsys, argv)
    assert f"{path}: field points.0.power: missing" in err and "--power-cap-w" in err
    assert not out.exists()


def test_report_of_a_profile_name_the_font_cannot_draw_warns_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(tmp_path)
    doc["job"]["profile_name"] = "\u6a21\u578b\x00"  # glyphs DejaVu Sans lacks
    path = _write(tmp_path, doc)
    out = tmp_path / "report"
    assert main(["report", str(path), "-o", str(out)]) == 0  # warnings are errors under pytest
    assert capsys.readouterr().err == ""
    assert (out / "frontier.png").is_file() and (out / "report.html").is_file()


@pytest.mark.parametrize(
    ("budget", "per_gpu", "least"), [("1", [], "160 W"), ("1", ["--per-gpu"], "80 W")]
)
def test_peak_budget_below_waiting_power_is_refused_not_advised(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    budget: str,
    per_gpu: list[str],
    least: str,
) -> None:
    doc = _doc(tmp_path)
    for point in doc["points"]:
        avg = point["energy_j"] / point["time_s"]
        point["power"] = {
            "avg_power_w": avg,
            "peak_power_w": 200.0,
            "min_power_w": 0,
            "max_step_w": 0,
        }
    path = _write(tmp_path, doc)
    out = tmp_path / "plan.json"
    argv = ["plan", "pick", str(path), "--peak-power-w", budget, *per_gpu, "-o", str(out)]
    assert main(argv) == 1  # infeasible
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nvidia-smi" not in err
    assert f"blocking_power_w); pass --peak-power-w of at least {least}" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["points"].reverse(), "field <root>: points must be sorted by time_s"),
        (lambda d: d["job"].update(ranks=10**18), "field job.ranks: Input should be less"),
        (lambda d: d["points"][0].update(time_s="1"), "field points.0.time_s: Input should be"),
    ],
)
def test_schema_errors_say_how_to_fix_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, field: str
) -> None:
    doc = _doc(tmp_path)
    edit(doc)
    doc.pop("points_sha256")
    doc["schema_version"] = 1  # no digest to fail first
    for point in doc["points"]:
        point.pop("power", None)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "plan.json"
    err = _one_line_error(capsys, ["plan", "pick", str(path), "--time-s", "5", "-o", str(out)])
    assert f"{path}: {field}" in err and "Value error" not in err
    assert err.endswith(
        "; regenerate it with `perseus frontier` (or `perseus plan pick` for a plan)\n"
    )
    assert not out.exists()


def test_a_key_named_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(tmp_path)
    text = json.dumps(doc).replace('"ranks": 2,', '"ranks": 2, "ranks": 2,', 1)
    path = tmp_path / "f.json"
    path.write_text(text)
    out = tmp_path / "plan.json"
    err = _one_line_error(capsys, ["plan", "pick", str(path), "--time-s", "5", "-o", str(out)])
    assert f"{path}: key 'ranks' appears twice in one object" in err and "keep one" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("iterations", "10", "field iterations: Input should be a valid integer, got '10'"),
        ("segments", [[False, True]], "field segments.0.0: Input should be a valid integer"),
        ("origin_utc", "noon", "field origin_utc: Input should be a valid datetime"),
    ],
)
def test_schedule_file_types_are_strict(tmp_path: Path, key: str, value: Any, field: str) -> None:
    from perseus.errors import PlanError
    from perseus.io.power_files import read_schedule

    frontier = tmp_path / "f.json"
    write_frontier(_frontier(), frontier)
    (tmp_path / "signal.csv").write_text("start,value\n0,10\n3600,20\n")
    schedule = tmp_path / "schedule.json"
    argv = ["plan", "schedule", str(frontier), "--signal", str(tmp_path / "signal.csv")]
    argv += [
        "--iterations",
        "10",
        "--deadline-s",
        "100",
        "--idle-power-w",
        "0",
        "-o",
        str(schedule),
    ]
    assert main(argv) == 0
    assert read_schedule(schedule).iterations == 10
    doc = json.loads(schedule.read_text())
    doc[key] = value
    schedule.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="^" + re.escape(f"{schedule}: {field}")):
        read_schedule(schedule)


def test_a_clock_switch_inside_an_op_needs_layers_per_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(tmp_path)
    doc["points"][1]["freqs_mhz"][1][2] = [990, 1005, 1]  # the job has no layers_per_stage
    path = _write(tmp_path, doc)
    out = tmp_path / "plan.json"
    err = _one_line_error(capsys, ["plan", "pick", str(path), "--time-s", "5", "-o", str(out)])
    assert f"{path}: field points.1.freqs_mhz: switches clock inside an op" in err
    assert not out.exists()


def test_a_byte_order_mark_is_read_past_as_in_profiles(tmp_path: Path) -> None:
    write_frontier(_frontier(), tmp_path / "good.json")
    path = tmp_path / "bom.json"
    path.write_bytes(
        b"\xef\xbb\xbf" + (tmp_path / "good.json").read_bytes().replace(b"\n", b"\r\n")
    )
    out = tmp_path / "plan.json"
    assert main(["plan", "pick", str(path), "--time-s", "5", "-o", str(out)]) == 0
    assert out.is_file()


def test_a_torch_schedule_plan_rebuilt_on_a_profile_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A frontier of a torch schedule (its name recorded as the job's schedule) said "unknown
    schedule 'ScheduleFoo'; choose one of ..." without the file, from commands that rebuild
    the job on a profile."""
    frontier = tmp_path / "f.json"
    assert main(["frontier", "a100", "--microbatches", "4", "-o", str(frontier)]) == 0
    doc = json.loads(frontier.read_text())
    doc["job"]["schedule"] = "ScheduleFoo"
    frontier.write_text(json.dumps(doc))
    capsys.readouterr()
    out = tmp_path / "plan.json"
    argv = ["plan", "pick", str(frontier), "--peak-power-w", "9000", "--off-frontier"]
    err = _one_line_error(capsys, [*argv, "-o", str(out)])
    assert err.startswith(f"error: {frontier}: field job.schedule: 'ScheduleFoo' is not one of")
    assert not out.exists()
