"""A job's ranges and defaults are declared once (``perseus.validate.JOB_BOUNDS`` and
``JOB_DEFAULTS``, read by ``JobConfig`` and ``JobSpec``), and ``JobConfig`` validates its flags
and its TOML keys alike: both accept and refuse the same values, with the same words, and fall
back to the same defaults."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from perseus.cli._job_args import CONFIG_FIELDS, _merge, add_job_arguments
from perseus.cli.main import main
from perseus.errors import ConfigError
from perseus.io.config import JobConfig, read_job_config
from perseus.plan import JobSpec
from perseus.validate import JOB_BOUNDS, JOB_DEFAULTS, Bounds

_INTS = {"stages", "microbatches", "virtual_stages", "pipelines", "layers_per_stage"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_job_arguments(parser)
    return parser


def _edges(name: str, bounds: Bounds) -> list[tuple[float, bool]]:
    """Values at and just past each bound of ``name``, with whether they are accepted."""
    step = 1 if name in _INTS else 1e-9
    out: list[tuple[float, bool]] = []
    for bound, inside, outside in (
        (bounds.ge, 0, -step),
        (bounds.le, 0, step),
        (bounds.gt, step, 0),
        (bounds.lt, -step, 0),
    ):
        if bound is not None:
            out += [(bound + inside, True), (bound + outside, False)]
    return [(int(v) if name in _INTS else v, ok) for v, ok in out]


def _flag_accepts(name: str, value: float) -> bool:
    flag = "--" + name.replace("_", "-")
    try:
        _merge(_parser().parse_args(["a100", "--microbatches", "4", flag, str(value)]))
    except (argparse.ArgumentError, ConfigError):
        return False
    return True


def _key_accepts(name: str, value: float) -> bool:
    layers = name == "layers_per_stage"
    doc = {"profile": "a100", "microbatches": 4, name: [value] if layers else value}
    if name == "layer_time_fractions":
        doc[name] = [[value]]
    try:
        JobConfig.model_validate(doc)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(JOB_BOUNDS))
def test_a_key_and_its_flag_take_the_same_range(name: str) -> None:
    flags = {a.dest for a in _parser()._actions}
    for value, accepted in _edges(name, JOB_BOUNDS[name]):
        assert _key_accepts(name, value) is accepted, (name, value)
        if name in flags:
            assert _flag_accepts(name, value) is accepted, (name, value)


def test_a_key_and_its_flag_fall_back_to_the_same_defaults() -> None:
    config = JobConfig.model_validate({"profile": "a100", "microbatches": 4})
    for name, default in dataclasses.asdict(JOB_DEFAULTS).items():
        assert name in CONFIG_FIELDS
        assert getattr(config, name) == default, name
    # every flag leaves its default to the merge (None), so a config value can fill it in
    args = _parser().parse_args(["a100"])
    assert all(getattr(args, name, None) is None for name in CONFIG_FIELDS)


def test_edges_cover_both_sides_of_every_bound() -> None:
    for name, bounds in JOB_BOUNDS.items():
        edges = _edges(name, bounds)
        assert any(ok for _, ok in edges) and any(not ok for _, ok in edges), name
        assert all(math.isfinite(v) for v, _ in edges)


@pytest.mark.parametrize(
    ("key", "flag", "message"),
    [
        ("stages = 0", ["--stages", "0"], "Input should be greater than or equal to 1, got 0"),
        (
            "layers_per_stage = [12, 0]",  # the list side of `int | list[int]`, at its element
            ["--layers-per-stage", "12,0"],
            "[1]: Input should be greater than or equal to 1, got 0",
        ),
    ],
)
def test_a_bad_flag_and_a_bad_key_get_the_same_words(
    tmp_path: Path, key: str, flag: list[str], message: str
) -> None:
    config = tmp_path / "job.toml"
    config.write_text(f'profile = "a100"\nmicrobatches = 4\n{key}\n')
    with pytest.raises(ConfigError) as by_key:
        read_job_config(config)
    with pytest.raises(ConfigError) as by_flag:
        _merge(_parser().parse_args(["a100", "--microbatches", "4", *flag]))
    name = key.split()[0]
    sep = "" if message.startswith("[") else ": "
    assert str(by_flag.value) == f"--{name.replace('_', '-')}{sep}{message}"
    assert str(by_key.value) == f"{config}: key {name}{sep}{message}"


def test_a_bad_flag_exits_2_naming_the_flag_and_the_element(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["evaluate", "a100", "--microbatches", "4", "--layers-per-stage", "12,0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --layers-per-stage[1]: Input should be greater than or equal to 1, got 0"


_SPEC = {"schedule": "1f1b", "ranks": 4, "stages": 4, "microbatches": 4}
_SPEC |= {"blocking_power_w": 80.0, "profile_sha256": "0" * 64}
#: A plan file may record a switch energy past a config's range; the rest is the job's table.
_SPEC_OWN = {"switch_energy_j", "layer_time_fractions"}


@pytest.mark.parametrize(
    "name", sorted(JOB_BOUNDS.keys() & JobSpec.model_fields.keys() - _SPEC_OWN)
)
def test_a_plan_files_job_takes_the_same_ranges_and_defaults(name: str) -> None:
    for value, accepted in _edges(name, JOB_BOUNDS[name]):
        doc = _SPEC | {name: [value] if name == "layers_per_stage" else value}
        try:
            JobSpec.model_validate(doc)
        except ValidationError:
            assert not accepted, (name, value)
        else:
            assert accepted, (name, value)
    field = JobSpec.model_fields[name]
    if not field.is_required() and field.default is not None:
        assert field.default == getattr(JOB_DEFAULTS, name), name


def test_the_flags_merge_every_job_key_of_the_config() -> None:
    # a config's own keys (where the profile is, its words) and demo's --pipelines stay apart
    own = {"schema_version", "description", "profile", "pipelines"}
    assert set(CONFIG_FIELDS) == JobConfig.model_fields.keys() - own
