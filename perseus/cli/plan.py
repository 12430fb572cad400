"""``perseus plan pick``: choose one plan from a frontier by deadline or slowdown."""

from __future__ import annotations

import argparse
from typing import Any

from perseus.cli._args import check_output_file, float_arg, message_stream
from perseus.errors import ConfigError
from perseus.io.frontier_files import check_frontier_job, read_frontier, write_frontier

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("plan", help="work with plans (pick one from a frontier)")
    plan_sub = p.add_subparsers(dest="plan_command", metavar="ACTION", parser_class=type(p))
    plan_sub.required = True
    pick = plan_sub.add_parser(
        "pick",
        help="the cheapest plan within a deadline",
        description=(
            "Pick the lowest-energy plan no slower than a deadline: --time-s T, --slowdown X "
            "(T = X times the fastest time), or --straggler-time-s T' (another rank is this "
            "slow; beyond the minimum-energy time T* this picks T*)."
        ),
    )
    pick.add_argument("frontier", metavar="FRONTIER.json")
    which = pick.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--time-s", type=float_arg(gt=0, unit="s"), help="iteration time budget in seconds"
    )
    which.add_argument(
        "--slowdown",
        type=float_arg(ge=1, le=1000),
        help="budget as a multiple of the fastest time (>= 1)",
    )
    which.add_argument(
        "--straggler-time-s",
        type=float_arg(gt=0, unit="s"),
        help="iteration time of a straggler",
    )
    pick.add_argument(
        "-o",
        "--out",
        "--output",
        dest="out",
        required=True,
        metavar="FILE",
        help="plan JSON to write (atomically)",
    )
    pick.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out)
    frontier = read_frontier(args.frontier)
    check_frontier_job(frontier, args.frontier)
    fastest = frontier.fastest.time_s
    if args.slowdown is not None:
        deadline = fastest * args.slowdown
        how = f"slowdown {args.slowdown:g}"
    else:
        deadline = args.time_s if args.time_s is not None else args.straggler_time_s
        flag = "--time-s" if args.time_s is not None else "--straggler-time-s"
        how = f"{flag} {deadline:g}"
        if deadline < fastest * (1 - 1e-12):
            raise ConfigError(
                f"{flag} {deadline:g}: below the fastest plan of {args.frontier} "
                f"({fastest:.6g} s); pass at least {fastest:.6g}"
            )
    point = frontier.cheapest_within(deadline)
    write_frontier(frontier.with_points([point]), args.out)
    say = message_stream(args.out)
    base = frontier.baseline
    print(
        f"picked ({how}): {point.time_s:.6f} s, {point.energy_j:.1f} J "
        f"({100 * (point.time_s / base.time_s - 1):+.2f} % time, "
        f"{100 * (point.energy_j / base.energy_j - 1):+.2f} % energy vs all-max)",
        file=say,
    )
    print(f"wrote {args.out}", file=say)
    return 0
