"""``perseus fleet``: many jobs under one power budget (:mod:`perseus.solver.fleet`), planned
once from a jobs file or served from the fleet's database."""

from __future__ import annotations

import argparse
import json
from typing import Any

from perseus.cli._args import add_command, float_arg
from perseus.errors import ConfigError

__all__ = ["register", "run_budget", "run_plan", "run_serve", "run_status"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("fleet", help="many jobs, one power budget: a plan per job")
    inner = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    s = add_command(
        inner,
        "plan",
        run_plan,
        "one frontier point per job: total average power <= the budget, least weighted slowdown",
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
    db_help = "the fleet's database: sqlite:///FILE or postgresql://USER@HOST[:PORT]/DB"
    v = add_command(
        inner, "serve", run_serve, "re-solve the running jobs' plans as the fleet changes"
    )
    b = add_command(inner, "budget", run_budget, "set the fleet's power budget")
    t = add_command(inner, "status", run_status, "the budget and every member's plan")
    for parser in (v, b, t):
        parser.add_argument("--db", required=True, help=db_help)
    v.add_argument("--budget-w", type=float_arg(gt=0, unit="W"), help="set the budget first")
    v.add_argument(
        "--interval-s",
        type=float_arg(gt=0, le=3600, unit="s"),
        default=1.0,
        help="how often to look for changes (default 1 s)",
    )
    v.add_argument("--once", action="store_true", help="look once, re-solve if needed, exit")
    v.add_argument(
        "--budget-signal",
        metavar="FILE",
        help="a price/carbon signal CSV (plan schedule's format): while its value is above "
        "--signal-above, the budget is --signal-budget-w, else --budget-w",
    )
    v.add_argument(
        "--signal-above",
        type=float_arg(),
        help="the threshold, in the signal column's declared unit (e.g. EUR/MWh)",
    )
    v.add_argument(
        "--signal-budget-w",
        type=float_arg(gt=0, unit="W"),
        help="the budget while the signal is above the threshold",
    )
    b.add_argument("--set-w", required=True, type=float_arg(gt=0, unit="W"), help="watts")
    t.add_argument("--json", action="store_true", help="print as JSON")


def run_plan(args: argparse.Namespace) -> int:
    from perseus.fleet.jobs import read_fleet_jobs
    from perseus.solver.fleet import plan_fleet

    jobs = read_fleet_jobs(args.jobs, per_gpu_cap_w=args.per_gpu_cap_w)
    plan = plan_fleet(jobs, args.budget_w)
    if args.json:
        fields = ("name", "point", "time_s", "average_power_w", "peak_power_w")
        rows = [{k: getattr(a, k) for k in fields} for a in plan.jobs]
        total, slowdown = plan.total_average_power_w, plan.weighted_slowdown
        doc = {"jobs": rows, "total_average_power_w": total, "weighted_slowdown": slowdown}
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


def run_serve(args: argparse.Namespace) -> int:
    from perseus.device.clock import WALL_CLOCK
    from perseus.fleet.registry import FleetRegistry
    from perseus.fleet.serve import serve, signal_budget
    from perseus.io.power_files import read_signal

    track = None
    if args.budget_signal is not None:
        if None in (args.budget_w, args.signal_above, args.signal_budget_w):
            raise ConfigError(
                "--budget-signal: give --budget-w, --signal-above and --signal-budget-w too"
            )
        track = signal_budget(
            read_signal(args.budget_signal),
            budget_w=args.budget_w,
            above=args.signal_above,
            high_signal_budget_w=args.signal_budget_w,
        )
    elif args.signal_above is not None or args.signal_budget_w is not None:
        raise ConfigError("--signal-above and --signal-budget-w need --budget-signal FILE")
    with FleetRegistry(args.db, clock=WALL_CLOCK) as fleet:
        serve(
            fleet,
            clock=WALL_CLOCK,
            interval_s=args.interval_s,
            budget_w=args.budget_w,
            track=track,
            once=args.once,
        )
    return 0


def run_budget(args: argparse.Namespace) -> int:
    from perseus.fleet.registry import FleetRegistry

    with FleetRegistry(args.db) as fleet:
        fleet.set_budget(args.set_w)
    print(f"budget {args.set_w:g} W (re-solved at the planner's next look)")
    return 0


def run_status(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    from perseus.fleet.registry import FleetRegistry
    from perseus.recurring.database import parse_url

    target = parse_url(args.db)
    if target.engine == "sqlite" and not os.path.lexists(target.path):
        # A status look reads a fleet; it does not create an empty one at a mistyped path.
        raise ConfigError(
            f"--db {args.db}: no fleet database at {os.path.abspath(target.path)}; check the "
            "path (an absolute one is sqlite:////PATH, four slashes), or create the fleet with "
            "`perseus fleet budget` or `perseus fleet serve`"
        )
    with FleetRegistry(args.db) as fleet:
        budget_w, epoch, members = fleet.status()
    if args.json:
        doc = {
            "budget_w": budget_w,
            "epoch": epoch,
            "members": list(map(dataclasses.asdict, members)),
        }
        print(json.dumps(doc, indent=2))
        return 0
    shown = "none" if budget_w is None else f"{budget_w:.1f} W"
    planned = sum(m.cap_w or 0.0 for m in members if m.status == "running")
    print(f"budget {shown}, plan {epoch}, planned {planned:.1f} W")
    for m in members:
        plan = "-" if m.point is None or m.cap_w is None else f"point {m.point} ({m.cap_w:.1f} W)"
        ack = "" if m.ack_point is None else f", running {m.ack_point} since {m.ack_iteration}"
        print(f"  {m.name}: {m.status}, {plan}{ack}, lease renewed {m.heartbeat_age_s:.0f} s ago")
    return 0
