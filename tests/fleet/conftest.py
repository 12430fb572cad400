"""Fleet fixtures: frontiers traced once per test run (PostgreSQL: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.io import load_profile
from perseus.io.frontier_files import write_frontier
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.emulation import take_stages
from perseus.solver import trace
from perseus.solver.power import with_power

#: (profile, stages, microbatches): the bundled profiles cut to a few stage counts.
SHAPES = [
    (name, stages, microbatches)
    for name in ("a100", "a40")
    for stages, microbatches in ((2, 4), (2, 8), (3, 6), (4, 4))
]


@pytest.fixture(scope="session")
def fleet_frontiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Frontier]]:
    """Each shape's frontier (with power figures), written once to a session folder."""
    folder = tmp_path_factory.mktemp("frontiers")
    out = {}
    for name, stages, microbatches in SHAPES:
        job = make_job(
            take_stages(load_profile(name), stages),
            "1f1b",
            stages,
            microbatches,
            blocking_power_w=83.64,
        )
        frontier = with_power(job, trace(job, min_gap_fraction=0.005).frontier)
        path = folder / f"{name}-{stages}x{microbatches}.json"
        write_frontier(frontier, path)
        out[path.stem] = (path, frontier)
    return out
