"""File formats: profiles (CSV/JSON), plans and frontiers (JSON), bundled data; bounded reads
of regular files (:mod:`perseus.io.reading`) and outputs that never replace what is not a
regular file (:mod:`perseus.io.atomic`). The names below are the ones a program needs; the
rest live in those modules."""

from perseus.io.bundled import BUNDLED_PROFILES, default_blocking_power_w, load_profile
from perseus.io.frontier_files import read_frontier, write_frontier
from perseus.io.profile_files import read_profile, write_profile_csv, write_profile_json

__all__ = [
    "BUNDLED_PROFILES",
    "default_blocking_power_w",
    "load_profile",
    "read_frontier",
    "read_profile",
    "write_frontier",
    "write_profile_csv",
    "write_profile_json",
]
