"""``perseus export``: write one plan of a frontier in another stack's format (``zeus-pfo``:
what Zeus's pipeline frequency optimizer server serves, :mod:`perseus.io.zeus_export`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_command, add_output_arg, check_output_dir, float_arg
from perseus.errors import ConfigError, PlanError
from perseus.validate import show_value

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.plan import Frontier, PlanPoint

__all__ = ["register", "run", "select_point"]

_FORMATS = ("zeus-pfo",)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(sub, "export", run, "write a plan for another stack (Zeus PFO server)")
    p.add_argument("frontier", metavar="FRONTIER.json", help="frontier or plan file")
    p.add_argument("--format", required=True, choices=_FORMATS, help="output format")
    add_output_arg(p, "DIR", "output directory (replaced atomically)")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--plan",
        default="fastest",
        metavar="fastest|min-energy|INDEX",
        help="which point (default fastest)",
    )
    which.add_argument(
        "--max-time-s",
        type=float_arg(gt=0, unit="s"),
        metavar="T",
        help="the cheapest plan whose iteration time is at most T seconds",
    )


def select_point(
    frontier: Frontier,
    plan: str,
    max_time_s: float | None,
    source: str = "the frontier",
    flag: str = "--max-time-s",
) -> tuple[int, PlanPoint]:
    """The chosen point and its index: the cheapest within ``max_time_s`` (given by ``flag``)
    when it is given, else ``plan`` (ConfigError for an unknown name, an index out of range,
    or a time below T_min)."""
    points = frontier.points
    if max_time_s is not None:
        if max_time_s < frontier.fastest.time_s * (1 - 1e-12):
            raise ConfigError(
                f"{flag} {max_time_s:g}: below the fastest plan of {source} "
                f"({frontier.fastest.time_s:.6g} s); pass at least that"
            )
        point = frontier.cheapest_within(max_time_s)
    elif plan == "fastest":
        point = frontier.fastest
    elif plan == "min-energy":
        point = frontier.min_energy
    else:
        text = plan.strip()
        if not (text.isascii() and text.isdecimal() and len(text) < 12):
            raise ConfigError(
                f"--plan {show_value(plan)}: use fastest, min-energy or an index "
                f"0..{len(points) - 1}"
            )
        index = int(text)
        if not 0 <= index < len(points):
            raise ConfigError(f"--plan {index}: {source} has points 0..{len(points) - 1}")
        return index, points[index]
    return points.index(point), point


def run(args: argparse.Namespace) -> int:
    from perseus.io.atomic import atomic_directory
    from perseus.io.frontier_files import read_frontier
    from perseus.io.zeus_export import ZEUS_PFO_FILES, write_zeus_pfo

    out = check_output_dir(args.out, (*ZEUS_PFO_FILES, "point_solution.json"))
    frontier = read_frontier(args.frontier)
    index, point = select_point(frontier, args.plan, args.max_time_s, args.frontier)
    try:
        with atomic_directory(out) as tmp:
            write_zeus_pfo(frontier, point, tmp)
    except PlanError as e:  # a two-clock op: name the file, the point and the flag that picks
        where = f"{args.frontier}: field points.{index}.freqs_mhz"
        raise PlanError(f"{where}: {e} (or pick another point with --plan)") from None
    print(
        f"plan {index} of {len(frontier.points)}: {point.time_s:.4f} s, {point.energy_j / 1e3:.3f} kJ "
        f"({100 * (1 - point.energy_j / frontier.baseline.energy_j):.1f} % less energy than all-max)"
    )
    print(f"wrote {out}/ ({', '.join(ZEUS_PFO_FILES)}) for Zeus's pipeline frequency optimizer")
    print(
        "serve it: ZEUS_PFO_SCHEDULER=PointSolution ZEUS_PFO_SCHEDULER_ARGS="
        f'\'{{"solution_path": "{out.resolve() / "point_solution.py"}"}}\' '
        "uvicorn zeus.optimizer.pipeline_frequency.server.router:app --port 7787"
    )
    return 0
