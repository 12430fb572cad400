"""Shared valid inputs for the malformed-input corpus: every case starts from these and breaks
exactly one thing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.io import load_profile, write_frontier
from perseus.io.profile_files import write_profile_csv, write_profile_json
from perseus.job import make_job

A100 = load_profile("a100")


def small_frontier():
    """A real frontier of a100, 1f1b, 8 stages x 4 microbatches (two exact points, no solver)."""
    job = make_job(
        A100, "1f1b", 8, 4, blocking_power_w=83.64, profile_name="gpt3-175b+a100_sxm_bf16"
    )
    flat = job.allmax().copy()
    slow = flat.copy()
    slow[:] = 1200
    return job, job.frontier([job.point(flat), job.point(slow)])


@pytest.fixture(scope="session")
def valid_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Paths of valid inputs: frontier, plan, profile CSV/JSON, config, run summary."""
    d = tmp_path_factory.mktemp("valid")
    _job, frontier = small_frontier()
    files = {
        "frontier": d / "frontier.json",
        "plan": d / "plan.json",
        "csv": d / "profile.csv",
        "json": d / "profile.json",
        "config": d / "job.toml",
        "run": d / "run.json",
    }
    write_frontier(frontier, files["frontier"])
    write_frontier(frontier.with_points([frontier.points[0]]), files["plan"])
    write_profile_csv(A100, files["csv"])
    write_profile_json(A100, files["json"])
    files["trace"] = Path(__file__).resolve().parents[2] / "perseus/data/traces/zeus-nsdi23"
    files["config"].write_text('profile = "a100"\nschedule = "1f1b"\nmicrobatches = 4\n')
    base, fast = frontier.baseline, frontier.points[0]
    files["run"].write_text(
        json.dumps(
            {
                "kind": "perseus.run-summary",
                "predicted": {"time_s": fast.time_s, "energy_j": fast.energy_j},
                "measured": {"time_s": fast.time_s, "energy_j": fast.energy_j},
                "allmax": {
                    "predicted": {"time_s": base.time_s, "energy_j": base.energy_j},
                    "measured": {"time_s": base.time_s, "energy_j": base.energy_j},
                },
            }
        )
    )
    return files
