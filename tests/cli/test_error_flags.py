"""Library errors name parameters; the CLI turns them into the flags of the command that ran."""

from __future__ import annotations

import pytest

from perseus.cli.main import as_flags, build_parser, main
from perseus.errors import ConfigError, ScheduleError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.schedule import build_schedule


def test_library_errors_name_parameters_not_flags() -> None:
    with pytest.raises(ScheduleError) as info:
        build_schedule("1f1b", 0, 4)
    assert str(info.value) == "`stages` must be >= 1, got 0"
    with pytest.raises(ConfigError, match=r"but `stages` is 4; use `stages`=8 or"):
        make_job(load_profile("a100"), "1f1b", 4, 4, blocking_power_w=83.64)


def test_the_cli_rewrites_parameters_into_its_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["evaluate", "a100", "--microbatches", "4"])
    assert (
        as_flags("`stages` is 4; use `stages`=8", parser, args) == "--stages is 4; use --stages=8"
    )
    assert as_flags("`virtual_stages`=2 only", parser, args) == "--virtual-stages=2 only"
    # A parameter the command has no flag for loses its backquotes; aliases cover renames.
    assert (
        as_flags("`layer_time_fractions` needs it", parser, args) == "layer_time_fractions needs it"
    )
    set_args = parser.parse_args(
        ["straggler", "set", "--store", "h:1", "--pipeline", "0", "--time-s", "1"]
    )
    assert as_flags("`pipeline_index` and `time_s`", parser, set_args) == "--pipeline and --time-s"
    assert as_flags("`stages` bad", parser, None) == "stages bad"
    # An alias applies only where the command has that flag.
    assert as_flags("`pipeline_index` < 0", parser, args) == "pipeline_index < 0"


def test_a_library_error_reaches_the_terminal_with_the_flag(tmp_path, capsys) -> None:
    # The solver's cost model refuses two clocks per op without layers (a library error).
    argv = ["frontier", "a100", "--microbatches", "4", "-o", str(tmp_path / "f.json")]
    assert main([*argv, "--max-clocks-per-op", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: two clocks per op need the job's --layers-per-stage; give it or use "
        "--max-clocks-per-op=1\n"
    )


@pytest.mark.parametrize(
    ("keys", "flags", "said"),
    [
        ("layers_per_stage = [1, 2]", [], "{key} layers_per_stage has 2 entries but the job"),
        ("", ["--layers-per-stage", "1,2"], "--layers-per-stage has 2 entries but the job"),
        ("layer_time_fractions = [[1.0]]", [], "{key} layer_time_fractions needs layers_per_stage"),
        (
            "layers_per_stage = 2\nlayer_time_fractions = [[1.0]]",
            [],
            "{key} layer_time_fractions has 1 stages, the job has 8",
        ),
        (
            "max_clocks_per_op = 2",
            [],
            "{key} max_clocks_per_op: 2 clocks per op need the job's layers_per_stage; add "
            "layers_per_stage = N (or --layers-per-stage N), or set max_clocks_per_op = 1",
        ),
        ("max_clocks_per_op = 3", ["--layers-per-stage", "12"], None),
    ],
)
def test_a_two_clock_error_names_the_config_key_or_flag(
    tmp_path, capsys, keys: str, flags: list[str], said: str | None
) -> None:
    """The job's two-clock checks (layer counts and weights against the stages) name the
    config file and key, or the flag, that gave the bad value; before, only the bare name."""
    config = tmp_path / "job.toml"
    config.write_text(f'profile = "a100"\nmicrobatches = 4\n{keys}\n')
    argv = ["frontier", "--config", str(config), "-o", str(tmp_path / "f.json"), *flags]
    if said is None:  # layers from a flag: the config's phases are planned
        assert main(argv) == 0
        return
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + said.format(key=f"{config}: key")), err
    assert err.count("\n") == 1
