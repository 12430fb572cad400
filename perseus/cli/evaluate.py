"""``perseus evaluate``: exact time and energy of a plan (all-max when none is given)."""

from __future__ import annotations

import argparse
from typing import Any

from perseus.cli._job_args import add_job_arguments, job_from_args
from perseus.io.frontier_files import read_frontier

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("evaluate", help="time and energy of one iteration under a plan")
    add_job_arguments(p)
    p.add_argument("--plan", help="plan/frontier JSON (its first point is evaluated)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args)
    base = job.evaluate(job.allmax())
    if args.plan is None:
        label, ev = "all-max", base
    else:
        frontier = read_frontier(args.plan)
        job.check_frontier(frontier, source=args.plan)
        label, ev = args.plan, job.evaluate(job.flat(frontier.points[0]))
    s = job.spec
    print(
        f"{s.schedule} {s.stages} stages x {s.microbatches} microbatches on {s.ranks} ranks, "
        f"blocking power {s.blocking_power_w:g} W"
    )
    print(f"plan:     {label}")
    print(f"time_s:   {ev.time_s:.6f}")
    print(f"energy_j: {ev.energy_j:.3f}")
    if args.plan is not None:
        print(
            f"vs all-max: time {100 * (ev.time_s / base.time_s - 1):+.2f} %, "
            f"energy {100 * (ev.energy_j / base.energy_j - 1):+.2f} %"
        )
    return 0
