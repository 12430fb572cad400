"""``perseus frontier``: trace the time–energy frontier of a job and write it as JSON."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from perseus.cli._args import add_output_arg, check_output_file, float_arg, message_stream
from perseus.cli._job_args import add_job_arguments, job_from_args
from perseus.cli._progress import progress_bar
from perseus.log import get_logger

if TYPE_CHECKING:
    from perseus.plan import Frontier
    from perseus.solver.frontier import FrontierTrace

__all__ = ["register", "run"]

logger = get_logger(__name__)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "frontier",
        help="trace the time-energy frontier (every point a real, exactly evaluated plan)",
    )
    p.set_defaults(handler=run)
    add_job_arguments(p)
    p.add_argument(
        "--time-quantum-s",
        type=float_arg(gt=0, le=3600, unit="s"),
        help="minimum step of the tracer in seconds (default: exact steps, breakpoint to breakpoint)",
    )
    p.add_argument(
        "--fold",
        choices=("auto", "always", "never"),
        default="auto",
        help="walk a copy of the job with stages+8 microbatches and lift its plans: auto "
        "(default) folds jobs of more than 2048 ops; never walks the full job (hours at 32x512)",
    )
    p.add_argument(
        "--min-gap-fraction",
        type=float_arg(ge=0, lt=1),
        default=1e-3,
        help="keep points at least this fraction of the fastest time apart (default 0.001; "
        "0: every breakpoint; else at least 1e-6)",
    )
    p.add_argument("--all-points", action="store_true", help="keep every Pareto point found")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_output_arg(p, "FILE", "frontier JSON to write (atomically)")
    p.add_argument(
        "--power-curve",
        metavar="FILE.csv",
        help="also write the (time, average power, peak power, dP/dT) curve a cluster power "
        "manager reads, one row per plan",
    )
    p.add_argument(
        "--max-clocks-per-op",
        type=int,
        choices=(1, 2, 3, 4),
        help="1: one clock per op; 2: an op may switch clock once at a layer boundary (needs "
        "--layers-per-stage; the default when it is given); 3-4: up to that many phases",
    )


def run(args: argparse.Namespace) -> int:
    from perseus.io.atomic import atomic_outputs, check_distinct_outputs
    from perseus.io.frontier_files import write_frontier
    from perseus.io.power_files import write_power_curve
    from perseus.solver import trace
    from perseus.solver.power import with_power

    inputs = {"--config": args.config, "PROFILE": args.profile}
    check_output_file(args.out, inputs=inputs)
    if args.power_curve is not None:
        check_output_file(args.power_curve, flag="--power-curve", inputs=inputs)
    check_distinct_outputs({"-o": args.out, "--power-curve": args.power_curve})
    job = job_from_args(args)
    s = job.spec
    logger.info(
        "job: %s, %d stages x %d microbatches, %d ops",
        s.schedule,
        s.stages,
        s.microbatches,
        job.graph.num_nodes,
    )
    started = time.perf_counter()
    with progress_bar("frontier", enabled=not args.no_progress, solve=True) as update:
        result = trace(
            job,
            time_quantum_s=args.time_quantum_s,
            min_gap_fraction=args.min_gap_fraction,
            all_points=args.all_points,
            progress=update,
            fold={"auto": None, "always": True, "never": False}[args.fold],
            max_clocks_per_op=args.max_clocks_per_op,
        )
    elapsed = time.perf_counter() - started
    frontier = with_power(job, result.frontier)
    with atomic_outputs():  # both or neither: a pair from one run
        write_frontier(frontier, args.out)
        if args.power_curve is not None:
            write_power_curve(frontier, args.power_curve)
    print(_summary(args, frontier, result, elapsed), file=message_stream(args.out))
    return 0


def _summary(
    args: argparse.Namespace, frontier: Frontier, result: FrontierTrace, elapsed: float
) -> str:
    """What ``perseus frontier`` says about the frontier it wrote; a partial walk warns on stderr."""
    s, base, best, fastest = frontier.job, frontier.baseline, frontier.min_energy, frontier.fastest
    same_speed = frontier.cheapest_within(base.time_s)
    lines = [
        f"{s.schedule} {s.stages} stages x {s.microbatches} microbatches on {s.ranks} ranks, "
        f"blocking power {s.blocking_power_w:g} W",
        f"points:      {len(frontier.points)} (in {elapsed:.2f} s, {result.iterations} iterations)",
    ]
    if result.folded_microbatches is not None:
        lines.append(
            f"folded:      walked {s.stages} stages x {result.folded_microbatches} microbatches "
            "and lifted its plans (--fold never walks the full job)"
        )
    lines += [
        f"fastest:     {fastest.time_s:.6f} s, {fastest.energy_j:.1f} J",
        f"min energy:  {best.time_s:.6f} s, {best.energy_j:.1f} J (T*)",
        f"all-max:     {base.time_s:.6f} s, {base.energy_j:.1f} J; no-slowdown saving "
        f"{100 * (1 - same_speed.energy_j / base.energy_j):.2f} %",
    ]
    if same_speed.num_two_clock_ops:
        lines.append(f"two-clock:   {same_speed.num_switches} mid-op switches per iteration")
    if same_speed.memory_clocks_mhz:
        mem = ", ".join(str(m) for m in sorted(same_speed.memory_clocks_mhz))
        lines.append(f"memory:      the no-slowdown plan sets memory clocks {mem} MHz")
    if not result.complete:
        print(
            f"warning: the min-cut walk stopped early ({result.stop_reason}) after "
            f"{result.iterations} iterations; the fast end of the frontier comes from the "
            "baselines only",
            file=sys.stderr,
        )
    lines.append(
        f"power:       {fastest.avg_power_w:.1f} W average at the fastest plan, "
        f"{best.avg_power_w:.1f} W at T*"
    )
    if args.power_curve is not None:
        lines.append(f"wrote {args.power_curve}")
    return "\n".join([*lines, f"wrote {args.out}"])
