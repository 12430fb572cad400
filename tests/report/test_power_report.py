"""The power panels: the frontier in (time, power) and power over one iteration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.io.bundled import load_profile
from perseus.job import PlanningJob, make_job
from perseus.plan import Frontier
from perseus.report import ReportInputs, write_report
from perseus.report.power import plot_power
from perseus.solver import trace_frontier
from perseus.solver.power import with_power
from perseus.solver.power_schedule import lower_hull_indices

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def job() -> PlanningJob:
    return make_job(load_profile("a100"), "1f1b", 8, 8, blocking_power_w=83.64)


@pytest.fixture(scope="module")
def frontier(job: PlanningJob) -> Frontier:
    return with_power(job, trace_frontier(job))


def _size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_MAGIC)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _pixels(png: bytes) -> np.ndarray:
    import io

    from matplotlib.image import imread

    return imread(io.BytesIO(png))


def test_power_panels_render_with_and_without_a_job(job: PlanningJob, frontier: Frontier) -> None:
    allmax = job.point(job.allmax())
    chosen = frontier.points[lower_hull_indices(frontier.points)[-1]]
    both = plot_power(frontier, job, [("All-max", allmax), ("Perseus, T*", chosen)])
    alone = plot_power(frontier)
    assert _size(both) == _size(alone) == (1200, 720)
    # The right panel draws something: the two figures differ in their right half.
    a, b = _pixels(both), _pixels(alone)
    assert not np.array_equal(a[:, 650:], b[:, 650:])
    # And a different chosen plan draws a different power curve.
    other = plot_power(frontier, job, [("All-max", allmax), ("Perseus, fastest", frontier.fastest)])
    assert not np.array_equal(_pixels(other)[:, 650:], a[:, 650:])


def test_report_holds_the_power_panel(tmp_path: Path, job: PlanningJob, frontier: Frontier) -> None:
    write_report(ReportInputs(frontier=frontier, job=job), tmp_path)
    assert (tmp_path / "power.png").read_bytes().startswith(PNG_MAGIC)
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Power</h2>" in page
