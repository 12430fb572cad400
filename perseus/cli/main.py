"""The ``perseus`` command: ``main(argv) -> int`` and the one place errors become exit codes.

Exit codes: 0 success; 2 bad input (:class:`~perseus.errors.ConfigError`, bad arguments, a path
that cannot be read or written); 1 any other error; 130 on Ctrl-C; 141 when stdout's reader
goes away. An error is one line on stderr, its backquoted library parameters (`` `stages` ``)
rewritten as the command's flags (``--stages``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Sequence

from perseus import __version__
from perseus.cli._args import first_line
from perseus.errors import ConfigError, PerseusError
from perseus.log import LOG_LEVELS, configure_logging, get_logger, rank_from_env
from perseus.validate import clip_message

logger = get_logger(__name__)

__all__ = ["COMMANDS", "EXTRAS", "PARAMETER_FLAGS", "build_parser", "entry", "main"]

#: Library parameter names whose flag is named otherwise (used where the command has the flag).
PARAMETER_FLAGS: dict[str, str] = {
    "path": "--db",
    "pipeline_index": "--pipeline",
    "state_dir": "--sim-dir",
    "trace_dir": "--trace",
}

#: Optional packages -> the extra that installs them (pyproject's optional-dependencies).
EXTRAS: dict[str, str] = {"matplotlib": "plot", "tqdm": "progress"}

#: The subcommand modules (each with ``register(subparsers)``), in `perseus --help` order.
COMMANDS = (
    "demo",
    "frontier",
    "plan",
    "evaluate",
    "report",
    "export",
    "straggler_sweep",
    "straggler",
    "power",
    "profile",
    "device",
    "recurring",
    "fleet",
    "doctor",
)

_PARAMETER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a newline or escape in a path, shown as \n


class _ArgumentError(Exception):
    """argparse asked to exit with a usage error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = _Parser(
        prog="perseus", description="Remove wasted GPU energy from pipeline-parallel training."
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"perseus.cli.{name}").register(sub)
    _add_logging_flags(parser)
    return parser


def _add_logging_flags(parser: argparse.ArgumentParser) -> None:
    """``-v`` and ``--log-level`` on ``parser`` and every subcommand below it."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="say what is happening (-v: INFO, -vv: DEBUG); quiet by default",
    )
    group.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="log level of the perseus logger on stderr (default WARNING)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_logging_flags(child)


def _log_level(args: argparse.Namespace) -> str:
    if getattr(args, "log_level", None):
        return str(args.log_level)
    verbose = int(getattr(args, "verbose", 0) or 0)
    return "DEBUG" if verbose >= 2 else "INFO" if verbose == 1 else "WARNING"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (tests call this)."""
    try:
        parser = build_parser()  # imports every command module: a tenth of a second
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        if not argv:
            print(parser.format_help(), end="")
            _flush_stdout()
            return 0
        args = parser.parse_args(argv)
        configure_logging(_log_level(args), rank=rank_from_env())
        code = int(args.handler(args))
        _flush_stdout()
        return code
    except _ArgumentError as e:
        _print_error(str(e))
        return 2
    except PerseusError as e:
        _print_error(as_flags(e.message or type(e).__name__, parser, args))
        if e.detail:
            logger.info("details:\n%s", e.detail)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the last guard: never a traceback on the user's terminal
        return _environment_error(e, args)


def _environment_error(error: Exception, args: argparse.Namespace | None) -> int:
    """An error from the machine (pipe, paths, a missing extra, memory), else an internal one."""
    if isinstance(error, BrokenPipeError):
        # The reader went away (e.g. `perseus ... | head`): stop quietly, as Unix tools do.
        _drop_stdout()
        return 141
    code, name = 1, type(error).__name__
    package = (error.name or "").partition(".")[0] if isinstance(error, ModuleNotFoundError) else ""
    if isinstance(error, OSError) and error.filename is not None:
        # a path that cannot be read or written (permissions, a read-only or full disk)
        message, code = f"{error.filename}: {error.strerror}; choose another path", 2
    elif isinstance(error, OSError):
        message = f"{error.strerror or error}; nothing was written"
    elif package in EXTRAS:
        message = (
            f"{package} is not installed; `perseus {args.command if args else ''}` needs it: "
            f"pip install 'perseus-energy[{EXTRAS[package]}]'"
        )
    elif isinstance(error, (MemoryError, RecursionError)):
        message = f"out of memory or recursion depth ({name}); plan a smaller job"
    else:
        logger.debug("unexpected error", exc_info=True)
        message = (
            f"internal error ({name}: {first_line(error)}); please report it "
            "(--log-level DEBUG shows the traceback)"
        )
    _print_error(message)
    return code


def as_flags(message: str, parser: argparse.ArgumentParser, args: argparse.Namespace | None) -> str:
    """``message`` with each `` `parameter` `` turned into the flag of the command that ran
    (`` `stages`=8`` -> ``--stages=8``); a parameter without a flag loses its backquotes."""
    flags = _command_flags(parser, args)
    known = set(flags.values())

    def flag(match: re.Match[str]) -> str:
        name = match.group(1)
        alias = PARAMETER_FLAGS.get(name)
        return flags.get(name) or (alias if alias in known else None) or name

    return _PARAMETER.sub(flag, message)


def _command_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace | None
) -> dict[str, str]:
    """Destination -> long flag of every option of the parsers ``args`` went through."""
    flags: dict[str, str] = {}
    current: argparse.ArgumentParser | None = parser
    while current is not None:
        chosen = None
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(args, action.dest, None) if args is not None else None
                chosen = action.choices.get(name) if isinstance(name, str) else None
                continue
            longs = [o for o in action.option_strings if o.startswith("--")]
            if longs:
                flags.setdefault(action.dest, longs[0])
        current = chosen
    return flags


def _flush_stdout() -> None:
    """Write out what the command printed while its errors can still be reported: stdout is
    block-buffered when it is a pipe or a file, and a flush that fails at the interpreter's
    exit (the reader went away, a full disk) prints "Exception ignored" and exits 120."""
    try:
        sys.stdout.flush()
    except OSError:
        _drop_stdout()  # what is left cannot be written; the exit's flush must not retry it
        raise


def _drop_stdout() -> None:
    """Send the rest of stdout (and Python's buffer of it) to /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _print_error(message: str) -> None:
    shown = _CONTROL.sub(lambda m: repr(m.group())[1:-1], message.strip())
    print(f"error: {clip_message(shown)}", file=sys.stderr)


def entry() -> None:
    """Console-script entry point."""
    try:
        code = main()
    except SystemExit as e:  # argparse printed --help or --version, then exited
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        try:
            _flush_stdout()
        except Exception as error:
            code = _environment_error(error, None)
    from perseus.cli.straggler import abandoned_calls

    if abandoned_calls():
        # A store call still blocked in C++ would abort the interpreter's shutdown: end now.
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
