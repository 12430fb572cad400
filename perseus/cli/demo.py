"""``perseus demo``: the whole story on the bundled GPT-3 175B A100 profile, no GPU needed.

Computes the frontier of 1F1B over 8 stages x 24 microbatches, evaluates the baselines,
runs the straggler what-if, prints a short summary and writes a report directory
(frontier.json, summary.json, frontier.png, timeline.png, straggler.png, report.html).
``--config`` runs the same on any job config (the tests use a small one).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from perseus.cli._job_args import CONFIG_FIELDS, job_from_args
from perseus.errors import ConfigError
from perseus.io.atomic import atomic_directory
from perseus.io.config import read_job_config

__all__ = ["DEMO_JOB", "check_output_dir", "register", "run"]

#: The demo job when no --config is given.
DEMO_JOB: dict[str, str | int | float] = {
    "profile": "a100",
    "schedule": "1f1b",
    "stages": 8,
    "microbatches": 24,
    "blocking_power_w": 83.64,
    "pipelines": 16,
}
_DEFAULT_FACTORS = "1.0:1.5:0.05"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="frontier, baselines, straggler what-if and report for GPT-3 175B on A100 (no GPU)",
        description=(
            "Plan GPT-3 175B on the bundled A100 profile (1F1B, 8 stages x 24 microbatches) and "
            "write a report. No GPU and no arguments needed."
        ),
    )
    p.add_argument(
        "--out",
        default="perseus-report",
        metavar="DIR",
        help="report directory (default perseus-report/; replaced atomically)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="plan this TOML job config instead (see configs/)"
    )
    p.add_argument("--microbatches", type=int, help="override the job's microbatch count")
    p.add_argument(
        "--pipelines",
        type=int,
        help="data-parallel pipelines in the straggler what-if (default 16)",
    )
    p.add_argument(
        "--factors",
        default=_DEFAULT_FACTORS,
        metavar="START:STOP:STEP",
        help=f"straggler slowdown factors (default {_DEFAULT_FACTORS})",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run)


def check_output_dir(path: Path, known_files: Iterable[str], flag: str = "--out") -> None:
    """Refuse an output directory that would destroy something that is not ours.

    The report directory is replaced as a whole, so an existing directory may only hold files
    a previous run wrote.

    Raises:
        ConfigError: if ``path`` is a file, or a directory holding other files.
    """
    if path.is_file():
        raise ConfigError(f"{flag} {path}: is a file; pass a directory path")
    if path.is_dir():
        known = set(known_files)
        foreign = sorted(p.name for p in path.iterdir() if p.name not in known)
        if foreign:
            raise ConfigError(
                f"{flag} {path}: directory holds files perseus did not write ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty directory"
            )


def _progress_bar(enabled: bool) -> tuple[Callable[[float], None], Callable[[], None]]:
    """A tqdm bar on stderr driven by fractions in [0, 1]; returns (update, close)."""
    from tqdm import tqdm

    bar = tqdm(
        total=100,
        desc="frontier",
        unit="%",
        file=sys.stderr,
        disable=not enabled,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]",
    )

    def update(fraction: float) -> None:
        target = round(100 * min(max(fraction, 0.0), 1.0))
        if target > bar.n:
            bar.update(target - bar.n)

    def close() -> None:
        update(1.0)
        bar.close()

    return update, close


def _job_namespace(args: argparse.Namespace) -> tuple[argparse.Namespace, int]:
    """Arguments for :func:`job_from_args` and the pipeline count, from --config or DEMO_JOB."""
    ns = argparse.Namespace(profile=None, config=args.config, **dict.fromkeys(CONFIG_FIELDS))
    pipelines = args.pipelines
    if args.config is None:
        for key in CONFIG_FIELDS:
            if key in DEMO_JOB:
                setattr(ns, key, DEMO_JOB[key])
        ns.profile = DEMO_JOB["profile"]
        pipelines = pipelines if pipelines is not None else int(DEMO_JOB["pipelines"])
    else:
        config, _ = read_job_config(args.config)
        if pipelines is None:
            pipelines = (
                config.pipelines if config.pipelines is not None else int(DEMO_JOB["pipelines"])
            )
    if args.microbatches is not None:
        ns.microbatches = args.microbatches
    if pipelines < 2:
        raise ConfigError(f"--pipelines must be at least 2, got {pipelines}")
    return ns, pipelines


def run(args: argparse.Namespace) -> int:
    from perseus.sim.straggler_sweep import parse_factors, straggler_sweep

    started = time.perf_counter()
    out = Path(args.out)
    factors = parse_factors(args.factors)
    ns, pipelines = _job_namespace(args)
    from perseus.report import REPORT_FILES

    check_output_dir(out, REPORT_FILES)
    job = job_from_args(ns)

    from perseus.solver import baseline_plans, global_clock_plans, trace_frontier

    update, close = _progress_bar(not args.no_progress)
    try:
        frontier = trace_frontier(job, progress=update)
    finally:
        close()
    solve_s = time.perf_counter() - started
    baselines = baseline_plans(job)
    sweep = straggler_sweep(frontier, pipelines=pipelines, factors=factors)

    from perseus.report import ReportInputs, format_summary, write_report

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
    with atomic_directory(out) as tmp:
        summary = write_report(inputs, tmp)
    print(format_summary(summary))
    print(f"wrote {out}/ ({', '.join(REPORT_FILES)}) in {time.perf_counter() - started:.1f} s")
    return 0
