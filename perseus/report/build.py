"""Assemble a report directory: frontier.json, report-summary.json, the PNGs and report.html
(the CLI writes it inside :func:`perseus.io.atomic.atomic_directory`: whole or nothing)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perseus.io.atomic import atomic_write_bytes, atomic_write_text
from perseus.io.frontier_files import write_frontier
from perseus.job import PlanningJob
from perseus.log import get_logger
from perseus.plan import Frontier, PlanPoint
from perseus.report.frontier import plot_frontier
from perseus.report.html import render_html
from perseus.report.power import plot_power
from perseus.report.straggler import plot_straggler
from perseus.report.summary import MeasuredRun, Summary, summarize
from perseus.report.timeline import build_timeline, plot_timelines
from perseus.runtime.straggler.sweep import StragglerCase
from perseus.solver.power import with_power

logger = get_logger(__name__)

__all__ = ["LEGACY_REPORT_FILES", "REPORT_FILES", "ReportInputs", "write_report"]

#: Every file a full report holds (timeline.png needs a job, straggler.png a sweep).
REPORT_FILES = (
    "frontier.json",
    "report-summary.json",
    "frontier.png",
    "timeline.png",
    "power.png",
    "straggler.png",
    "report.html",
)
#: Files older versions wrote into a report directory (a rerun may replace them).
LEGACY_REPORT_FILES = ("summary.json",)


@dataclass(frozen=True)
class ReportInputs:
    """What a report is built from.

    Attributes:
        job: The job the frontier was computed for; without it there is no timeline.
        baselines: Baseline plans by name (``perseus.solver.baseline_plans``).
        global_clock: One-clock-for-all plans, drawn as a curve.
        sweep: Straggler sweep cases (empty: no straggler plot), of ``pipelines`` pipelines.
        details: Extra rows for the job table (e.g. solve time).
        notes: Lines shown at the end (e.g. why a plot is missing).
    """

    frontier: Frontier
    job: PlanningJob | None = None
    baselines: Mapping[str, PlanPoint] = field(default_factory=dict)
    global_clock: Sequence[PlanPoint] = ()
    sweep: Sequence[StragglerCase] = ()
    pipelines: int | None = None
    measured: MeasuredRun | None = None
    title: str = "Perseus energy report"
    details: Mapping[str, object] = field(default_factory=dict)
    notes: Sequence[str] = ()


def _job_details(inputs: ReportInputs, summary: Summary) -> dict[str, object]:
    j = inputs.frontier.job
    rows: dict[str, object] = {
        "profile": j.profile_name or "(unnamed)",
        "profile sha256": j.profile_sha256[:16] + "…",
        "schedule": j.schedule,
        "stages": j.stages,
        "virtual stages per rank": j.virtual_stages,
        "ranks (GPUs per pipeline)": j.ranks,
        "microbatches per iteration": j.microbatches,
        "blocking power (W)": f"{j.blocking_power_w:g}",
        "P2P latency (s)": f"{j.p2p_latency_s:g}",
        "frontier points": summary.points,
    }
    if j.backward_split is not None:
        rows["backward split (B share)"] = f"{j.backward_split:g}"
    if inputs.pipelines is not None:
        rows["data-parallel pipelines (straggler what-if)"] = inputs.pipelines
    rows.update(inputs.details)
    return rows


def write_report(inputs: ReportInputs, directory: str | Path) -> Summary:
    """Write the report files into ``directory`` (which must exist) and return the figures
    (PlanError if the frontier's plans do not fit ``inputs.job``)."""
    out, f, job = Path(directory), inputs.frontier, inputs.job
    summary = summarize(f, inputs.baselines, inputs.sweep, inputs.pipelines)
    notes = list(inputs.notes)
    measured = inputs.measured
    images = {
        "frontier": plot_frontier(
            f, inputs.baselines, global_clock=inputs.global_clock, measured=measured
        )
    }
    if job is not None:
        plans = [("All-max", job.point(job.allmax())), ("Perseus, fastest plan", f.fastest)]
        images["timeline"] = plot_timelines([build_timeline(job, p, label) for label, p in plans])
        images["power"] = plot_power(f, job, plans)
    else:
        notes.append("No timeline: the profile this frontier was computed from was not available.")
        images["power"] = plot_power(f)
    if inputs.sweep and inputs.pipelines is not None:
        images["straggler"] = plot_straggler(inputs.sweep, f, inputs.pipelines)
    for name, png in images.items():
        atomic_write_bytes(out / f"{name}.png", png)
        logger.debug("wrote %s.png (%d bytes)", name, len(png))
    # With power figures where the job is known, so `plan pick --peak-power-w` reads it.
    write_frontier(f if job is None else with_power(job, f), out / "frontier.json")
    summary_json = json.dumps(summary.to_json_dict(), indent=2) + "\n"
    atomic_write_text(out / "report-summary.json", summary_json)
    details = _job_details(inputs, summary)
    page = render_html(
        summary,
        images,
        title=inputs.title,
        details=details,
        sweep=inputs.sweep,
        measured=measured,
        notes=notes,
    )
    atomic_write_text(out / "report.html", page)
    return summary
