"""``perseus evaluate``: exact time and energy of a plan (all-max when none is given), on the
job the plan file records, or on the job flags describe (the plan must fit it)."""

from __future__ import annotations

import argparse
from typing import Any

from perseus.cli._args import add_command, add_path_arg
from perseus.cli._job_args import CONFIG_FIELDS, add_job_arguments, job_from_args, job_from_frontier
from perseus.errors import ConfigError, PlanError

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
        "evaluate",
        run,
        "time and energy of one iteration under a plan (the job comes from the plan file)",
        "Evaluate a plan exactly: `perseus evaluate --plan plan.json` (the job the plan records), "
        "or `perseus evaluate PROFILE --microbatches N [--plan plan.json]`.",
    )
    add_job_arguments(p)
    add_path_arg(
        p, "--plan", "PLAN", "plan/frontier JSON (its first point is evaluated; its job is used)"
    )


def run(args: argparse.Namespace) -> int:
    from perseus.io.frontier_files import read_frontier

    frontier = read_frontier(args.plan) if args.plan is not None else None
    if frontier is not None and args.config is None and args.microbatches is None:
        flags = [
            "--" + n.replace("_", "-") for n in CONFIG_FIELDS if getattr(args, n, None) is not None
        ]
        if flags:
            raise ConfigError(
                f"{flags[0]}: the job comes from --plan {args.plan}; drop {flags[0]}, or give "
                "--microbatches/--config to describe the job yourself"
            )
        job = job_from_frontier(frontier, args.profile, args.plan, flag="PROFILE")
    else:
        job = job_from_args(args)
        if frontier is not None:
            job.check_frontier(frontier, args.plan)
    base = job.evaluate(job.allmax())
    if frontier is None:
        label, ev = "all-max", base
    else:
        try:
            ev = job.evaluate(job.flat(frontier.points[0]))
        except PlanError as e:
            raise PlanError(f"{args.plan}: field points.0.freqs_mhz: {e}") from None
        label = args.plan
    s = job.spec
    print(
        f"{s.schedule} {s.stages} stages x {s.microbatches} microbatches on {s.ranks} ranks, "
        f"blocking power {s.blocking_power_w:g} W\nplan:     {label}\ntime_s:   {ev.time_s:.6f}\n"
        f"energy_j: {ev.energy_j:.3f}"
    )
    if frontier is not None:
        print(
            f"vs all-max: time {100 * (ev.time_s / base.time_s - 1):+.2f} %, "
            f"energy {100 * (ev.energy_j / base.energy_j - 1):+.2f} %"
        )
    return 0
