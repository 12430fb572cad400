"""Everyday use: command list, -o/--out everywhere, logging, progress off a terminal, the
4-stage path from a bundled profile to a plan, evaluate from the plan file."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli._progress import COMPILE_PHASE, progress_bar
from perseus.cli.main import COMMANDS, build_parser, main
from perseus.io import read_frontier
from perseus.log import configure_logging, get_logger, phase

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset_logging() -> None:
    yield
    configure_logging("WARNING")


def test_bare_perseus_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name.replace("_", "-") in out


@pytest.mark.parametrize(
    "argv",
    [
        ["demo"],
        ["frontier", "a100", "--microbatches", "4"],
        ["plan", "pick", "f.json", "--slowdown", "1"],
        ["report", "f.json"],
        ["export", "f.json", "--format", "zeus-pfo"],
        ["straggler-sweep", "f.json", "--pipelines", "4"],
        ["profile", "slice", "a100", "--stages", "4"],
    ],
)
@pytest.mark.parametrize("flag", ["-o", "--out", "--output"])
def test_every_writing_command_takes_o_and_out(argv: list[str], flag: str) -> None:
    args = build_parser().parse_args([*argv, flag, "target"])
    assert args.out == "target"


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_logs_what_happens(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = ["profile", "slice", "a100", "--stages", "4", "-o", str(tmp_path / "p.csv")]
    argv = ["-v", *cmd] if where == "before" else [*cmd, "-v"]
    assert main(argv) == 0
    assert "INFO perseus.cli.profile: slicing" in capsys.readouterr().err
    # quiet by default: nothing on stderr without -v
    assert main([*cmd[:-1], str(tmp_path / "q.csv")]) == 0
    assert capsys.readouterr().err == ""
    assert (
        main(
            [
                "--log-level",
                "debug",
                "frontier",
                str(tmp_path / "p.csv"),
                "--microbatches",
                "4",
                "--blocking-power-w",
                "80",
                "-o",
                str(tmp_path / "f.json"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "INFO perseus.cli.frontier: job: 1f1b, 4 stages x 4 microbatches" in err
    # stderr is not a terminal here: no progress-bar text, only log lines
    assert "|" not in err and "\r" not in err


def test_quiet_by_default_and_no_bar_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["frontier", "a100", "--microbatches", "4", "-o", str(tmp_path / "f.json")]) == 0
    assert capsys.readouterr().err == ""


def test_rank_prefix_and_phases() -> None:
    stream = io.StringIO()
    configure_logging("INFO", rank=3, stream=stream)
    get_logger("runtime.agent").info("clock set")
    with phase("tracing"):
        pass
    text = stream.getvalue()
    assert "[rank 3] INFO perseus.runtime.agent: clock set" in text
    assert "perseus.phase: tracing: done in" in text


@pytest.mark.parametrize("rank", ["9" * 5000, "\u00b2", "\u0663", "-1", " 3"])
def test_a_junk_rank_variable_is_no_rank(
    monkeypatch: pytest.MonkeyPatch, rank: str, tmp_path: Path
) -> None:
    """``RANK`` of 5,000 digits (past Python's int limit) or a superscript digit was an
    internal error of every command; a rank perseus cannot read is no rank."""
    monkeypatch.setenv("RANK", rank)
    out = tmp_path / "s.csv"
    assert main(["profile", "slice", "a100", "--stages", "4", "-o", str(out)]) == 0
    assert out.is_file()


def test_progress_labels_the_first_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    import perseus.cli._progress as prog

    monkeypatch.setattr(prog, "solver_kernels_cached", lambda: False)
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    with progress_bar("frontier", solve=True) as update:
        update(0.0)
        update(0.5)
    text = stream.getvalue()
    assert COMPILE_PHASE in text
    assert text.index(COMPILE_PHASE) < text.index("solver kernels compiled")
    assert logging.getLogger("perseus.phase").propagate


@pytest.mark.parametrize("propagate", [False, True])
def test_progress_leaves_the_phase_loggers_propagate_as_it_found_it(propagate: bool) -> None:
    """The bar turns the phase logger's propagation off while it raises its level; on exit
    it is what it was (a caller's False was turned to True)."""
    phase_logger = logging.getLogger("perseus.phase")
    before = phase_logger.propagate, phase_logger.level
    phase_logger.propagate = propagate
    phase_logger.setLevel(logging.WARNING)  # the bar raises it to INFO, turning propagation off
    try:
        with progress_bar("frontier", enabled=False) as update:
            assert not phase_logger.propagate
            update(1.0)
        assert phase_logger.propagate is propagate
        assert phase_logger.level == logging.WARNING
    finally:
        phase_logger.propagate, level = before
        phase_logger.setLevel(level)


def test_four_stage_model_to_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's path: slice the bundled 8-stage profile to 4 stages, plan, pick, evaluate."""
    p4, f, plan = tmp_path / "p4.csv", tmp_path / "f.json", tmp_path / "plan.json"
    assert main(["profile", "slice", "a100", "--stages", "4", "-o", str(p4)]) == 0
    assert (
        main(
            [
                "frontier",
                str(p4),
                "--microbatches",
                "8",
                "--blocking-power-w",
                "83.64",
                "-o",
                str(f),
            ]
        )
        == 0
    )
    assert main(["plan", "pick", str(f), "--slowdown", "1", "-o", str(plan)]) == 0
    (point,) = read_frontier(plan).points
    assert len(point.freqs_mhz) == 4
    capsys.readouterr()
    # the job comes from the plan file; the profile is given because it is not bundled
    assert main(["evaluate", str(p4), "--plan", str(plan)]) == 0
    from_plan = capsys.readouterr().out
    assert (
        main(
            [
                "evaluate",
                str(p4),
                "--microbatches",
                "8",
                "--blocking-power-w",
                "83.64",
                "--plan",
                str(plan),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == from_plan
    assert f"time_s:   {point.time_s:.6f}" in from_plan


def test_evaluate_reads_the_job_from_a_bundled_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f, plan = tmp_path / "f.json", tmp_path / "plan.json"
    assert main(["frontier", "a100", "--microbatches", "4", "-o", str(f)]) == 0
    assert main(["plan", "pick", str(f), "--slowdown", "1.05", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "1f1b 8 stages x 4 microbatches" in out


@pytest.mark.slow
def test_unreachable_store_is_one_line_without_torch_frames() -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perseus.cli",
            "straggler",
            "set",
            "--store",
            "127.0.0.1:1",
            "--pipeline",
            "0",
            "--time-s",
            "1",
            "--timeout-s",
            "0.2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --store '127.0.0.1:1': cannot connect")
    assert "frame #" not in proc.stderr


def test_logging_follows_a_replaced_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configured once, logging writes to whatever stderr is now (a closed earlier one is
    never written to)."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("WARNING")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    get_logger("device.ownership").warning("previous owner died")
    assert "WARNING perseus.device.ownership: previous owner died" in second.getvalue()


def test_fleet_status_does_not_create_a_fleet(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`perseus fleet status` at a path with no database (sqlite:/// with three slashes makes
    an absolute path relative) is one error line, and creates nothing; before, it created the
    directories and an empty database and printed "budget none, plan 0"."""
    missing = tmp_path / "no" / "fleet.db"
    assert main(["fleet", "status", "--db", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --db sqlite:///{missing}: no fleet database at {missing}; ")
    assert err.count("\n") == 1 and not (tmp_path / "no").exists()


@pytest.mark.parametrize("name", ["a\nb.json", "a\rb.json", "a\x1b[2Jb.json"])
def test_control_characters_in_a_path_are_escaped_in_the_error(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file named with a newline or a terminal escape: the error is one line that keeps its
    reason (before, it was cut at the newline: "error: a"), and nothing reaches the terminal
    raw."""
    (tmp_path / name).write_text("not json")
    argv = ["frontier", str(tmp_path / name), "--microbatches", "4", "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    shown = repr(name)[1:-1]
    assert err == f"error: {tmp_path}/{shown}:1:1: invalid JSON (Expecting value)\n"
    assert not (tmp_path / "o").exists()


def test_a_schedule_grid_is_the_detail_under_a_one_line_message() -> None:
    """The validator's grid is the error's `detail`: `str(error)` shows it under the message,
    the CLI prints the message alone (escaping any newline in it) and logs the grid."""
    from perseus.errors import ScheduleError
    from perseus.schedule import Action, Kind, one_f_one_b, schedule_from_actions

    acts = [list(rank) for rank in one_f_one_b(2, 2).rank_actions]
    acts[0].append(Action(0, Kind.F, 1))
    with pytest.raises(ScheduleError) as info:
        schedule_from_actions("x", acts, 2, 2)
    error = info.value
    assert "\n" not in error.message and "0F1 appears 2 times" in error.message
    assert "0F1!" in error.detail and str(error) == f"{error.message}\n{error.detail}"
