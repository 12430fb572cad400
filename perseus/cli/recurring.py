"""``perseus recurring simulate``: the recurring-job optimizer on Zeus-format traces, against
the default (``b0`` at the maximum power limit) and the oracle (the best fixed configuration in
hindsight): cumulative energy, time, cost and regret."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from perseus.cli._args import (
    check_output_file,
    check_output_folder,
    float_arg,
    int_arg,
    nonempty_arg,
)
from perseus.errors import ConfigError, InfeasibleError

__all__ = ["register", "run_simulate"]

#: Recurrences per seed (Zeus's evaluation runs 2 x |batch sizes| x |power limits|, ~200).
MAX_RECURRENCES = 100_000
#: Seeds to average over.
MAX_SEEDS = 1_000
#: Recurrences x seeds per workload: a replayed run takes 0.04-0.1 ms and keeps a record of
#: about 1 KB (200,000: about 12 s and 215 MB per workload on a 2-core VM).
MAX_REPLAYED_RUNS = 200_000


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "recurring", help="recurring jobs: batch size and GPU power limit across re-runs (Zeus)"
    )
    inner = p.add_subparsers(dest="recurring_command", metavar="ACTION", required=True)
    s = inner.add_parser(
        "simulate", help="replay Zeus traces: the optimizer vs the default and the oracle"
    )
    s.add_argument(
        "--trace",
        required=True,
        metavar="DIR",
        help="folder with summary_train.csv and summary_power_<gpu>.csv",
    )
    s.add_argument("--gpu", required=True, help="GPU name of the power trace (e.g. a40)")
    s.add_argument(
        "--workload",
        metavar="DATASET/NETWORK",
        help="one workload (default: every workload in the trace)",
    )
    s.add_argument(
        "--recurrences",
        type=int_arg(ge=1, le=MAX_RECURRENCES),
        metavar="N",
        help="recurrences per seed (default: 2 x batch sizes x power limits; at most "
        f"{MAX_RECURRENCES:,}, and {MAX_REPLAYED_RUNS:,} recurrences x seeds)",
    )
    for flag, kind, default, text in (
        (
            "--seeds",
            int_arg(ge=1, le=MAX_SEEDS),
            10,
            f"seeds to average over (default 10, at most {MAX_SEEDS:,})",
        ),
        ("--eta", float_arg(ge=0, le=1), 0.5, "energy-time weight in [0, 1] (default 0.5)"),
        ("--beta", float_arg(gt=1, le=100), 2.0, "early-stop factor, > 1 (default 2.0)"),
    ):
        s.add_argument(flag, type=kind, default=default, help=text)
    s.add_argument(
        "--profile-share",
        type=float_arg(ge=0, le=1),
        default=1.0,
        metavar="F",
        help="share of a batch size's first epoch spent profiling power limits "
        "(default 1.0, Zeus's assumption)",
    )
    s.add_argument(
        "--jobs",
        metavar="FILE",
        type=nonempty_arg,
        help="CSV of job definitions (default: Zeus's six jobs)",
    )
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s.add_argument(
        "--plot",
        metavar="DIR",
        type=nonempty_arg,
        help="write cumulative-cost and batch-size PNGs into DIR",
    )
    s.set_defaults(handler=run_simulate)


def _check_runs(recurrences: int | None, seeds: int, workload: str, default: int) -> None:
    n = recurrences if recurrences is not None else default
    if (runs := n * seeds) > MAX_REPLAYED_RUNS:
        given = f"--recurrences {n}" if recurrences is not None else f"{n} recurrences (default)"
        raise ConfigError(
            f"--seeds {seeds}: {given} x {seeds} seeds = {runs:,} replayed runs of {workload}; "
            f"the limit is {MAX_REPLAYED_RUNS:,} (about 0.1 ms and 1 KB each); lower "
            "--recurrences or --seeds"
        )


def _check(args: argparse.Namespace) -> None:
    if args.recurrences is not None:
        _check_runs(args.recurrences, args.seeds, "each workload", 0)
    if not Path(args.trace).is_dir():
        raise ConfigError(f"--trace {args.trace}: not a folder; pass the folder holding the CSVs")
    if args.plot is not None:
        check_output_folder(args.plot, "--plot")


def format_summary(gpu: str, document: dict[str, Any]) -> str:
    """Human-readable lines for the ``--json`` document."""
    lines = []
    for key, w in document["workloads"].items():
        n = w["recurrences"]
        lines.append(f"{key} on {gpu}: {n} recurrences, mean ± std over {w['seeds']} seeds")
        oracle = w["oracle"]
        for policy in ("optimizer", "default", "oracle"):
            b = w[policy]
            config = f"  (b={b['config'][0]}, {b['config'][1]} W)" if "config" in b else ""
            lines.append(
                f"  {policy:9s} energy {b['energy_j'] / 1e6:10.3f} ± {b['energy_j_std'] / 1e6:.3f}"
                f" MJ  time {b['time_s'] / 3600:9.2f} ± {b['time_s_std'] / 3600:.2f} h  cost "
                f"{b['cost'] / 1e6:10.3f} ± {b['cost_std'] / 1e6:.3f} MJ  "
                f"({100 * (b['cost'] / oracle['cost'] - 1):+.1f} % vs oracle){config}"
            )
        regret = w["optimizer"]["regret"]
        marks = sorted({r for r in (1, 2, 5, 10, 20, 50, 100, 200, n) if r <= n})
        lines.append(
            "  regret vs oracle after recurrence "
            + ", ".join(f"{r}: {100 * regret[r - 1]:.1f} %" for r in marks)
        )
    return "\n".join(lines)


def run_simulate(args: argparse.Namespace) -> int:
    from perseus.recurring.replay import default_recurrences, replay_workload, summary_json
    from perseus.recurring.trace import load_jobs, load_workloads
    from perseus.recurring.workload import ZEUS_JOBS

    _check(args)
    jobs = load_jobs(Path(args.jobs)) if args.jobs else ZEUS_JOBS
    workloads = load_workloads(Path(args.trace), args.gpu, jobs=jobs, workload=args.workload)
    for w in workloads:
        _check_runs(args.recurrences, args.seeds, w.key, default_recurrences(w))
    if args.plot is not None:
        from perseus.recurring.report import plot_paths

        for w in workloads:  # before minutes of replay, not after
            for path in plot_paths(w.key, Path(args.plot)):
                check_output_file(path, "--plot")
    summaries = []
    options = {"eta": args.eta, "beta": args.beta, "profile_share": args.profile_share}
    for w in workloads:
        try:
            summaries.append(
                replay_workload(w, recurrences=args.recurrences, seeds=range(args.seeds), **options)
            )
        except (ConfigError, InfeasibleError) as e:
            if args.workload:
                raise
            # One workload the trace cannot support must not hide the others.
            print(f"warning: skipping {w.key}: {e}", file=sys.stderr)
    if not summaries:
        raise ConfigError(
            f"{args.trace}: no workload could be simulated on {args.gpu}; see the warnings"
        )
    document = summary_json(args.gpu, summaries)
    if args.plot:
        from perseus.io.atomic import atomic_outputs
        from perseus.recurring.report import write_plots

        with atomic_outputs():  # every plot or none (a full disk)
            for s in summaries:
                write_plots(s, args.gpu, Path(args.plot))
    print(json.dumps(document, indent=1) if args.json else format_summary(args.gpu, document))
    return 0
