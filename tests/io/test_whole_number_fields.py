"""A schema version (and a TOML's max_clocks_per_op) must be written as an integer: pydantic's
``Literal[1]`` alone took ``true`` and ``1.0`` for 1, so a file edited to ``true`` read as a
version-1 file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from perseus.errors import ConfigError
from perseus.identity import GpuIdentity
from perseus.io import read_frontier, write_frontier
from perseus.io.bundled import load_profile
from perseus.io.config import read_job_config
from perseus.io.profile_files import read_profile, write_profile_json
from perseus.job import make_job
from perseus.solver.frontier import trace_frontier


@pytest.mark.parametrize("bad", [True, 1.0])
def test_a_version_that_is_not_an_integer_is_refused(bad: object, tmp_path: Path) -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", profile.num_stages, 2, blocking_power_w=80.0)
    good = tmp_path / "f.json"
    write_frontier(trace_frontier(job), good)
    read_frontier(good)  # the good file reads
    doc = json.loads(good.read_text())
    doc["schema_version"] = bad
    edited = tmp_path / "g.json"
    edited.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"g\.json: field schema_version: .*must be an integer"):
        read_frontier(edited)

    prof = tmp_path / "p.json"
    write_profile_json(profile, prof)
    doc = json.loads(prof.read_text())
    doc["schema_version"] = bad
    prof.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="schema_version"):
        read_profile(prof)

    with pytest.raises(ValidationError, match="must be an integer"):
        GpuIdentity.model_validate({"schema_version": bad, "name": "A100"})


@pytest.mark.parametrize("key", ["schema_version", "max_clocks_per_op"])
def test_a_toml_key_written_true_is_refused(key: str, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'profile = "a100"\nmicrobatches = 4\n{key} = 1\n')
    read_job_config(config)
    config.write_text(f'profile = "a100"\nmicrobatches = 4\n{key} = true\n')
    with pytest.raises(ConfigError, match=rf"c\.toml: key {key}: .*must be an integer, got True"):
        read_job_config(config)
