"""The ``perseus`` command: ``main(argv) -> int`` and the one place errors become exit codes.

Exit codes: 0 success; 2 bad input (:class:`~perseus.errors.ConfigError`, bad arguments);
1 any other :class:`~perseus.errors.PerseusError`; 130 on Ctrl-C. Errors are printed as one
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from perseus import __version__
from perseus.cli import _commands
from perseus.errors import ConfigError, PerseusError

__all__ = ["build_parser", "entry", "main"]


class _ArgumentError(Exception):
    """argparse asked to exit with a usage error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = _Parser(
        prog="perseus",
        description="Remove wasted GPU energy from pipeline-parallel training.",
    )
    parser.add_argument("--version", action="version", version=f"perseus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in _commands.REGISTRY:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (tests call this)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        result: int = args.handler(args)
        return result
    except _ArgumentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except PerseusError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `perseus ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _one_line(error: Exception) -> str:
    """The first line of an error; schedule grids follow on later lines only when useful."""
    text = str(error)
    first, _, rest = text.partition("\n")
    return first if not rest else f"{first}\n{rest}"


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
