"""The profiles shipped with perseus (A100/A40, from the Perseus SOSP'24 artifact), each with
the blocking (P2P-wait) power its authors measured: the default when a job gives none."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from perseus.errors import ConfigError
from perseus.io.profile_files import read_profile
from perseus.profile.model import Profile
from perseus.validate import show_value

__all__ = [
    "BUNDLED_PROFILES",
    "BundledProfile",
    "bundled_profile_path",
    "default_blocking_power_w",
    "load_profile",
    "resolve_plan_profile",
    "resolve_profile_path",
]


@dataclass(frozen=True, slots=True)
class BundledProfile:
    """A shipped profile: its file name, short alias, measured blocking power and what it is."""

    name: str
    alias: str
    blocking_power_w: float
    description: str


BUNDLED_PROFILES: tuple[BundledProfile, ...] = (
    BundledProfile(
        "gpt3-175b+a100_sxm_bf16", "a100", 83.64, "GPT-3 175B, 8 stages, A100 SXM4 80GB"
    ),
    BundledProfile("gpt3-175b+a40_bf16", "a40", 70.38, "GPT-3 175B, 8 stages, A40"),
)
_BUNDLED_NAMES = ", ".join(f"{b.alias} ({b.name})" for b in BUNDLED_PROFILES)


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("perseus") / "data" / "profiles" / f"{name}.csv"))


def bundled_profile_path(name: str) -> Path | None:
    """The bundled profile called ``name`` (its name, alias or file name), else None."""
    for b in BUNDLED_PROFILES:
        if name in (b.name, b.alias, f"{b.name}.csv"):
            return _bundled_path(b.name)
    return None


def resolve_profile_path(arg: str | os.PathLike[str]) -> Path:
    """A profile path, or a bundled profile's name/alias (``a100``), as the user typed it (a
    name read from a plan goes through :func:`resolve_plan_profile` instead, one read from a
    config through :func:`perseus.io.config.resolve_config_profile` first).

    Raises:
        ConfigError: if ``arg`` is neither an existing file nor a bundled name.
    """
    p = Path(arg)
    try:
        if p.exists():
            return p
    except OSError:  # a name too long for the file system: the read names the error
        return p
    bundled = bundled_profile_path(str(arg))
    if bundled is not None:
        return bundled
    raise ConfigError(
        f"{arg}: profile file not found; pass a CSV/JSON path or a bundled name: {_BUNDLED_NAMES}"
    )


def resolve_plan_profile(name: str, plan_path: str | os.PathLike[str], source: str) -> Path:
    """The profile a plan/frontier file names in ``job.profile_name``: a bundled profile, or a
    regular file beside the plan (``NAME``, ``NAME.csv`` or ``NAME.json``). A plan may come
    from anyone, so the name never opens a path of its choosing: no directories, ``..`` or links.

    Raises:
        ConfigError: ``"<source>: field job.profile_name: ..."`` when the name is neither.
    """
    bundled = bundled_profile_path(name)
    if bundled is not None:
        return bundled
    plain = 0 < len(name) <= 255 and name not in (".", "..")
    if plain and not any(c in name for c in ("/", "\\", "\0")):
        folder = Path(plan_path).parent
        for candidate in (name, f"{name}.csv", f"{name}.json"):
            path = folder / candidate
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    return path
    raise ConfigError(
        f"{source}: field job.profile_name: {show_value(name)} is neither a bundled profile "
        f"({_BUNDLED_NAMES}) nor a profile file beside the plan"
    )


def load_profile(arg: str | os.PathLike[str]) -> Profile:
    """Read a profile given as a path or a bundled name.

    Raises:
        ConfigError: if ``arg`` is neither an existing file nor a bundled name.
        ProfileError: naming the file and the line or field at fault.
    """
    return read_profile(resolve_profile_path(arg))


@cache
def _bundled_hashes() -> dict[str, BundledProfile]:
    return {read_profile(_bundled_path(b.name)).sha256: b for b in BUNDLED_PROFILES}


def default_blocking_power_w(profile: Profile) -> float | None:
    """The measured blocking power of a bundled profile (matched by content), else None."""
    match = _bundled_hashes().get(profile.sha256)
    return match.blocking_power_w if match else None
