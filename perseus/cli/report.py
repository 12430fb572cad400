"""``perseus report``: the demo's report for any frontier file, optionally with a measured run.

With the frontier's profile (``--profile``, else the one it names: bundled, or a file beside
it) the report also has the baselines and the timeline; ``--summary RUN.json`` adds predicted
vs measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_command, add_output_arg, add_path_arg, check_output_dir
from perseus.cli._job_args import check_figures, job_from_frontier, job_int
from perseus.errors import ConfigError, PerseusError

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.job import PlanningJob
    from perseus.plan import Frontier

__all__ = ["add_whatif_arguments", "register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(sub, "report", run, "plots and an HTML report for a frontier file")
    p.add_argument(
        "frontier", metavar="FRONTIER.json", help="frontier written by perseus frontier/demo"
    )
    add_output_arg(p, "DIR", "report directory (replaced atomically)")
    add_path_arg(
        p,
        "--summary",
        "RUN.json",
        "an emulated or real run's summary (of this frontier's job): adds predicted vs measured",
    )
    add_path_arg(
        p,
        "--profile",
        "PROFILE",
        "profile the frontier was computed from (default: the bundled one it names)",
    )
    add_whatif_arguments(p, pipelines=16)


def add_whatif_arguments(parser: argparse.ArgumentParser, pipelines: int | None) -> None:
    """``--pipelines`` and ``--factors`` of the report's straggler what-if."""
    parser.add_argument(
        "--pipelines",
        type=job_int("pipelines"),
        default=pipelines,
        help="data-parallel pipelines in the straggler what-if (default 16)",
    )
    factors = "1.0:1.5:0.05"
    parser.add_argument(
        "--factors",
        default=factors,
        metavar="START:STOP:STEP",
        help=f"straggler slowdown factors (default {factors})",
    )


def _rebuild_job(
    frontier: Frontier, profile_arg: str | None, source: str
) -> tuple[PlanningJob | None, str | None]:
    """The frontier's job, or None and the reason when its profile is not available."""
    try:
        job = job_from_frontier(frontier, profile_arg, source, verify=False)
    except PerseusError as e:
        if profile_arg is not None:
            raise
        return None, f"{str(e).partition(chr(10))[0]}; no baselines or timeline"
    check_figures(job, frontier, source)
    return job, None


def _read_measured(path: str) -> Any:
    from pydantic import ValidationError

    from perseus.io._errors import describe_validation_error
    from perseus.io.frontier_files import read_json_document
    from perseus.io.reading import INPUT_LIMITS
    from perseus.report import MeasuredRun
    from perseus.report.summary import REPORT_SUMMARY_KIND

    p = Path(path)
    what = "a run's summary (examples/train_pipeline.py --summary)"
    doc = read_json_document(p, what, ConfigError, limit_bytes=INPUT_LIMITS["summary"])
    if isinstance(doc, dict) and doc.get("kind") == REPORT_SUMMARY_KIND:
        raise ConfigError(
            f"{p}: field kind: a report's summary (written by perseus demo/report), not a run's; "
            "pass the summary a training run wrote (examples/train_pipeline.py --summary)"
        )
    try:
        return MeasuredRun.model_validate(doc, strict=True)
    except ValidationError as e:
        raise ConfigError(
            describe_validation_error(str(p), e)
            + ' (expected {"predicted": {"time_s", "energy_j"}, "measured": {...}})'
        ) from None


def run(args: argparse.Namespace) -> int:
    from perseus.io.atomic import atomic_directory
    from perseus.io.frontier_files import read_frontier
    from perseus.report import REPORT_FILES, ReportInputs, format_summary, write_report
    from perseus.report.build import LEGACY_REPORT_FILES
    from perseus.runtime.straggler.sweep import parse_factors, straggler_sweep

    out = check_output_dir(args.out, (*REPORT_FILES, *LEGACY_REPORT_FILES))
    factors = parse_factors(args.factors)
    frontier = read_frontier(args.frontier)
    measured = None
    if args.summary is not None:
        measured = _read_measured(args.summary)
        measured.check_frontier(frontier, args.summary)
    job, why = _rebuild_job(frontier, args.profile, args.frontier)
    sweep = straggler_sweep(frontier, pipelines=args.pipelines, factors=factors)
    plans: dict[str, Any] = {}
    if job is not None:
        from perseus.solver import baseline_plans, global_clock_plans

        plans = {"baselines": baseline_plans(job), "global_clock": global_clock_plans(job)}
    j = frontier.job
    title = (
        f"Perseus report: {j.profile_name or 'custom profile'}, {j.schedule} {j.stages} stages x "
        f"{j.microbatches} microbatches"
    )
    inputs = ReportInputs(
        frontier,
        job,
        **plans,
        sweep=sweep,
        pipelines=args.pipelines,
        measured=measured,
        title=title,
        details={"frontier file": args.frontier},
        notes=[why] if why else [],
    )
    with atomic_directory(out) as tmp:
        summary = write_report(inputs, tmp)
    print(format_summary(summary) + (f"\nnote: {why}" if why else "") + f"\nwrote {out}/")
    return 0
