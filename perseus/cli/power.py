"""``perseus power set|clear``: cap a running job's power, from outside.

A job run with ``power_store=`` reads the cap at its next iteration boundary and every pipeline
runs the fastest plan whose average power fits (:mod:`perseus.runtime.power.runtime`). Waits
are bounded as in ``perseus straggler``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Literal

from perseus.cli._args import add_store_command, float_arg

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    actions = {"set": "cap the job's average pipeline power at W watts", "clear": "remove the cap"}
    parsers = add_store_command(
        sub, "power", "set or clear a running job's power cap", actions, run
    )
    parsers["set"].add_argument(
        "--cap-w",
        type=float_arg(gt=0, le=1e7, unit="W"),
        required=True,
        help="the cap on each pipeline's average power, in watts",
    )
    parsers["set"].add_argument(
        "--per-gpu", action="store_true", help="--cap-w is per GPU, not per pipeline"
    )


def run(args: argparse.Namespace) -> int:
    from perseus.cli.straggler import await_ack, connect_store, within
    from perseus.errors import InfeasibleError
    from perseus.runtime.power.cap import (
        CAP_KEY,
        CLEARED,
        clear_cap,
        read_cap_ack,
        read_unheld,
        set_cap,
    )

    store = connect_store(args.store, args.timeout_s)
    if args.power_action == "set":
        scope: Literal["pipeline", "gpu"] = "gpu" if args.per_gpu else "pipeline"
        token = within(
            args.timeout_s, "setting the cap", args.store, lambda: set_cap(store, args.cap_w, scope)
        )
        what = f"delivered: {CAP_KEY} = {args.cap_w:g} W per {scope}"
    else:
        within(args.timeout_s, "clearing the cap", args.store, lambda: clear_cap(store))
        what, token = f"{CAP_KEY} cleared", CLEARED
    acked = await_ack(
        args,
        what,
        lambda: read_cap_ack(store),
        token,
        "a job started with power_store= reads it at each iteration boundary",
    )
    unheld = read_unheld(store, token) if acked == 0 and args.power_action == "set" else None
    if unheld is None:
        return acked
    lowest_w, ranks = unheld
    least_w = math.ceil((lowest_w / ranks if args.per_gpu else lowest_w) * 100) / 100  # up
    least = f"{least_w:.2f} W" + (" per GPU" if args.per_gpu else "")
    raise InfeasibleError(
        f"--cap-w {args.cap_w:g}: the job's lowest-power plan averages {least}, above the cap; "
        f"it runs that plan, so the cap does not hold; pass --cap-w of at least {least}"
    )
