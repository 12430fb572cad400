"""The report: summary figures, PNGs and the self-contained HTML page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from perseus.io.bundled import load_profile
from perseus.io.frontier_files import read_frontier
from perseus.job import PlanningJob, make_job
from perseus.plan import Frontier
from perseus.report import (
    REPORT_FILES,
    MeasuredRun,
    ReportInputs,
    format_summary,
    summarize,
    write_report,
)
from perseus.report.frontier import plot_frontier
from perseus.report.straggler import plot_straggler
from perseus.report.timeline import Timeline, build_timeline, plot_timelines
from perseus.runtime.straggler.sweep import parse_factors, straggler_sweep
from perseus.solver.power import with_power

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def job() -> PlanningJob:
    return make_job(
        load_profile("a100"),
        "1f1b",
        8,
        8,
        blocking_power_w=83.64,
        profile_name="gpt3-175b+a100_sxm_bf16",
    )


@pytest.fixture(scope="module")
def frontier(job: PlanningJob) -> Frontier:
    from perseus.solver import trace_frontier

    return trace_frontier(job)


def _png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_MAGIC)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_summary_figures(frontier: Frontier) -> None:
    sweep = straggler_sweep(frontier, pipelines=16, factors=parse_factors("1.0:1.5:0.05"))
    s = summarize(frontier, {}, sweep, 16)
    base = frontier.baseline
    assert s.allmax.energy_saving == 0.0
    assert s.fastest.energy_saving == pytest.approx(1 - frontier.fastest.energy_j / base.energy_j)
    assert s.fastest.energy_saving > 0.05
    assert s.min_energy.energy_saving > s.fastest.energy_saving
    assert s.min_energy.slowdown > 0
    assert s.straggler is not None and s.straggler.factor == 1.2
    case = next(c for c in sweep if c.factor == 1.2)
    assert s.straggler.saving_vs_allmax == case.saving_vs_allmax
    text = format_summary(s)
    assert f"{100 * s.fastest.energy_saving:.1f} %" in text
    assert "1.2x straggler" in text
    json.dumps(s.to_json_dict())


def test_plots_are_report_sized_pngs(job: PlanningJob, frontier: Frontier) -> None:
    from perseus.solver import baseline_plans

    pngs = [
        plot_frontier(frontier, baseline_plans(job)),
        plot_timelines(
            [
                build_timeline(job, job.point(job.allmax()), "All-max"),
                build_timeline(job, frontier.fastest, "Perseus"),
            ]
        ),
        plot_straggler(
            straggler_sweep(frontier, pipelines=4, factors=[1.0, 1.1, 1.2]), frontier, 4
        ),
    ]
    for png in pngs:
        width, height = _png_size(png)
        assert width >= 1000 and height >= 600


def test_timeline_of_many_ranks_stays_a_viewable_png() -> None:
    """Rows share a bounded height past 64 ranks: 100 ranks drew a 1440 x 10,400-pixel PNG,
    4,096 (the stage limit) about 400,000 pixels tall; 8 ranks keep their size."""
    small = _png_size(plot_timelines([_one_op_per_rank(8), _one_op_per_rank(8)]))[1]
    tall = _png_size(plot_timelines([_one_op_per_rank(64), _one_op_per_rank(64)]))[1]
    many = _png_size(plot_timelines([_one_op_per_rank(100), _one_op_per_rank(100)]))[1]
    assert small < tall == many < 8000


def test_timeline_rows_do_not_autoscale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The panels' limits are fixed before the rows are drawn: an autoscale after each row's
    bars went over the bars drawn so far (4 per rank: 4.0 s of 19 s at 2,048 ranks)."""
    from matplotlib.axes import Axes

    autoscaled = []
    autoscale_view = Axes.autoscale_view

    def counted(self: Axes, *args: object, **kwargs: object) -> None:
        if self.get_autoscalex_on() or self.get_autoscaley_on():
            autoscaled.append(self)
        autoscale_view(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "autoscale_view", counted)
    plot_timelines([_one_op_per_rank(100), _one_op_per_rank(100)])
    assert autoscaled == []


def test_timeline_colours_each_rank_in_one_call(
    monkeypatch: pytest.MonkeyPatch, job: PlanningJob, frontier: Frontier
) -> None:
    """Op colours come from one colormap call per rank, not one per op (16,400 calls for the
    8x512 job's two panels, drawn in 3.5 s, 2.7 s now; a report at the 1,000,000-op limit
    made two million)."""
    from matplotlib.colors import Colormap

    calls = []
    colormap_call = Colormap.__call__

    def counted(self: Colormap, *args: object, **kwargs: object) -> object:
        calls.append(args)
        return colormap_call(self, *args, **kwargs)

    monkeypatch.setattr(Colormap, "__call__", counted)
    tl = build_timeline(job, frontier.fastest, "Perseus")
    plot_timelines([tl])
    assert tl.rank.size == 128 and len(calls) <= 2 * tl.num_ranks + 8


def _one_op_per_rank(ranks: int) -> Timeline:
    ones = np.ones(ranks)
    return Timeline(
        label="x", time_s=1.0, energy_j=1.0, blocking_power_w=80.0, num_ranks=ranks,
        rank=np.arange(ranks), kind=np.zeros(ranks, dtype=np.int64), start_s=0 * ones,
        end_s=ones, power_w=300.0 * ones,
    )  # fmt: skip


def test_timeline_matches_the_evaluator(job: PlanningJob, frontier: Frontier) -> None:
    tl = build_timeline(job, frontier.fastest, "Perseus")
    assert tl.time_s == pytest.approx(frontier.fastest.time_s)
    assert tl.end_s.max() == pytest.approx(tl.time_s)
    assert (tl.power_w > job.blocking_power_w).all()
    # Op energy plus blocking energy over idle time is the plan's energy.
    busy = (tl.end_s - tl.start_s).sum()
    op_energy = (tl.power_w * (tl.end_s - tl.start_s)).sum()
    idle_energy = job.blocking_power_w * (tl.num_ranks * tl.time_s - busy)
    assert op_energy + idle_energy == pytest.approx(frontier.fastest.energy_j)


def test_write_report(tmp_path: Path, job: PlanningJob, frontier: Frontier) -> None:
    measured = MeasuredRun.model_validate(
        {
            "predicted": {"time_s": 2.0, "energy_j": 4000.0},
            "measured": {"time_s": 2.1, "energy_j": 4100.0},
            "allmax": {
                "predicted": {"time_s": 2.2, "energy_j": 5000.0},
                "measured": {"time_s": 2.25, "energy_j": 5050.0},
            },
            "extra": "ignored",
        }
    )
    sweep = straggler_sweep(frontier, pipelines=4, factors=parse_factors("1.0:1.3:0.1"))
    summary = write_report(
        ReportInputs(
            frontier=frontier, job=job, sweep=sweep, pipelines=4, measured=measured, title="T"
        ),
        tmp_path,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(REPORT_FILES)
    # With the power figures `plan pick --peak-power-w` reads (a demo's frontier had none).
    written = read_frontier(tmp_path / "frontier.json")
    assert written.points == with_power(job, frontier).points
    assert all(p.power is not None for p in written.points)
    on_disk = json.loads((tmp_path / "report-summary.json").read_text())
    assert on_disk["fastest"]["energy_saving"] == pytest.approx(summary.fastest.energy_saving)
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", page), (
        "page must be self-contained"
    )
    assert "Predicted vs measured" in page and "+5.0 %" in page
    assert "<script" not in page


def test_report_without_job_or_sweep_has_only_the_frontier(
    tmp_path: Path, frontier: Frontier
) -> None:
    write_report(ReportInputs(frontier=frontier, notes=["no profile"]), tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert "timeline.png" not in names and "straggler.png" not in names
    assert "power.png" in names  # the (time, power) frontier needs no job
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "No timeline" in page and "no profile" in page


class _CountingPoint:
    """A global-clock plan that counts how often its energy is read."""

    reads = 0

    def __init__(self, time_s: float, energy_j: float) -> None:
        self.time_s, self._energy_j = time_s, energy_j

    @property
    def energy_j(self) -> float:
        _CountingPoint.reads += 1
        return self._energy_j


class _Axes:
    def __init__(self) -> None:
        self.lines: list[tuple[list[float], list[float]]] = []

    def plot(self, x: list[float], y: list[float], *args: object, **kw: object) -> None:
        self.lines.append((x, y))


def test_global_clock_curve_is_linear_in_the_settings() -> None:
    """The efficient global-clock settings (each cheaper than every faster one) are found in
    one pass: the check against every faster setting was O(n^2) (a one-stage profile may have
    up to 100,000 clocks; 20,000 settings took 25 s)."""
    from perseus.report.frontier import _draw_global_clock

    # Every setting cheaper than the faster ones: the old check read n^2 / 2 energies.
    points = [_CountingPoint(1.0 + i, 1e6 - i) for i in range(2000)]
    _CountingPoint.reads = 0
    _draw_global_clock(_Axes(), points)  # type: ignore[arg-type]
    assert _CountingPoint.reads <= 10 * len(points)

    energies = [5.0, 4.0, 4.5, 3.0, 3.0, 2.5, 6.0, 1.0]
    ax = _Axes()
    settings = [_CountingPoint(1.0 + i, e) for i, e in enumerate(energies)]
    _draw_global_clock(ax, settings)  # type: ignore[arg-type]
    assert ax.lines[1] == ([1.0, 2.0, 4.0, 6.0, 8.0], [5.0e-3, 4.0e-3, 3.0e-3, 2.5e-3, 1.0e-3])


def test_frontier_curve_reads_t_star_once() -> None:
    """The frontier drawn up to T*: ``min_energy`` scans every point, so it is read once, not
    once per point (O(P^2): about 10^10 steps at the 100,000-point limit)."""
    from perseus.report.frontier import _draw_plans

    class _Frontier:
        reads = 0

        def __init__(self, points: list[_CountingPoint]) -> None:
            self.points, self.baseline = points, points[0]

        @property
        def min_energy(self) -> _CountingPoint:
            _Frontier.reads += 1
            return min(self.points, key=lambda p: (p.energy_j, p.time_s))

    frontier = _Frontier([_CountingPoint(1.0 + i, 10.0 - i % 7) for i in range(50)])
    ax = _Axes()
    _draw_plans(ax, frontier, {})  # type: ignore[arg-type]
    assert _Frontier.reads == 1
    assert ax.lines[0][0] == [1.0 + i for i in range(7)]  # up to T*, the first 3 J point
