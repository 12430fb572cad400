"""File formats: profiles (CSV/JSON), plans and frontiers (JSON), bundled data; bounded reads
of regular files (:mod:`perseus.io.reading`) and outputs that never replace what is not a
regular file (:mod:`perseus.io.atomic`)."""

from perseus.io.atomic import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    check_output_path,
)
from perseus.io.bundled import (
    BUNDLED_PROFILES,
    BundledProfile,
    default_blocking_power_w,
    load_profile,
    resolve_profile_path,
)
from perseus.io.frontier_files import read_frontier, write_frontier
from perseus.io.profile_files import read_profile, write_profile_csv, write_profile_json
from perseus.io.reading import read_bounded

__all__ = [
    "BUNDLED_PROFILES",
    "BundledProfile",
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_output_path",
    "default_blocking_power_w",
    "load_profile",
    "read_bounded",
    "read_frontier",
    "read_profile",
    "resolve_profile_path",
    "write_frontier",
    "write_profile_csv",
    "write_profile_json",
]
