"""TOML job configs: every shipped config loads and builds its job; bad ones fail in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.errors import ConfigError
from perseus.io.bundled import load_profile
from perseus.io.config import JobConfig, read_job_config, resolve_config_profile
from perseus.job import make_job
from tests.conftest import REPO

CONFIGS = sorted((REPO / "configs").glob("*.toml"))


def test_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"gpt3-a100-1f1b-8x24.toml", "gpt3-a100-1f1b-8x96.toml", "small-ci.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_loads_and_builds_its_job(path: Path) -> None:
    config, where = read_job_config(path)
    assert config.description, "every shipped config says what it is"
    profile = load_profile(resolve_config_profile(config, where))
    job = make_job(
        profile,
        config.schedule,
        config.stages or profile.num_stages,
        config.microbatches,
        blocking_power_w=config.blocking_power_w if config.blocking_power_w is not None else 83.64,
        virtual_stages=config.virtual_stages,
        p2p_latency_s=config.p2p_latency_s,
        backward_split=config.backward_split,
    )
    assert job.spec.microbatches == config.microbatches
    assert job.evaluate(job.allmax()).time_s > 0


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_cli_accepts_config(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--config", str(path)]) == 0
    config, _ = read_job_config(path)
    assert f"x {config.microbatches} microbatches" in capsys.readouterr().out


def test_flags_override_config(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "configs" / "small-ci.toml"
    assert (
        main(["evaluate", "--config", str(path), "--microbatches", "4", "--schedule", "gpipe"]) == 0
    )
    assert "gpipe 8 stages x 4 microbatches" in capsys.readouterr().out


def test_without_config_profile_and_microbatches_are_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["evaluate", "--microbatches", "4"]) == 2
    assert "no profile given" in capsys.readouterr().err
    assert main(["evaluate", "a100"]) == 2
    assert "--microbatches: required" in capsys.readouterr().err


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_bytes(text.encode("utf-8", "surrogateescape"))  # "\udcff": the byte 0xff
    return p


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            'profile = "a100"\nmicrobatches = 8\nmicrobatch = 9\n',
            "unknown key 'microbatch'; remove it",
        ),
        ('profile = "a100"\n', "missing key 'microbatches'"),
        ('profile = "a100"\nmicrobatches = 0\n', "key microbatches"),
        ('profile = "a100"\nmicrobatches = 8\nschedule = "1f2b"\n', "key schedule"),
        ('profile = "a100"\nmicrobatches = 8\nblocking_power_w = -1\n', "key blocking_power_w"),
        ('profile = "a100"\nmicrobatches = [8\n', "invalid TOML"),
        # Python's int limit (4300 digits) raises a plain ValueError from tomllib.
        ('profile = "a100"\nmicrobatches = ' + "9" * 5000 + "\n", "invalid TOML .*digits"),
        (
            'profile = "a100"\nmicrobatches = 4 # \udcff\n',
            r"job\.toml:2: not valid UTF-8 text; pass",
        ),
    ],
)
def test_bad_config_names_file_and_field(tmp_path: Path, text: str, match: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        read_job_config(p)
    message = str(info.value)
    assert message.startswith(str(p))
    assert "\n" not in message


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        read_job_config(tmp_path / "nope.toml")
    assert main(["evaluate", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_relative_profile_path_resolves_next_to_config(tmp_path: Path) -> None:
    src = REPO / "perseus" / "data" / "profiles" / "gpt3-175b+a40_bf16.csv"
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.csv").write_bytes(src.read_bytes())
    p = _write(tmp_path, 'profile = "profiles/mine.csv"\nmicrobatches = 4\nblocking_power_w = 70\n')
    config, where = read_job_config(p)
    assert resolve_config_profile(config, where) == str(tmp_path / "profiles" / "mine.csv")
    bundled = JobConfig(profile="a100", microbatches=4)
    assert resolve_config_profile(bundled, p) == "a100"


def test_config_is_frozen() -> None:
    config = JobConfig(profile="a100", microbatches=4)
    with pytest.raises(ValueError, match="frozen"):
        config.microbatches = 5  # type: ignore[misc]


def test_layer_weights_above_one_are_relative_as_in_make_job(tmp_path: Path) -> None:
    """A TOML's layer_time_fractions refused a weight above 1 ("less than or equal to 1"),
    while make_job, plan files and the docs take relative weights in (0, 1e6]."""
    fractions = "[" + ", ".join(["[2.0, 1.0]"] * 8) + "]"
    path = tmp_path / "c.toml"
    path.write_text(
        f'profile = "a100"\nmicrobatches = 4\nlayers_per_stage = 2\nlayer_time_fractions = {fractions}\n'
    )
    config, _ = read_job_config(path)
    assert config.layer_time_fractions == [[2.0, 1.0]] * 8
    path.write_text(path.read_text().replace("2.0", "2e6", 1))
    with pytest.raises(
        ConfigError, match=r"key layer_time_fractions\[0\]\[0\]: .*less than or equal to 1000000"
    ):
        read_job_config(path)
