"""``perseus straggler set|clear``: declare a slowed pipeline to a running job, from outside.

The job's ranks read the hint at their next iteration boundary (global rank 0 reads the store,
the value travels in the ranks' all-reduce, see :mod:`perseus.runtime.straggler_runtime`), so
the other pipelines switch to a cheaper plan that finishes within the declared time::

    perseus straggler set --store 10.0.0.1:29500 --pipeline 1 --time-s 2.4
    perseus straggler clear --store 10.0.0.1:29500 --pipeline 1

``--store`` is the job's torch.distributed TCP store (torchrun's ``MASTER_ADDR:MASTER_PORT``).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from perseus.errors import ConfigError, PerseusError

__all__ = ["connect_store", "register", "run"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("straggler", help="declare or clear a slowed pipeline in a running job")
    actions = p.add_subparsers(dest="straggler_action", metavar="ACTION")
    actions.required = True
    for name, help_text in (
        ("set", "declare pipeline K slowed to T' seconds per iteration"),
        ("clear", "remove the declaration for pipeline K"),
    ):
        a = actions.add_parser(name, help=help_text)
        a.add_argument(
            "--store",
            required=True,
            metavar="HOST:PORT",
            help="the job's TCP store (torchrun's MASTER_ADDR:MASTER_PORT)",
        )
        a.add_argument("--pipeline", type=int, required=True, help="data-parallel replica index")
        a.add_argument("--timeout-s", type=float, default=10.0, help="connection timeout")
        if name == "set":
            a.add_argument(
                "--time-s",
                type=float,
                required=True,
                help="the pipeline's iteration time T' in seconds",
            )
    p.set_defaults(handler=run)


def connect_store(address: str, timeout_s: float = 10.0) -> Any:
    """A client of the TCP store at ``HOST:PORT``.

    Raises:
        ConfigError: for a malformed address.
        PerseusError: if nothing answers there within ``timeout_s``.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--store {address!r} is not HOST:PORT, e.g. 127.0.0.1:29500")
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
    except ImportError as e:
        raise ConfigError(
            "perseus straggler needs torch; pip install 'perseus-energy[torch]'"
        ) from e
    try:
        return TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as e:
        raise PerseusError(f"--store {address}: cannot connect to the job's store ({e})") from e


def run(args: argparse.Namespace) -> int:
    from perseus.runtime.straggler_runtime import clear_hint, hint_key, set_hint

    store = connect_store(args.store, args.timeout_s)
    if args.straggler_action == "set":
        set_hint(store, args.pipeline, args.time_s)
        print(f"{hint_key(args.pipeline)} = {args.time_s:g} s")
    else:
        clear_hint(store, args.pipeline)
        print(f"{hint_key(args.pipeline)} cleared")
    return 0
