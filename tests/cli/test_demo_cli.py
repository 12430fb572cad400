"""``perseus demo``: a full report on a small job; bad arguments leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.report import REPORT_FILES
from tests.conftest import REPO

SMALL = str(REPO / "configs" / "small-ci.toml")


@pytest.mark.slow
def test_demo_on_small_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["demo", "--config", SMALL, "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    for name in ("frontier.png", "timeline.png", "straggler.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "report-summary.json").read_text())
    assert summary["job"]["microbatches"] == 8
    assert summary["straggler"]["pipelines"] == 4  # from the config
    printed = capsys.readouterr().out
    assert f"{100 * summary['fastest']['energy_saving']:.1f} %" in printed
    assert "energy saved at T*" in printed and "straggler" in printed
    # Running again replaces the previous report (it only holds files perseus wrote).
    assert (
        main(["demo", "--config", SMALL, "--out", str(out), "--no-progress", "--pipelines", "8"])
        == 0
    )
    assert json.loads((out / "report-summary.json").read_text())["straggler"]["pipelines"] == 8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp dirs left"


@pytest.mark.slow
def test_demo_says_its_time_leaves_out_the_first_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import perseus.cli._progress as progress

    argv = ["demo", "--config", SMALL, "--out", str(tmp_path / "r"), "--no-progress"]
    monkeypatch.setattr(progress, "solver_kernels_cached", lambda: False)
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "; planning and the report, start-up and " in last
    assert " s compiling the solver kernels (first run only) not counted, in " in last
    monkeypatch.setattr(progress, "solver_kernels_cached", lambda: True)
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "; planning and the report, start-up not counted, in " in last


def test_demo_defaults_are_the_issue_job() -> None:
    from perseus.cli.demo import DEMO_JOB

    assert DEMO_JOB["profile"] == "a100" and DEMO_JOB["schedule"] == "1f1b"
    assert (DEMO_JOB["stages"], DEMO_JOB["microbatches"]) == (8, 24)


@pytest.mark.parametrize(
    "extra",
    [
        ["--microbatches", "0"],
        ["--pipelines", "1"],
        ["--factors", "1.5:1.0:0.1"],
        ["--factors", "x"],
        ["--config", "does-not-exist.toml"],
        ["--bogus"],
    ],
)
def test_bad_arguments_exit_2_without_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    out = tmp_path / "report"
    argv = ["demo", "--out", str(out), "--no-progress", *extra]
    if "--config" not in extra:
        argv += ["--config", SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_bad_config_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('profile = "a100"\nmicrobatches = 8\ncolour = "red"\n')
    assert main(["demo", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_refuses_to_replace_foreign_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert main(["demo", "--config", SMALL, "--out", str(out), "--no-progress"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "precious"
    file_out = tmp_path / "file"
    file_out.write_text("x")
    assert main(["demo", "--config", SMALL, "--out", str(file_out), "--no-progress"]) == 2
    assert file_out.read_text() == "x"
