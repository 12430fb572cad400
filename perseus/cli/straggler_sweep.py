"""``perseus straggler-sweep``: job-level saving vs straggler slowdown, from one frontier
(the model: :mod:`perseus.runtime.straggler.sweep`); a table, also written as JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from perseus.cli._args import (
    add_command,
    add_output_arg,
    check_output_file,
    int_arg,
    message_stream,
)
from perseus.errors import ConfigError

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.runtime.straggler.sweep import StragglerCase

__all__ = ["format_sweep", "register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
        "straggler-sweep",
        run,
        "what-if: energy saving with one straggling pipeline, for each slowdown factor",
    )
    p.add_argument("frontier", metavar="FRONTIER.json", help="one pipeline's frontier")
    p.add_argument(
        "--pipelines",
        type=int_arg(ge=2, le=1_000_000),
        required=True,
        metavar="N",
        help="data-parallel pipelines in the job (one of them straggles)",
    )
    p.add_argument(
        "--factors",
        default="1.05:1.5:0.05",
        metavar="START:STOP:STEP",
        help="slowdown factors, start:stop:step or a comma list (default 1.05:1.5:0.05)",
    )
    add_output_arg(
        p, "FILE", "JSON table (default straggler-sweep.json)", default="straggler-sweep.json"
    )


def format_sweep(cases: tuple[StragglerCase, ...] | list[StragglerCase]) -> str:
    """The table as printed (and as pasted into the README)."""
    lines = [
        "| slowdown | T′ (s) | others' plan (s) | saving vs all-max | saving vs fastest plan |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(c.cells()) + " |" for c in cases]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from perseus.io.atomic import atomic_write_text
    from perseus.io.frontier_files import read_frontier
    from perseus.runtime.straggler.sweep import parse_factors, straggler_sweep

    check_output_file(args.out, inputs={"FRONTIER.json": args.frontier})
    factors = parse_factors(args.factors)
    frontier = read_frontier(args.frontier)
    say = message_stream(args.out)
    cases = straggler_sweep(frontier, pipelines=args.pipelines, factors=factors)
    j = frontier.job
    print(
        f"{args.pipelines} pipelines x {j.ranks} GPUs ({j.schedule}, {j.stages} stages x "
        f"{j.microbatches} microbatches); T_min {frontier.fastest.time_s:.3f} s, "
        f"T* {frontier.min_energy.time_s:.3f} s\n{format_sweep(cases)}",
        file=say,
    )
    payload = {
        "frontier": args.frontier,
        "pipelines": args.pipelines,
        "job": j.model_dump(),
        "cases": [asdict(c) for c in cases],
    }
    try:
        text = json.dumps(payload, indent=2, allow_nan=False)
    except ValueError:
        raise ConfigError(
            f"{args.frontier}: the sweep produced a non-finite figure; check the frontier's "
            "baseline and points"
        ) from None
    atomic_write_text(args.out, text + "\n")
    print(f"wrote {args.out}", file=say)
    return 0
