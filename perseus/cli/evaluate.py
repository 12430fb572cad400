"""``perseus evaluate``: exact time and energy of a plan (all-max when none is given).

With ``--plan FILE`` alone the job is the one the plan file records (rebuilt on its profile:
``PROFILE`` if given, else the bundled profile the file names); with job flags
(``--microbatches``, ``--config``) the job comes from them and the plan must fit it.
"""

from __future__ import annotations

import argparse
from typing import Any

from perseus.cli._args import nonempty_arg
from perseus.cli._job_args import (
    CONFIG_FIELDS,
    add_job_arguments,
    check_plan_fits,
    job_from_args,
    job_from_frontier,
)
from perseus.errors import ConfigError, PlanError
from perseus.io.frontier_files import check_frontier_job, read_frontier
from perseus.plan import MAX_CLOCK_MHZ

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "evaluate",
        help="time and energy of one iteration under a plan (the job comes from the plan file)",
        description=(
            "Evaluate a plan exactly: `perseus evaluate --plan plan.json` (the job the plan "
            "records), or `perseus evaluate PROFILE --microbatches N [--plan plan.json]`."
        ),
    )
    add_job_arguments(p)
    p.add_argument(
        "--plan",
        type=nonempty_arg,
        help="plan/frontier JSON (its first point is evaluated; its job is used)",
    )
    p.set_defaults(handler=run)


def _job_flags_given(args: argparse.Namespace) -> list[str]:
    return [
        "--" + name.replace("_", "-")
        for name in CONFIG_FIELDS
        if getattr(args, name, None) is not None
    ]


def run(args: argparse.Namespace) -> int:
    frontier = None
    if args.plan is not None:
        frontier = read_frontier(args.plan)
        check_frontier_job(frontier, args.plan)
    if frontier is not None and args.config is None and args.microbatches is None:
        flags = _job_flags_given(args)
        if flags:
            raise ConfigError(
                f"{flags[0]}: the job comes from --plan {args.plan}; drop {flags[0]}, or give "
                "--microbatches/--config to describe the job yourself"
            )
        job = job_from_frontier(frontier, args.profile, args.plan, flag="PROFILE")
    else:
        job = job_from_args(args)
        if frontier is not None:
            check_plan_fits(job, frontier, args.plan)
    base = job.evaluate(job.allmax())
    if frontier is None:
        label, ev = "all-max", base
    else:
        point = frontier.points[0]
        _check_clocks(job, point.freqs_mhz, args.plan)
        label, ev = args.plan, job.evaluate(job.flat(point))
    s = job.spec
    print(
        f"{s.schedule} {s.stages} stages x {s.microbatches} microbatches on {s.ranks} ranks, "
        f"blocking power {s.blocking_power_w:g} W"
    )
    print(f"plan:     {label}")
    print(f"time_s:   {ev.time_s:.6f}")
    print(f"energy_j: {ev.energy_j:.3f}")
    if frontier is not None:
        print(
            f"vs all-max: time {100 * (ev.time_s / base.time_s - 1):+.2f} %, "
            f"energy {100 * (ev.energy_j / base.energy_j - 1):+.2f} %"
        )
    return 0


def _check_clocks(job: Any, freqs_mhz: Any, source: str) -> None:
    """Every clock of the plan must be one the profile measured for that op."""
    from perseus.schedule.actions import Kind

    for r, (ops, freqs) in enumerate(zip(job.schedule.rank_actions, freqs_mhz, strict=True)):
        for i, (action, f) in enumerate(zip(ops, freqs, strict=True)):
            if not isinstance(f, int):
                continue  # a two-clock op: the evaluator checks both clocks
            op = job.profile.ops.get((action.stage_index, Kind(action.kind)))
            if op is None:
                continue
            clocks = {o.freq_mhz for o in op.options}
            if f not in clocks:
                raise PlanError(
                    f"{source}: field points.0.freqs_mhz.{r}.{i}: {f} MHz is not a clock the "
                    f"profile measured for {action} ({min(clocks)}..{max(clocks)} MHz, "
                    f"at most {MAX_CLOCK_MHZ}); regenerate the plan"
                )
