"""A job's ranges and defaults are declared once (``perseus.validate.JOB_BOUNDS`` and
``JOB_DEFAULTS``): its flags and its TOML keys accept and refuse the same values and fall back
to the same defaults."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest
from pydantic import ValidationError

from perseus.cli._job_args import CONFIG_FIELDS, add_job_arguments
from perseus.io.config import JobConfig
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
        _parser().parse_args(["a100", flag, str(value)])
    except argparse.ArgumentError:
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
        if name in flags and name != "layers_per_stage":  # its flag is a list: 12,12,...
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
