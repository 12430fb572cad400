"""``perseus fleet``: many jobs under one power budget.

``perseus fleet plan JOBS.json --budget-w W`` assigns each job of the jobs file one plan of its
frontier so that the jobs' average power sums to at most ``W`` and the weighted sum of their
slowdowns is least (:mod:`perseus.solver.fleet`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from perseus.cli._args import float_arg

__all__ = ["register", "run_plan"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("fleet", help="many jobs, one power budget: a plan per job")
    inner = p.add_subparsers(dest="fleet_command", metavar="ACTION", parser_class=type(p))
    inner.required = True
    s = inner.add_parser(
        "plan",
        help="one frontier point per job: total average power <= the budget, least weighted "
        "slowdown",
    )
    s.add_argument(
        "jobs",
        metavar="JOBS.json",
        help='list of {"name", "frontier": path, "weight", "gpus"} (paths relative to the file)',
    )
    s.add_argument(
        "--budget-w",
        required=True,
        type=float_arg(gt=0, unit="W"),
        help="the fleet's power budget: the most the jobs' average power may sum to",
    )
    s.add_argument(
        "--per-gpu-cap-w",
        type=float_arg(gt=0, unit="W"),
        help="leave out plans whose average power per GPU exceeds this",
    )
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from perseus.fleet.jobs import read_fleet_jobs
    from perseus.solver.fleet import plan_fleet

    jobs = read_fleet_jobs(args.jobs, per_gpu_cap_w=args.per_gpu_cap_w)
    plan = plan_fleet(jobs, args.budget_w)
    if args.json:
        doc = {
            "jobs": [
                {
                    "name": a.name,
                    "point": a.point,
                    "time_s": a.time_s,
                    "average_power_w": a.average_power_w,
                    "peak_power_w": a.peak_power_w,
                }
                for a in plan.jobs
            ],
            "total_average_power_w": plan.total_average_power_w,
            "weighted_slowdown": plan.weighted_slowdown,
        }
        print(json.dumps(doc, indent=2))
        return 0
    width = max(len(a.name) for a in plan.jobs)
    print(f"{'job':<{width}}  point    time_s  avg_power_w  peak_power_w  slowdown")
    for a in plan.jobs:
        print(
            f"{a.name:<{width}}  {a.point:5d}  {a.time_s:8.4f}  {a.average_power_w:11.1f}  "
            f"{a.peak_power_w:12.1f}  {100 * a.slowdown:7.2f} %"
        )
    print(
        f"total average power {plan.total_average_power_w:.1f} W of {plan.budget_w:.1f} W; "
        f"weighted slowdown {plan.weighted_slowdown:.6g} (LP bound {plan.lp_bound:.6g})"
    )
    return 0
