"""The default solve never touches the test oracles (perseus.solver.check)."""

from __future__ import annotations

import sys

import pytest

from perseus.io import load_profile
from perseus.job import make_job
from perseus.solver import trace


def test_default_solve_stays_off_the_test_oracles(monkeypatch: pytest.MonkeyPatch) -> None:
    # A module set to None in sys.modules cannot be imported: the solve fails if it tries.
    for name in [m for m in sys.modules if m.startswith("perseus.solver.check")] + [
        "perseus.solver.check",
        "perseus.solver.check.reference_walk",
        "perseus.solver.check.milp",
        "perseus.solver.check.maxflow",
    ]:
        monkeypatch.setitem(sys.modules, name, None)
    job = make_job(load_profile("a100"), "1f1b", 8, 2, blocking_power_w=83.64)
    assert trace(job).frontier.points
    with pytest.raises(ImportError):
        trace(job, method="reference")  # the oracle path does import them
