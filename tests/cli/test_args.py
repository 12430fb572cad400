"""The shared validators: flag types, value checks, size bound, message length."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus.cli._args import float_arg, int_arg
from perseus.cli.main import main
from perseus.errors import ConfigError
from perseus.validate import (
    MAX_JOB_OPS,
    check_job_size,
    clip_message,
    show_value,
)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_float_arg_accepts_exactly_finite_values_in_range(x: float) -> None:
    parse = float_arg(gt=0, le=1e6)
    ok = math.isfinite(x) and 0 < x <= 1e6
    if ok:
        assert parse(repr(x)) == x
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number > 0"):
            parse(repr(x))


@given(st.integers())
def test_int_arg_accepts_exactly_integers_in_range(n: int) -> None:
    parse = int_arg(ge=1, le=1000)
    if 1 <= n <= 1000:
        assert parse(str(n)) == n
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="expected an integer >= 1"):
            parse(str(n))


@pytest.mark.parametrize("text", ["1.0", "1e3", "0x10", "true", "", " ", "²", "1_000", "nan"])
def test_int_arg_refuses_non_integers(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        int_arg(ge=0)(text)


@pytest.mark.parametrize("text", ["٣", "１", "3٣", "-٣"])
def test_number_args_refuse_digits_other_than_ascii(text: str) -> None:
    """int() and float() read an Arabic-Indic or fullwidth digit as its value: `--set-w ٣`
    set a 3 W budget, and a fullwidth digit passed for another."""
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer"):
        int_arg()(text)
    with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number"):
        float_arg()(text)


def test_size_bound_names_the_source_and_memory() -> None:
    check_job_size("--microbatches", "1f1b", 32, 512, clocks=38)  # the largest benchmarked job
    with pytest.raises(ConfigError, match=r"--microbatches: job too large .* GB estimated"):
        check_job_size("--microbatches", "1f1b", 8, MAX_JOB_OPS, clocks=38)
    with pytest.raises(ConfigError, match=r"job.toml: key microbatches"):
        check_job_size("job.toml: key microbatches", "zb", 64, 100_000, clocks=60)


def test_messages_and_values_are_cut() -> None:
    assert len(clip_message("x" * 8_000_000)) <= 600
    # A path of thousands of characters keeps the reason and the fix after it.
    clipped = clip_message(
        "/" + "d" * 5000 + ": cannot read file (File name too long); pass a path"
    )
    assert clipped.startswith("/ddd") and clipped.endswith("(File name too long); pass a path")
    assert "[message cut, 5053 characters]" in clipped and len(clipped) <= 600
    shown = show_value("y" * 5000)
    assert len(shown) < 80 and "(5002 characters)" in shown
    # repr() refuses an int of over 4,300 digits, alone or inside a value (ValueError).
    assert show_value(10**5000) == "an integer of 16,610 bits"
    assert show_value((1.0, 10**5000)) == "a tuple too long to show"


@pytest.mark.parametrize(
    "argv",
    [["--sim-dir", "", "info"], ["--sim-dir", " ", "info"], ["reset", "--uuid", " "]],
)
def test_device_refuses_a_blank_directory_or_uuid(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--sim-dir '' was the current directory and ' ' a new directory named ' ' there."""
    monkeypatch.chdir(tmp_path)
    assert main(["device", *argv]) == 2
    err = capsys.readouterr().err
    blank = argv[1] if argv[0] == "--sim-dir" else argv[2]
    assert err.count("\n") == 1 and f"expected a non-empty value, got {blank!r}" in err
    assert not list(tmp_path.iterdir())


def _frontier_command(tmp_path: Path, out: Path) -> list[str]:
    config = tmp_path / "job.toml"
    config.write_text('profile = "a100"\nmicrobatches = 4\n')
    return ["frontier", "--config", str(config), "--no-progress", "-o", str(out)]


def test_an_input_named_as_the_output_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan pick F -o F` (and each command writing a file) replaced its input with its
    output: the frontier, profile, signal or config was lost."""
    frontier = tmp_path / "f.json"
    assert main(_frontier_command(tmp_path, frontier)) == 0
    config = tmp_path / "job.toml"
    profile = tmp_path / "p.csv"
    assert main(["profile", "slice", "a100", "--stages", "4", "-o", str(profile)]) == 0
    signal = tmp_path / "signal.csv"
    signal.write_text("start,price_per_mwh\n0,10\n3600,20\n")
    link = tmp_path / "link.json"
    link.symlink_to(frontier)
    f, c = str(frontier), str(config)
    runs = [
        (["plan", "pick", f, "--slowdown", "1.1", "-o", f], frontier, "FRONTIER.json"),
        (["plan", "pick", f, "--slowdown", "1.1", "-o", str(link)], frontier, "FRONTIER.json"),
        (["straggler-sweep", f, "--pipelines", "2", "-o", f], frontier, "FRONTIER.json"),
        (
            ["profile", "slice", str(profile), "--stages", "2", "-o", str(profile)],
            profile,
            "PROFILE",
        ),
        (
            [*_schedule(f, signal), "-o", str(signal)],
            signal,
            "--signal",
        ),
        (
            [*_frontier_command(tmp_path, tmp_path / "g.json"), "--power-curve", c],
            config,
            "--config",
        ),
    ]
    for argv, kept, name in runs:
        before = kept.read_bytes()
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"the same file as the input {name} " in err, err
        assert kept.read_bytes() == before


def _schedule(frontier: str, signal: Path) -> list[str]:
    return [
        "plan",
        "schedule",
        frontier,
        "--signal",
        str(signal),
        "--iterations",
        "1",
        "--deadline-s",
        "3600",
    ]
