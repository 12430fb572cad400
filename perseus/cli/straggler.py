"""``perseus straggler set|clear``: declare a slowed pipeline to a running job, from outside.

The job reads the hint from its TCP store at an iteration boundary (docs/straggler.md). Every
wait is bounded: the store must answer within ``--timeout-s``, then the command waits up to
``--wait-s`` for the job's acknowledgement (exit 0), else says no running job read it (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar, cast

from perseus.cli._args import add_store_command, first_line, float_arg, int_arg
from perseus.errors import ConfigError, PerseusError
from perseus.validate import show_value

__all__ = ["abandoned_calls", "await_ack", "connect_store", "register", "run", "within"]

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    actions = add_store_command(
        sub,
        "straggler",
        "declare or clear a slowed pipeline in a running job",
        {
            "set": "declare pipeline K slowed to T' seconds per iteration",
            "clear": "remove the declaration for pipeline K",
        },
        run,
    )
    for a in actions.values():
        a.add_argument(
            "--pipeline",
            type=int_arg(ge=0, le=1_000_000),
            required=True,
            help="data-parallel replica index",
        )
    actions["set"].add_argument(
        "--time-s",
        type=float_arg(gt=0, le=86_400, unit="s"),
        required=True,
        help="the pipeline's iteration time T' in seconds",
    )


def _parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    bad = any(c.isspace() or not c.isprintable() for c in host)  # a NUL, a tab: no host name
    if not (sep and host and port.isascii() and port.isdecimal() and len(port) <= 5) or bad:
        raise ConfigError(
            f"--store {show_value(address)}: not HOST:PORT, e.g. --store 127.0.0.1:29500"
        )
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"--store {show_value(address)}: port {int(port)} is outside 1..65535")
    try:
        host.encode("idna")  # what the resolver does: an empty or 64-character label fails
    except UnicodeError:
        raise ConfigError(
            f"--store {show_value(address)}: {show_value(host)} is not a host name or address "
            "(a dot-separated name of 1-63 character labels, or an IP address)"
        ) from None
    return host, int(port)


def within(
    timeout_s: float, what: str, address: str, fn: Callable[[], T], shown_s: float | None = None
) -> T:
    """``fn()`` in a daemon thread, abandoned (PerseusError) after ``timeout_s``: store calls
    block in C++ and some ignore their own timeout (a server that accepts and never answers)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, name="perseus-store-client", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        _ABANDONED.append(thread)
        raise PerseusError(
            f"--store {show_value(address)}: no answer within "
            f"{shown_s if shown_s is not None else timeout_s:g} s ({what}); check "
            "that HOST:PORT is the job's store (torchrun's MASTER_ADDR:MASTER_PORT)"
        )
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])


_ABANDONED: list[threading.Thread] = []


def abandoned_calls() -> bool:
    """Whether a store call was given up on and may still be blocked in C++ (then the process
    ends without the interpreter's shutdown)."""
    return any(t.is_alive() for t in _ABANDONED)


def connect_store(address: str, timeout_s: float = 10.0) -> Any:
    """A client of the TCP store at ``HOST:PORT``, connected within ``timeout_s`` (ConfigError
    for a malformed address, PerseusError if nothing answers in time)."""
    host, port = _parse_address(address)
    # torch's C++ side logs each failed connection attempt to stderr (read when torch loads).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    os.environ.setdefault("TORCH_SHOW_CPP_STACKTRACES", "0")
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
    except ImportError as e:
        raise ConfigError(
            "perseus straggler needs torch; pip install 'perseus-energy[torch]'"
        ) from e

    from perseus.device.clock import REAL_CLOCK  # here, not at import: --help loads no numpy

    started = REAL_CLOCK.now()
    _probe(host, port, timeout_s, address)
    left_s = timeout_s - (REAL_CLOCK.now() - started)

    def connect() -> Any:
        # The client's own timeout ends a refused connection's retries before ours, so only a
        # server that accepts and never answers leaves a thread behind.
        timeout = timedelta(seconds=max(0.8 * left_s, 0.001))
        with _silenced_stderr_fd():
            return TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)

    try:
        return within(max(left_s, 0.0), "connecting", address, connect, shown_s=timeout_s)
    except (RuntimeError, OSError, ValueError, OverflowError) as e:
        raise _unreachable(address, timeout_s, first_line(e)[:200]) from None


def _unreachable(address: str, timeout_s: float, reason: str) -> PerseusError:
    return PerseusError(
        f"--store {show_value(address)}: cannot connect to the job's store within "
        f"{timeout_s:g} s ({reason}); check the address and that the job is running"
    )


def _probe(host: str, port: int, timeout_s: float, address: str) -> None:
    """Fail fast, with the reason, when nothing listens at HOST:PORT."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise _unreachable(address, timeout_s, reason) from None


@contextlib.contextmanager
def _silenced_stderr_fd() -> Iterator[None]:
    """Send file descriptor 2 (C++ code writes there directly) to /dev/null, then restore it;
    only from the main thread, so that a client abandoned in another thread cannot keep it."""
    if threading.current_thread() is not threading.main_thread() or _SILENCE.locked():
        yield
        return
    with _SILENCE:
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


_SILENCE = threading.Lock()


def await_ack(
    args: argparse.Namespace,
    what: str,
    read: Callable[[], tuple[str, int | None] | None],
    token: str,
    reader: str,
) -> int:
    """Wait up to ``--wait-s`` for the job to acknowledge ``token`` (``read()``: its last
    acknowledgement and iteration) and print ``what`` and the outcome: 0 when it did, 1 when
    no running job has read it (``reader`` says which jobs read it, and when)."""
    if args.wait_s == 0:
        print(f"{what} (not waiting for the job's acknowledgement: --wait-s 0)")
        return 0
    from perseus.device.clock import REAL_CLOCK

    def wait() -> int | bool | None:  # the job's iteration (None: not said), False: no ack
        deadline = REAL_CLOCK.now() + args.wait_s
        while (ack := read()) is None or ack[0] != token:
            if REAL_CLOCK.now() >= deadline:
                return False
            REAL_CLOCK.sleep(min(0.1, deadline - REAL_CLOCK.now()))
        return ack[1]

    seen = within(args.wait_s + args.timeout_s, "waiting for the acknowledgement", args.store, wait)
    if seen is False:
        print(
            f"{what}; no running job has read it yet (no acknowledgement within "
            f"{args.wait_s:g} s): {reader}"
        )
        return 1
    at = f"at iteration {seen}" if seen is not None else "at its last iteration boundary"
    print(f"{what}; acknowledged by the job {at}")
    return 0


def run(args: argparse.Namespace) -> int:
    from perseus.runtime.straggler import switching as sw

    key = sw.hint_key(args.pipeline)
    store = connect_store(args.store, args.timeout_s)
    if args.straggler_action == "set":
        token = within(
            args.timeout_s,
            "setting the hint",
            args.store,
            lambda: sw.set_hint(store, args.pipeline, args.time_s),
        )
        what = f"delivered: {key} = {args.time_s:g} s"
    else:

        def clear() -> tuple[str, int | None] | None:
            before = sw.read_ack(store, args.pipeline)  # None: the job never acknowledged one
            sw.clear_hint(store, args.pipeline)
            return before

        before = within(args.timeout_s, "clearing the hint", args.store, clear)
        what, token = f"{key} cleared", sw.CLEARED
        if before is None or before[0] == sw.CLEARED:
            print(f"{what} (no running job had a hint for pipeline {args.pipeline} in effect)")
            return 0
    return await_ack(
        args,
        what,
        lambda: sw.read_ack(store, args.pipeline),
        token,
        "a job started with straggler hints reads them on global rank 0 at each iteration boundary",
    )
