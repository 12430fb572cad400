"""Job configs: TOML files naming a profile, schedule, sizes and blocking power (``configs/``),
so that ``perseus frontier --config FILE`` reproduces a figure without a long command line.
Unknown keys are errors, and every error names the file, the key and the fix."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from perseus.errors import ConfigError
from perseus.io.reading import INPUT_LIMITS, decode_text, read_bounded
from perseus.plan import job_range as _within
from perseus.validate import JOB_DEFAULTS, clip_message, show_value, whole_number

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the backport
    import tomli as tomllib

__all__ = ["JobConfig", "describe_job_error", "read_job_config", "resolve_config_profile"]

_Layers = Annotated[int, _within("layers_per_stage")]
_LayerWeight = Annotated[float, _within("layer_time_fractions")]


class JobConfig(BaseModel):
    """One planning job as written in a TOML config or given by flags (the CLI validates its
    flags through it too). Types are strict (``"4"`` is not 4); numbers are finite and within
    :data:`perseus.validate.JOB_BOUNDS`; what is left out takes
    :data:`perseus.validate.JOB_DEFAULTS`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    schema_version: Annotated[Literal[1], BeforeValidator(whole_number)] = 1
    description: Annotated[str, Field(max_length=10_000)] | None = None
    profile: Annotated[str, Field(min_length=1, max_length=4096)]
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb"] = JOB_DEFAULTS.schedule
    stages: Annotated[int, _within("stages")] | None = None
    microbatches: Annotated[int, _within("microbatches")]
    virtual_stages: Annotated[int, _within("virtual_stages")] = JOB_DEFAULTS.virtual_stages
    blocking_power_w: Annotated[float, _within("blocking_power_w")] | None = None
    p2p_latency_s: Annotated[float, _within("p2p_latency_s")] = JOB_DEFAULTS.p2p_latency_s
    backward_split: Annotated[float, _within("backward_split")] = JOB_DEFAULTS.backward_split
    pipelines: Annotated[int, _within("pipelines")] | None = None
    # Two-clock ops: layers per stage (one number or one per stage), per-layer work, switch cost.
    layers_per_stage: _Layers | Annotated[list[_Layers], Field(max_length=4096)] | None = None
    layer_time_fractions: list[list[_LayerWeight]] | None = None
    switch_latency_s: Annotated[float, _within("switch_latency_s")] = JOB_DEFAULTS.switch_latency_s
    switch_energy_j: Annotated[float, _within("switch_energy_j")] = JOB_DEFAULTS.switch_energy_j
    switch_stall_s: Annotated[float, _within("switch_stall_s")] = JOB_DEFAULTS.switch_stall_s
    # 1 clock per op, 2 (one switch at a layer boundary), or up to 4 phases per op
    max_clocks_per_op: Annotated[Literal[1, 2, 3, 4], BeforeValidator(whole_number)] | None = None


def read_job_config(path: str | os.PathLike[str]) -> tuple[JobConfig, Path]:
    """Load and validate a TOML job config; returns it and its path (relative profile paths
    resolve against its directory, see :func:`resolve_config_profile`).

    Raises:
        ConfigError: ``"<file>: ..."`` for a missing/unreadable file, bad TOML (with line),
            an unknown key or a bad value (with the key and the accepted values).
    """
    p = Path(path)
    what = "a TOML job config (see configs/)"
    data = read_bounded(p, limit_bytes=INPUT_LIMITS["config"], what=what, name="config file")
    text = decode_text(p, data, what, ConfigError)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"{p}: invalid TOML ({clip_message(str(e), 200)}); fix the syntax"
        ) from None
    except RecursionError:
        raise ConfigError(f"{p}: invalid TOML (nested too deeply)") from None
    except ValueError as e:  # an integer of thousands of digits
        why = clip_message(str(e).partition(";")[0], 200)
        raise ConfigError(f"{p}: invalid TOML ({why}); shorten the number") from None
    try:
        config = JobConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_describe(str(p), e)) from None
    return config, p


def _describe(source: str, error: ValidationError) -> str:
    first = error.errors()[0]
    if first["type"] == "extra_forbidden":
        key = show_value(".".join(str(part) for part in first["loc"]))
        known = ", ".join(k for k in JobConfig.model_fields if k != "schema_version")
        return f"{source}: unknown key {key}; remove it (known keys: {known})"
    if first["type"] == "missing":
        key = ".".join(str(part) for part in first["loc"])
        return f"{source}: missing key {key!r}; add it (e.g. {key} = {_EXAMPLES.get(key, '...')})"
    where = {name: f"{source}: key {name}" for name in JobConfig.model_fields}
    return describe_job_error(error, where)


def describe_job_error(error: ValidationError, where: Mapping[str, str]) -> str:
    """``"--stages: Input should be greater than or equal to 1, got 0"``: a job's first bad
    value, named by ``where[field]`` (its flag, or ``"<file>: key <name>"``); of a union's
    errors, the one that reached deepest into the value."""
    first = max(error.errors(), key=lambda e: len(e["loc"]))
    name, *rest = first["loc"] or ("job",)
    source = where.get(str(name), str(name))
    source += "".join(f"[{part}]" for part in rest if isinstance(part, int))
    value = first.get("input")
    got = "" if isinstance(value, (dict, list, tuple)) else f", got {show_value(value)}"
    return f"{source}: {first['msg']}{got}"


_EXAMPLES = {"profile": '"a100"', "microbatches": "24"}


def resolve_config_profile(config: JobConfig, config_path: Path) -> str:
    """The profile argument for :func:`perseus.io.bundled.resolve_profile_path`: a bundled name
    or a file under the config's directory by a relative path without ``..`` (a config may come
    from anyone, so it never makes perseus open a path of its choosing).

    Raises:
        ConfigError: ``"<config>: key profile: ..."`` for an absolute path, a path that climbs
            out of the config's directory, or a name that is neither a file there nor bundled.
    """
    from perseus.io.bundled import bundled_profile_path

    name = config.profile
    rel = Path(name)
    where = f"{config_path}: key profile"
    if "\0" in name or rel.is_absolute() or ".." in rel.parts:
        raise ConfigError(
            f"{where}: {show_value(name)} must be a bundled name or a path relative to the "
            f"config's directory without '..'; put the profile beside the config, or pass it "
            "on the command line as PROFILE"
        )
    candidate = config_path.parent / rel
    try:
        found = candidate.exists()
    except OSError as e:  # a name too long for the file system
        raise ConfigError(
            f"{where}: {show_value(name)} cannot be looked up ({e.strerror}); fix the name"
        ) from None
    if found:
        return str(candidate)
    if bundled_profile_path(name) is not None:
        return name
    raise ConfigError(
        f"{where}: {show_value(name)} is neither a bundled profile (a100, a40) nor a file "
        f"under {config_path.parent}; fix the name or pass the profile as PROFILE"
    )
