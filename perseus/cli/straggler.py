"""``perseus straggler set|clear``: declare a slowed pipeline to a running job, from outside.

The job's ranks read the hint at their next iteration boundary (global rank 0 reads the store,
the value travels in the ranks' all-reduce, see :mod:`perseus.runtime.straggler.switching`), so
the other pipelines switch to a cheaper plan that finishes within the declared time::

    perseus straggler set --store 10.0.0.1:29500 --pipeline 1 --time-s 2.4
    perseus straggler clear --store 10.0.0.1:29500 --pipeline 1

``--store`` is the job's torch.distributed TCP store (torchrun's ``MASTER_ADDR:MASTER_PORT``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from perseus.cli._args import float_arg, int_arg
from perseus.errors import ConfigError, PerseusError
from perseus.validate import show_value

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
        a.add_argument(
            "--pipeline",
            type=int_arg(ge=0, le=1_000_000),
            required=True,
            help="data-parallel replica index",
        )
        a.add_argument(
            "--timeout-s",
            type=float_arg(gt=0, le=3600, unit="s"),
            default=10.0,
            help="connection timeout (default 10)",
        )
        if name == "set":
            a.add_argument(
                "--time-s",
                type=float_arg(gt=0, le=86_400, unit="s"),
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
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if (
        not sep
        or not host
        or not port.isdecimal()
        or len(port) > 5
        or any(c.isspace() for c in host)
    ):
        raise ConfigError(
            f"--store {show_value(address)}: not HOST:PORT, e.g. --store 127.0.0.1:29500"
        )
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"--store {show_value(address)}: port {int(port)} is outside 1..65535")
    if not (0 < timeout_s <= 3600):
        raise ConfigError(f"--timeout-s: must be a number > 0 and <= 3600, got {timeout_s!r}")
    _quiet_torch_env()
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
    except ImportError as e:
        raise ConfigError(
            "perseus straggler needs torch; pip install 'perseus-energy[torch]'"
        ) from e
    try:
        with _silenced_stderr_fd():
            return TCPStore(
                host,
                int(port),
                is_master=False,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
    except (RuntimeError, OSError, ValueError, OverflowError) as e:
        reason = str(e).strip().partition("\n")[0][:200] or type(e).__name__
        raise PerseusError(
            f"--store {show_value(address)}: cannot connect to the job's store within "
            f"{timeout_s:g} s ({reason}); check the address and that the job is running"
        ) from None


def _quiet_torch_env() -> None:
    # torch's C++ side logs each failed connection attempt with its stack frames straight to
    # stderr; our one-line error says what failed (the variables are read when torch loads).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    os.environ.setdefault("TORCH_SHOW_CPP_STACKTRACES", "0")


@contextlib.contextmanager
def _silenced_stderr_fd() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null (C++ code writes there directly), then restore it."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def run(args: argparse.Namespace) -> int:
    _quiet_torch_env()
    from perseus.runtime.straggler.switching import clear_hint, hint_key, set_hint

    store = connect_store(args.store, args.timeout_s)
    if args.straggler_action == "set":
        set_hint(store, args.pipeline, args.time_s)
        print(f"{hint_key(args.pipeline)} = {args.time_s:g} s")
    else:
        clear_hint(store, args.pipeline)
        print(f"{hint_key(args.pipeline)} cleared")
    return 0
