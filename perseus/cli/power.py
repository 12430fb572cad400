"""``perseus power set|clear``: cap a running job's power, from outside.

The job's ranks read the cap at their next iteration boundary (rank 0 of the job reads the
store, the value travels in an all-reduce, see :mod:`perseus.runtime.power.runtime`), and every
pipeline runs the fastest plan whose average power fits from the iteration after::

    perseus power set --store 10.0.0.1:29500 --cap-w 2400
    perseus power set --store 10.0.0.1:29500 --cap-w 300 --per-gpu
    perseus power clear --store 10.0.0.1:29500

The job must run with ``power_store=`` (``RankSession``/``PerseusPipeline``). Waits are bounded
as in ``perseus straggler``: the store must answer within ``--timeout-s``, and the command
waits up to ``--wait-s`` for the job's acknowledgement (exit 0 when it came, 1 when no running
job read the cap yet; it stays in the store).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, Literal

from perseus.cli._args import add_job_store_args, float_arg

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("power", help="set or clear a running job's power cap")
    actions = p.add_subparsers(dest="power_action", metavar="ACTION")
    actions.required = True
    for name, help_text in (
        ("set", "cap the job's average pipeline power at W watts"),
        ("clear", "remove the cap"),
    ):
        a = actions.add_parser(name, help=help_text)
        add_job_store_args(a)
        if name == "set":
            a.add_argument(
                "--cap-w",
                type=float_arg(gt=0, le=1e7, unit="W"),
                required=True,
                help="the cap on each pipeline's average power, in watts",
            )
            a.add_argument(
                "--per-gpu", action="store_true", help="--cap-w is per GPU, not per pipeline"
            )
    p.set_defaults(handler=run)


def _wait_for_ack(
    store: Any, accept: Callable[[str], bool], wait_s: float, poll_s: float = 0.1
) -> int | bool | None:
    from perseus.runtime.power.cap import read_cap_ack

    deadline = time.monotonic() + wait_s
    while True:
        ack = read_cap_ack(store)
        if ack is not None and accept(ack[0]):
            return ack[1]
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def run(args: argparse.Namespace) -> int:
    from perseus.cli.straggler import connect_store, within
    from perseus.runtime.power.cap import CAP_KEY, CLEARED, clear_cap, set_cap

    store = connect_store(args.store, args.timeout_s)
    if args.power_action == "set":
        scope: Literal["pipeline", "gpu"] = "gpu" if args.per_gpu else "pipeline"
        token = within(
            args.timeout_s,
            "setting the cap",
            args.store,
            lambda: set_cap(store, args.cap_w, scope),
        )
        what = f"delivered: {CAP_KEY} = {args.cap_w:g} W per {scope}"

        def accept(seen: str) -> bool:
            return seen == token

    else:
        within(args.timeout_s, "clearing the cap", args.store, lambda: clear_cap(store))
        what = f"{CAP_KEY} cleared"

        def accept(seen: str) -> bool:
            return seen == CLEARED

    if args.wait_s == 0:
        print(f"{what} (not waiting for the job's acknowledgement: --wait-s 0)")
        return 0
    seen = within(
        args.wait_s + args.timeout_s,
        "waiting for the acknowledgement",
        args.store,
        lambda: _wait_for_ack(store, accept, args.wait_s),
    )
    if seen is False:
        print(
            f"{what}; no running job has read it yet (no acknowledgement within "
            f"{args.wait_s:g} s): a job started with power_store= reads it at each iteration "
            "boundary"
        )
        return 1
    at = f"at iteration {seen}" if seen is not None else "at its last iteration boundary"
    print(f"{what}; acknowledged by the job {at}")
    return 0
