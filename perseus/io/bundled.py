"""The profiles shipped with perseus (measured on A100/A40 in the Perseus SOSP'24 artifact).

Each bundled profile carries the blocking (P2P-wait) power its authors measured, used as the
default when a job does not give one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from perseus.errors import ConfigError
from perseus.io.profile_files import read_profile
from perseus.profile.model import Profile

__all__ = [
    "BUNDLED_PROFILES",
    "BundledProfile",
    "default_blocking_power_w",
    "load_profile",
    "resolve_profile_path",
]


@dataclass(frozen=True, slots=True)
class BundledProfile:
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


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("perseus") / "data" / "profiles" / f"{name}.csv"))


def resolve_profile_path(arg: str | os.PathLike[str]) -> Path:
    """A profile path, or a bundled profile's name/alias (``a100``, ``gpt3-175b+a40_bf16``).

    Raises:
        ConfigError: if ``arg`` is neither an existing file nor a bundled name.
    """
    p = Path(arg)
    if p.exists():
        return p
    for b in BUNDLED_PROFILES:
        if str(arg) in (b.name, b.alias, f"{b.name}.csv"):
            return _bundled_path(b.name)
    names = ", ".join(f"{b.alias} ({b.name})" for b in BUNDLED_PROFILES)
    raise ConfigError(
        f"{arg}: profile file not found; pass a CSV/JSON path or a bundled name: {names}"
    )


def load_profile(arg: str | os.PathLike[str]) -> Profile:
    """Read a profile given as a path or a bundled name."""
    return read_profile(resolve_profile_path(arg))


@cache
def _bundled_hashes() -> dict[str, BundledProfile]:
    return {read_profile(_bundled_path(b.name)).sha256: b for b in BUNDLED_PROFILES}


def default_blocking_power_w(profile: Profile) -> float | None:
    """The measured blocking power of a bundled profile (matched by content), else None."""
    match = _bundled_hashes().get(profile.sha256)
    return match.blocking_power_w if match else None
