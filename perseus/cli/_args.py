"""Argument types (checked as argparse reads them) and output-path checks (before any work
starts) shared by every subcommand: a bad value fails in one line naming the flag."""

from __future__ import annotations

import argparse
import contextlib
import math
import operator
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from perseus.errors import ConfigError
from perseus.validate import show_value

__all__ = [
    "add_command",
    "add_output_arg",
    "add_path_arg",
    "add_store_command",
    "check_output_dir",
    "check_output_file",
    "check_output_folder",
    "first_line",
    "float_arg",
    "int_arg",
    "message_stream",
    "nonempty_arg",
]

T = TypeVar("T")


def float_arg(
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float within the bounds, in ASCII digits (``٣``, which
    ``float`` reads as 3, is refused)."""
    tests = (
        (">", operator.gt, gt),
        (">=", operator.ge, ge),
        ("<", operator.lt, lt),
        ("<=", operator.le, le),
    )
    bounds = [(sym, test, b) for sym, test, b in tests if b is not None]
    shown = " and ".join(f"{sym} {b:g}{(' ' + unit) if unit else ''}" for sym, _, b in bounds)
    wanted = f"a finite number{(' ' + shown) if shown else ''}"

    def parse(text: str) -> float:
        try:
            value = float(text.strip()) if text.isascii() else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not all(test(value, b) for _, test, b in bounds):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}")
        return value

    parse.__name__ = "number"
    return parse


def int_arg(*, ge: int | None = None, le: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer within ``[ge, le]`` (no ``1e3``, no ``1.0``, no
    ``٣``)."""
    rng = " and ".join(f"{op} {b}" for op, b in ((">=", ge), ("<=", le)) if b is not None)
    wanted = f"an integer{(' ' + rng) if rng else ''}"

    def parse(text: str) -> int:
        s = text.strip()
        body = s[1:] if s[:1] in "+-" else s
        value = int(s) if body.isascii() and body.isdecimal() and len(body) <= 30 else None
        if value is None or (ge is not None and value < ge) or (le is not None and value > le):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def first_line(error: BaseException) -> str:
    """An error in one line: its message's first line (schedule grids and C++ frames are
    dropped), else its type's name."""
    return str(error).strip().partition("\n")[0] or type(error).__name__


def nonempty_arg(text: str) -> str:
    """An argparse ``type``: a non-blank string (a path or a name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a non-empty value, got {show_value(text)}")
    return text


def _check_parents(path: Path, flag: str) -> None:
    """Refuse a path whose parent chain runs through a regular file or an unwritable folder."""
    for ancestor in [path.parent, *path.parent.parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(
                    f"{flag} {path}: {ancestor} is a file, not a directory; choose another path"
                )
            if why := _unwritable(ancestor):
                raise ConfigError(f"{flag} {path}: directory {ancestor} {why}; choose another path")
            return


def _unwritable(directory: Path) -> str:
    """Why no file can be created there ("": one can; permissions alone miss read-only mounts,
    /sys, a disk out of space or inodes)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return "is not writable"
    try:
        fd, probe = tempfile.mkstemp(prefix=".perseus-probe.", dir=directory)
    except OSError as e:
        from perseus.io._errors import describe_os_error

        return f"is not writable ({describe_os_error(e)})"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return ""


def _flagged(flag: str, check: Callable[[], T]) -> T:
    """``check()``, its :class:`ConfigError` prefixed with ``flag``."""
    try:
        return check()
    except ConfigError as e:
        raise ConfigError(f"{flag} {e}") from None


def _not_empty(path_arg: str | os.PathLike[str], flag: str, example: str) -> None:
    if not str(path_arg).strip():
        raise ConfigError(f"{flag}: empty path; pass a {example}")


def check_output_file(
    path_arg: str | os.PathLike[str], flag: str = "-o", inputs: dict[str, Any] | None = None
) -> Path:
    """Refuse an output file path that cannot or must not be written (the rule is
    :func:`perseus.io.atomic.check_output_path`'s), or that is one of the command's
    ``inputs`` (name in messages -> path, list of paths or None): ConfigError
    ``"<flag> <path>: ..."``."""
    _not_empty(path_arg, flag, f"file name, e.g. {flag} out.json")
    if str(path_arg).endswith(("/", os.sep)):
        raise ConfigError(f"{flag} {path_arg}: ends with a separator; pass a file path")
    from perseus.io.atomic import check_output_path

    target = _flagged(flag, lambda: check_output_path(path_arg))
    if target.kind == "file":
        _check_parents(target.entry, flag)
        _check_not_input(path_arg, flag, inputs or {})
    return Path(path_arg)


def _check_not_input(path_arg: str | os.PathLike[str], flag: str, inputs: dict[str, Any]) -> None:
    """Refuse an output that is an existing input file (a link or hard link included)."""
    try:
        out = os.stat(path_arg)
    except OSError:
        return  # not there yet: it is no input
    for name, given in inputs.items():
        for item in given if isinstance(given, (list, tuple)) else [given]:
            try:
                same = item is not None and os.path.samestat(out, os.stat(item))
            except (OSError, ValueError):  # missing, a bundled name, a NUL byte
                same = False
            if same:
                raise ConfigError(
                    f"{flag} {path_arg}: the same file as the input {name} {item}; "
                    "write the output to another path"
                )


def check_output_dir(path_arg: str | os.PathLike[str], known_files: Iterable[str]) -> Path:
    """Refuse an ``-o`` directory that cannot be written, or holds files other than
    ``known_files`` (it is replaced as a whole): ConfigError ``"-o <path>: ..."``."""
    _not_empty(path_arg, "-o", "directory name, e.g. -o out")
    from perseus.io.atomic import check_output_directory

    path = _flagged("-o", lambda: check_output_directory(path_arg))
    _check_parents(path, "-o")
    if path.is_dir():
        known = set(known_files)
        foreign = sorted(p.name for p in path.iterdir() if p.name not in known)
        if foreign:
            raise ConfigError(
                f"-o {path}: directory holds files perseus did not write "
                f"({', '.join(show_value(f, 30) for f in foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty directory"
            )
    return path


def check_output_folder(path_arg: str | os.PathLike[str], flag: str) -> Path:
    """Refuse a directory that perseus adds files to (``--plot DIR``): a non-directory, a
    symbolic link, or one under a file or unwritable (ConfigError ``"<flag> <path>: ..."``)."""
    _not_empty(path_arg, flag, f"directory name, e.g. {flag} plots")
    from perseus.io.atomic import check_plain_directory, lstat_or_none

    path = Path(path_arg)
    st = lstat_or_none(path, f"{flag} ")
    if st is None:
        _check_parents(path, flag)
        return path
    check_plain_directory(path, st.st_mode, f"{flag} ")
    if why := _unwritable(path):
        raise ConfigError(f"{flag} {path}: directory {why}; choose another path")
    return path


def message_stream(out: str | os.PathLike[str]) -> TextIO:
    """Where a command prints its summary: stderr when its output goes to stdout."""
    from perseus.io.atomic import writes_to_stdout

    return sys.stderr if writes_to_stdout(out) else sys.stdout


def add_command(
    sub: argparse._SubParsersAction[Any],
    name: str,
    handler: Callable[[argparse.Namespace], int],
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """``perseus NAME`` (or an action under a command): its parser, run by ``handler``."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    parser.set_defaults(handler=handler)
    return parser


def add_path_arg(
    parser: argparse.ArgumentParser, name: str, metavar: str, help: str, **kwargs: Any
) -> None:
    """An input path (or bundled name), flag or positional; a blank value is refused."""
    parser.add_argument(name, metavar=metavar, type=nonempty_arg, help=help, **kwargs)


def add_output_arg(
    parser: argparse.ArgumentParser, metavar: str, help: str, default: str | None = None
) -> None:
    """``-o/--out/--output``: required unless ``default`` is given."""
    parser.add_argument(
        "-o",
        "--out",
        "--output",
        dest="out",
        required=default is None,
        default=default,
        metavar=metavar,
        help=help,
    )


def add_store_command(
    sub: argparse._SubParsersAction[Any],
    name: str,
    help_text: str,
    actions: dict[str, str],
    handler: Callable[[argparse.Namespace], int],
) -> dict[str, argparse.ArgumentParser]:
    """``perseus NAME ACTION --store HOST:PORT ...``: a command that reaches a running job's
    TCP store; returns each action's parser (``dest``: ``<name>_action``)."""
    sub_actions = add_command(sub, name, handler, help_text).add_subparsers(
        dest=f"{name}_action", metavar="ACTION", required=True
    )
    parsers = {}
    for action, text in actions.items():
        parser = parsers[action] = sub_actions.add_parser(action, help=text)
        parser.add_argument(
            "--store",
            required=True,
            metavar="HOST:PORT",
            help="the job's TCP store (torchrun's MASTER_ADDR:MASTER_PORT)",
        )
        parser.add_argument(
            "--timeout-s",
            type=float_arg(gt=0, le=3600, unit="s"),
            default=10.0,
            help="how long the store may take to answer (default 10)",
        )
        parser.add_argument(
            "--wait-s",
            type=float_arg(ge=0, le=3600, unit="s"),
            default=10.0,
            help="how long to wait for the running job's acknowledgement (default 10; 0: do not wait)",
        )
    return parsers
