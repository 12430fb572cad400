"""``perseus plan pick``: choose one plan from a frontier by deadline, slowdown or power budget;
``perseus plan schedule``: the least-cost plan schedule over a price/carbon signal."""

from __future__ import annotations

import argparse
import math
from typing import Any

from perseus.cli._args import add_output_arg, check_output_file, float_arg, int_arg, message_stream
from perseus.errors import ConfigError, InfeasibleError

__all__ = ["register", "run", "run_schedule"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("plan", help="work with plans (pick one from a frontier)")
    plan_sub = p.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    _add_pick(plan_sub)
    _add_schedule(plan_sub)


def _add_pick(plan_sub: argparse._SubParsersAction[Any]) -> None:
    pick = plan_sub.add_parser(
        "pick",
        help="the cheapest plan within a deadline, or the fastest under a power budget",
        description=(
            "Pick the lowest-energy plan no slower than a deadline: --time-s T, --slowdown X "
            "(T = X times the fastest time), or --straggler-time-s T' (another rank is this "
            "slow; beyond the minimum-energy time T* this picks T*); or the fastest plan whose "
            "average (--power-cap-w W) or peak (--peak-power-w W) summed pipeline power is at "
            "most W (--per-gpu: W per GPU)."
        ),
    )
    pick.add_argument("frontier", metavar="FRONTIER.json")
    which = pick.add_mutually_exclusive_group(required=True)
    seconds, watts = float_arg(gt=0, unit="s"), float_arg(gt=0, le=1e7, unit="W")
    at_most = "pipeline power is at most this many watts"
    for flag, kind, text in (
        ("--time-s", seconds, "iteration time budget in seconds"),
        ("--slowdown", float_arg(ge=1, le=1000), "budget as a multiple of the fastest time (>= 1)"),
        ("--straggler-time-s", seconds, "iteration time of a straggler"),
        ("--power-cap-w", watts, f"the fastest plan whose average {at_most}"),
        ("--peak-power-w", watts, f"the fastest plan whose peak summed {at_most}"),
    ):
        which.add_argument(flag, type=kind, help=text)
    pick.add_argument(
        "--off-frontier",
        action="store_true",
        help="with --peak-power-w: also search plans off the frontier (exhaustive on small "
        "jobs, else greedy peak shaving; needs the job's profile: slow on large jobs)",
    )
    pick.add_argument(
        "--profile",
        metavar="PROFILE",
        help="with --off-frontier: the profile the frontier was computed from (default: the "
        "bundled profile it names)",
    )
    pick.add_argument(
        "--per-gpu",
        action="store_true",
        help="--power-cap-w/--peak-power-w are per GPU (times the pipeline's ranks)",
    )
    add_output_arg(pick, "FILE", "plan JSON to write (atomically)")
    pick.set_defaults(handler=run)


def _add_schedule(plan_sub: argparse._SubParsersAction[Any]) -> None:
    sched = plan_sub.add_parser(
        "schedule",
        help="the least-cost plan schedule over a price/carbon signal",
        description=(
            "Run --iterations N iterations by --deadline-s D at the least total cost "
            "sum(value x kWh), choosing per signal interval a frontier plan or a mix of two "
            "adjacent ones (an exact solution over the frontier's lower convex hull)."
        ),
    )
    sched.add_argument("frontier", metavar="FRONTIER.json")
    sched.add_argument(
        "--signal",
        required=True,
        action="append",
        metavar="FILE.csv",
        help="rows `start, value` (seconds or ISO 8601 times, cost per kWh), or a header naming "
        "units: `start,price_eur_per_mwh,carbon_g_per_kwh_location_average`; give it twice "
        "for prices and carbon in two files",
    )
    sched.add_argument(
        "--objective",
        choices=("price", "carbon", "value"),
        help="which series to minimise when the signal has several (default: the first)",
    )
    sched.add_argument(
        "--idle-power-w",
        type=float_arg(ge=0, le=1e5, unit="W"),
        help="power of one GPU the job holds while it runs no iteration (default: the GPU "
        "preset's idle power, from the frontier's profile; `perseus doctor` measures it)",
    )
    sched.add_argument(
        "--iterations", type=int_arg(ge=1, le=10**12), required=True, help="iterations to run"
    )
    sched.add_argument(
        "--deadline-s",
        type=float_arg(gt=0, le=31557600000.0, unit="s"),  # a thousand years, as the solver
        required=True,
        help="seconds from the signal's first row by which all iterations must finish",
    )
    add_output_arg(sched, "FILE", "schedule JSON to write (atomically)")
    sched.set_defaults(handler=run_schedule)


def run(args: argparse.Namespace) -> int:
    from perseus.io.frontier_files import read_frontier, write_frontier

    check_output_file(args.out, inputs={"FRONTIER.json": args.frontier, "--profile": args.profile})
    frontier = read_frontier(args.frontier)
    by_power = args.power_cap_w is not None or args.peak_power_w is not None
    if args.per_gpu and not by_power:
        raise ConfigError("--per-gpu: only with --power-cap-w or --peak-power-w; drop it")
    if (args.off_frontier or args.profile is not None) and args.peak_power_w is None:
        raise ConfigError("--off-frontier/--profile: only with --peak-power-w; drop them")
    if by_power:
        point, lines = _pick_under_power(args, frontier)
    else:
        point, lines = _pick_by_time(args, frontier)
    write_frontier(frontier.with_points([point]), args.out)
    print("\n".join([*lines, f"wrote {args.out}"]), file=message_stream(args.out))
    return 0


def _pick_by_time(args: argparse.Namespace, frontier: Any) -> tuple[Any, list[str]]:
    from perseus.cli.export import select_point

    if args.slowdown is not None:
        flag, deadline = "--slowdown", frontier.fastest.time_s * args.slowdown
        how = f"slowdown {args.slowdown:g}"
    else:
        flag = "--time-s" if args.time_s is not None else "--straggler-time-s"
        deadline = args.time_s if args.time_s is not None else args.straggler_time_s
        how = f"{flag} {deadline:g}"
    _, point = select_point(frontier, "", deadline, args.frontier, flag)
    base = frontier.baseline
    return point, [
        f"picked ({how}): {point.time_s:.6f} s, {point.energy_j:.1f} J "
        f"({100 * (point.time_s / base.time_s - 1):+.2f} % time, "
        f"{100 * (point.energy_j / base.energy_j - 1):+.2f} % energy vs all-max)"
    ]


def _pick_under_power(args: argparse.Namespace, frontier: Any) -> tuple[Any, list[str]]:
    peak = args.peak_power_w is not None
    if args.profile is not None and not args.off_frontier:
        raise ConfigError("--profile: only with --off-frontier; add it or drop --profile")
    missing = [i for i, p in enumerate(frontier.points) if p.power is None]
    if peak and not args.off_frontier and missing:
        raise ConfigError(
            f"{args.frontier}: field points.{missing[0]}.power: missing (files before schema "
            "version 3 carry none), so --peak-power-w has no peaks to compare; regenerate it with "
            "`perseus frontier`, or pass --power-cap-w or --off-frontier"
        )
    given = args.peak_power_w if peak else args.power_cap_w
    ranks = frontier.job.ranks
    budget_w = given * ranks if args.per_gpu else given
    point, notes = _power_point(args, frontier, budget_w, peak)
    how = f"{'--peak-power-w' if peak else '--power-cap-w'} {given:g}" + (
        f" per GPU x {ranks} ranks = {budget_w:g} W" if args.per_gpu else ""
    )
    peak_text = f", peak {point.power.peak_power_w:.1f} W" if point.power is not None else ""
    return point, [
        f"picked ({how}): {point.time_s:.6f} s, {point.energy_j:.1f} J, average "
        f"{point.avg_power_w:.1f} W{peak_text} "
        f"({100 * (point.time_s / frontier.baseline.time_s - 1):+.2f} % time vs all-max)",
        *notes,
    ]


def _power_point(
    args: argparse.Namespace, frontier: Any, budget_w: float, peak: bool
) -> tuple[Any, list[str]]:
    """The plan picked under the budget and the lines that explain it: the off-frontier
    search's result, the uniform power-limit fallback, a faster time-sharing mix."""
    from perseus.solver.power import fastest_under_power, time_share_under_power

    try:
        if peak and args.off_frontier:
            return _off_frontier(args, frontier, budget_w)
        point = fastest_under_power(
            frontier.points, budget_w, measure="peak" if peak else "average"
        )
    except InfeasibleError as e:
        if not peak or any(p.power is None for p in frontier.points):
            raise  # no fallback without the points' peaks (an --off-frontier search's frontier)
        # Below every plan's peak: the lowest-peak plan under a uniform per-GPU power limit,
        # which holds each GPU, and so the sum, under the budget.
        limit_w, floor_w = budget_w / frontier.job.ranks, frontier.job.blocking_power_w
        whole_w = math.floor(limit_w)  # `nvidia-smi -pl` takes whole watts: round down
        if whole_w < floor_w:  # no GPU runs below what it draws while it waits
            least = math.ceil(floor_w) * (1 if args.per_gpu else frontier.job.ranks)
            raise InfeasibleError(
                f"{e}; nor does a uniform power limit: {limit_w:.6g} W per GPU is below the "
                f"{floor_w:g} W a GPU of this job draws while it waits (job.blocking_power_w); "
                f"pass --peak-power-w of at least {least:.6g} W"
            ) from None
        point = min(frontier.points, key=lambda p: (p.power.peak_power_w, p.time_s))
        return point, [
            f"fallback: {e}; falling back to a uniform power limit of {limit_w:.6g} W per GPU: "
            f"set it with `nvidia-smi -pl {whole_w}` on every GPU of the job (the plan "
            "written is the lowest-peak plan; the limit slows it further, by an amount the "
            "frontier does not model)"
        ]
    mix = None if peak else time_share_under_power(frontier.points, budget_w)
    if mix is None or mix.mean_time_s >= point.time_s:
        return point, []
    return point, [
        f"time-sharing: alternating points {mix.fast_index} "
        f"({100 * mix.fast_share:.1f} % of iterations) and {mix.slow_index} averages "
        f"{mix.mean_time_s:.6f} s at {mix.avg_power_w:.1f} W "
        f"({100 * (mix.mean_time_s / point.time_s - 1):+.2f} % vs the picked plan); "
        "a plan schedule runs such a mix"
    ]


def _off_frontier(
    args: argparse.Namespace, frontier: Any, budget_w: float
) -> tuple[Any, list[str]]:
    from perseus.cli._job_args import job_from_frontier
    from perseus.solver.power_peak import fastest_under_peak

    job = job_from_frontier(frontier, args.profile, args.frontier)
    found = fastest_under_peak(job, frontier.points, budget_w)
    point = found.point
    vs = "no frontier plan fits"
    if found.frontier_time_s is not None:
        vs = f"{100 * (point.time_s / found.frontier_time_s - 1):+.2f} % vs the frontier's pick"
    exact = (
        "exact"
        if found.method == "exhaustive"
        else f"at most {100 * found.gap:.2f} % above a lower bound"
    )
    return point, [
        f"off the frontier ({found.method}, {found.evaluated} plans timed): {vs}; {exact}"
    ]


def _idle_power_w(args: argparse.Namespace, frontier: Any) -> tuple[float, str]:
    """Per-GPU idle power and where it comes from: the flag, or the preset of the GPU the
    frontier's profile names."""
    if args.idle_power_w is not None:
        return args.idle_power_w, "--idle-power-w"
    from perseus.device.presets import preset_for_name

    gpu_name = frontier.job.gpu.name if frontier.job.gpu is not None else ""  # else: none recorded
    preset = preset_for_name(f"{gpu_name} {frontier.job.profile_name or ''}")
    if preset is not None:
        estimate = " (an estimate)" if preset.estimated else ""
        return preset.power.idle_w, f"the {preset.key} preset{estimate}"
    raise ConfigError(
        f"{args.frontier}: the profile ({frontier.job.profile_name or 'unnamed'}) names no known "
        "GPU, so its idle power is unknown; pass --idle-power-w W (the idle figure of "
        "`perseus doctor`, or 0 to leave idle GPUs out)"
    )


def run_schedule(args: argparse.Namespace) -> int:
    from perseus.io.frontier_files import read_frontier
    from perseus.io.power_files import read_signal, write_schedule
    from perseus.solver.power_schedule import J_PER_KWH, schedule_plans

    check_output_file(args.out, inputs={"FRONTIER.json": args.frontier, "--signal": args.signal})
    frontier = read_frontier(args.frontier)
    gpu_idle_w, idle_source = _idle_power_w(args, frontier)
    signal = read_signal(*args.signal)
    series = signal.pick(args.objective)
    idle_w = gpu_idle_w * frontier.job.ranks
    schedule = schedule_plans(
        frontier.points,
        signal.starts_s,
        series.values_per_kwh,
        iterations=args.iterations,
        deadline_s=args.deadline_s,
        baseline_time_s=frontier.baseline.time_s,
        idle_power_w=idle_w,
    )
    write_schedule(schedule, frontier, args.out, series, signal.origin)
    origin = f" from {signal.origin.isoformat()}" if signal.origin else ""
    gap = (
        100 * (schedule.cost - schedule.lp_cost) / abs(schedule.lp_cost) if schedule.lp_cost else 0
    )
    lines = [
        f"schedule: {schedule.iterations} iterations by {schedule.deadline_s:g} s over "
        f"{schedule.starts_s.size} intervals ({schedule.used().size} used), finishing at "
        f"{schedule.finish_s:.6g} s; {len(schedule.segments())} plan segments",
        f"signal:   {series.describe()}{origin}; GPUs held until the deadline, idle at "
        f"{gpu_idle_w:g} W each x {frontier.job.ranks} ({idle_source})",
        f"cost:     {series.amount(schedule.cost)} (exact optimum over plan mixes "
        f"{series.amount(schedule.lp_cost)}, whole iterations {gap:+.3g} %; energy "
        f"{schedule.total_energy_j / J_PER_KWH:.6g} kWh, idle {schedule.idle_energy_j.sum() / J_PER_KWH:.6g})",
    ]
    for other in signal.series:
        if other is not series:
            total = schedule.cost_on(other.values_per_kwh[: schedule.starts_s.size])
            lines.append(f"also:     {other.amount(total)} ({other.describe()})")
    base = schedule.baseline_cost
    if base is not None:
        saving = (base - schedule.cost) / abs(base) if base else 0.0
        lines.append(
            f"baseline: {series.amount(base)} running the no-slowdown plan "
            f"(point {schedule.baseline_index}) back to back; saving {100 * saving:.2f} %"
        )
    else:
        lines.append(
            "baseline: the no-slowdown plan run back to back misses the deadline (no saving figure)"
        )
    print("\n".join([*lines, f"wrote {args.out}"]), file=message_stream(args.out))
    return 0
