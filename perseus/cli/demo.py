"""``perseus demo``: frontier, baselines, straggler what-if and report for the bundled GPT-3
175B A100 profile (or ``--config``), no GPU needed."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_output_arg, check_output_dir, nonempty_arg
from perseus.cli._job_args import CONFIG_FIELDS, job_from_args, job_int
from perseus.cli._progress import progress_bar
from perseus.cli.report import add_whatif_arguments
from perseus.log import get_logger, phase

if TYPE_CHECKING:
    from perseus.job import PlanningJob

__all__ = ["DEMO_JOB", "register", "run"]

logger = get_logger(__name__)

#: The demo job when no --config is given.
DEMO_JOB: dict[str, str | int | float] = {
    "profile": "a100",
    "schedule": "1f1b",
    "stages": 8,
    "microbatches": 24,
    "blocking_power_w": 83.64,
    "pipelines": 16,
}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="frontier, baselines, straggler what-if and report for GPT-3 175B on A100 (no GPU)",
        description="Plan GPT-3 175B on the bundled A100 profile (1F1B, 8 stages x 24 "
        "microbatches) and write a report. No GPU and no arguments needed.",
    )
    p.set_defaults(handler=run)
    add_output_arg(
        p,
        "DIR",
        "report directory (default perseus-report/; replaced atomically)",
        "perseus-report",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        type=nonempty_arg,
        help="plan this TOML job config instead (see configs/)",
    )
    p.add_argument(
        "--microbatches", type=job_int("microbatches"), help="override the job's microbatch count"
    )
    add_whatif_arguments(p, pipelines=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _job_namespace(args: argparse.Namespace) -> tuple[argparse.Namespace, int]:
    """Arguments for :func:`job_from_args` and the pipeline count, from --config or DEMO_JOB."""
    from perseus.io.config import read_job_config

    ns = argparse.Namespace(profile=None, config=args.config, **dict.fromkeys(CONFIG_FIELDS))
    pipelines = int(DEMO_JOB["pipelines"])
    if args.config is None:
        for key in ("profile", *CONFIG_FIELDS):
            setattr(ns, key, DEMO_JOB.get(key, getattr(ns, key)))
    else:
        config, _ = read_job_config(args.config)
        pipelines = config.pipelines if config.pipelines is not None else pipelines
    if args.microbatches is not None:
        ns.microbatches = args.microbatches
    return ns, args.pipelines if args.pipelines is not None else pipelines


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from perseus.io.atomic import atomic_directory
    from perseus.report import REPORT_FILES, ReportInputs, format_summary, write_report
    from perseus.report.build import LEGACY_REPORT_FILES
    from perseus.runtime.straggler.sweep import parse_factors, straggler_sweep
    from perseus.solver import baseline_plans, global_clock_plans, trace

    out = check_output_dir(args.out, (*REPORT_FILES, *LEGACY_REPORT_FILES))
    factors = parse_factors(args.factors)
    ns, pipelines = _job_namespace(args)
    job = job_from_args(ns)
    s = job.spec
    logger.info(
        "job: %s on %s, %d stages x %d microbatches, %d ops",
        s.schedule,
        s.profile_name,
        s.stages,
        s.microbatches,
        job.graph.num_nodes,
    )
    compile_s = _compile_kernels(job, enabled=not args.no_progress)
    started += compile_s
    with progress_bar("frontier", enabled=not args.no_progress, solve=True) as update:
        frontier = trace(job, progress=update).frontier
    solve_s = time.perf_counter() - started
    logger.info("frontier: %d points in %.1f s", len(frontier.points), solve_s)
    with phase("baselines and straggler what-if"):
        baselines = baseline_plans(job)
        sweep = straggler_sweep(frontier, pipelines=pipelines, factors=factors)
    inputs = ReportInputs(
        frontier=frontier,
        job=job,
        baselines=baselines,
        global_clock=global_clock_plans(job),
        sweep=sweep,
        pipelines=pipelines,
        title=f"Perseus demo: {job.spec.profile_name}",
        details={"solve time (s, this machine)": f"{solve_s:.1f}"},
    )
    with phase("writing the report"), atomic_directory(out) as tmp:
        summary = write_report(inputs, tmp)
    print(format_summary(summary))
    print(f"wrote {out}/ ({', '.join(REPORT_FILES)}); {_took(started, compile_s)}")
    return 0


def _took(started: float, compile_s: float) -> str:
    """What the demo's time counts (planning and the report; not start-up, nor a compile)."""
    left_out = "start-up"
    if compile_s > 0:
        left_out += f" and {compile_s:.1f} s compiling the solver kernels (first run only)"
    took = time.perf_counter() - started
    return f"planning and the report, {left_out} not counted, in {took:.1f} s"


def _compile_kernels(job: PlanningJob, enabled: bool) -> float:
    """Seconds spent compiling the solver kernels (when not built at install nor in numba's
    cache) on a small 1F1B job of the same stages, so the demo's printed time leaves it out."""
    from perseus.cli._progress import solver_kernels_cached
    from perseus.job import make_job
    from perseus.solver import trace_frontier

    if solver_kernels_cached():
        return 0.0
    started = time.perf_counter()
    s = job.spec
    tiny = make_job(job.profile, "1f1b", s.stages, s.stages, blocking_power_w=s.blocking_power_w)
    with progress_bar("frontier", enabled=enabled, solve=True):
        trace_frontier(tiny)
    return time.perf_counter() - started
