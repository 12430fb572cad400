"""``perseus report``: the demo's report for any frontier file, optionally with a measured run.

The job is rebuilt from the frontier's own description (schedule, sizes, power) and its
profile: ``--profile``, else the bundled profile the frontier names. With the profile the
report also has the baselines and the timeline; without it, the frontier and straggler plots.
``--summary RUN.json`` (an emulated or real run's summary) adds predicted vs measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perseus.cli.demo import check_output_dir
from perseus.errors import ConfigError, PerseusError
from perseus.io._errors import describe_validation_error
from perseus.io.atomic import atomic_directory
from perseus.io.bundled import load_profile, resolve_profile_path
from perseus.io.frontier_files import read_frontier
from perseus.job import DEFAULT_BACKWARD_SPLIT, PlanningJob, make_job
from perseus.plan import Frontier

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("report", help="plots and an HTML report for a frontier file")
    p.add_argument(
        "frontier", metavar="FRONTIER.json", help="frontier written by perseus frontier/demo"
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="report directory (replaced atomically)"
    )
    p.add_argument(
        "--summary",
        metavar="RUN.json",
        help="an emulated or real run's summary.json: adds predicted vs measured",
    )
    p.add_argument(
        "--profile",
        metavar="PROFILE",
        help="profile the frontier was computed from (default: the bundled one it names)",
    )
    p.add_argument(
        "--pipelines",
        type=int,
        default=16,
        help="data-parallel pipelines in the straggler what-if (default 16)",
    )
    p.add_argument(
        "--factors",
        default="1.0:1.5:0.05",
        metavar="START:STOP:STEP",
        help="straggler slowdown factors (default 1.0:1.5:0.05)",
    )
    p.set_defaults(handler=run)


def _rebuild_job(
    frontier: Frontier, profile_arg: str | None, source: str
) -> tuple[PlanningJob | None, str | None]:
    """The frontier's job, or None and the reason when its profile is not available."""
    j = frontier.job
    name = profile_arg or j.profile_name
    if name is None:
        return None, "the frontier names no profile; pass --profile for baselines and a timeline"
    try:
        path = resolve_profile_path(name)
    except ConfigError:
        if profile_arg is not None:
            raise
        return None, f"profile {name!r} not found; pass --profile for baselines and a timeline"
    job = make_job(
        load_profile(path),
        j.schedule,
        j.stages,
        j.microbatches,
        j.blocking_power_w,
        virtual_stages=j.virtual_stages,
        p2p_latency_s=j.p2p_latency_s,
        backward_split=j.backward_split if j.backward_split is not None else DEFAULT_BACKWARD_SPLIT,
        profile_name=j.profile_name,
    )
    try:
        job.check_frontier(frontier, source=source)
    except PerseusError:
        if profile_arg is not None:
            raise
        return None, f"profile {name!r} differs from the one the frontier was computed from"
    return job, None


def _read_measured(path: str) -> Any:
    from perseus.report import MeasuredRun

    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"{p}: cannot read run summary ({e.strerror}); pass a summary.json"
        ) from None
    try:
        return MeasuredRun.model_validate_json(text)
    except ValidationError as e:
        raise ConfigError(
            describe_validation_error(str(p), e)
            + ' (expected {"predicted": {"time_s", "energy_j"}, "measured": {...}})'
        ) from None


def run(args: argparse.Namespace) -> int:
    from perseus.sim.straggler_sweep import parse_factors, straggler_sweep

    out = Path(args.out)
    factors = parse_factors(args.factors)
    frontier = read_frontier(args.frontier)
    measured = _read_measured(args.summary) if args.summary is not None else None

    from perseus.report import REPORT_FILES, ReportInputs, format_summary, write_report

    check_output_dir(out, REPORT_FILES)
    job, why = _rebuild_job(frontier, args.profile, args.frontier)
    sweep = straggler_sweep(frontier, pipelines=args.pipelines, factors=factors)
    baselines: dict[str, Any] = {}
    global_clock: list[Any] = []
    if job is not None:
        from perseus.solver import baseline_plans, global_clock_plans

        baselines = baseline_plans(job)
        global_clock = global_clock_plans(job)
    inputs = ReportInputs(
        frontier=frontier,
        job=job,
        baselines=baselines,
        global_clock=global_clock,
        sweep=sweep,
        pipelines=args.pipelines,
        measured=measured,
        title=f"Perseus report: {Path(args.frontier).name}",
        details={"frontier file": args.frontier},
        notes=[why] if why else [],
    )
    with atomic_directory(out) as tmp:
        summary = write_report(inputs, tmp)
    print(format_summary(summary))
    if why:
        print(f"note: {why}")
    print(f"wrote {out}/")
    return 0
