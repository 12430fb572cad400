"""Argument types and output-path checks shared by every subcommand.

Each flag value is checked when argparse reads it (finite, in range, strict integer), so a bad
value fails in one line naming the flag before any work starts; output paths are checked
before any work too (:func:`check_output_file`, :func:`check_output_dir`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from perseus.errors import ConfigError
from perseus.validate import show_value

__all__ = [
    "check_output_dir",
    "check_output_file",
    "float_arg",
    "int_arg",
    "nonempty_arg",
]


def float_arg(
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float within the bounds."""
    bounds = " and ".join(
        f"{op} {b:g}{(' ' + unit) if unit else ''}"
        for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le))
        if b is not None
    )
    wanted = f"a finite number{(' ' + bounds) if bounds else ''}"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}") from None
        ok = math.isfinite(value) and not (
            (gt is not None and not value > gt)
            or (ge is not None and not value >= ge)
            or (lt is not None and not value < lt)
            or (le is not None and not value <= le)
        )
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}")
        return value

    parse.__name__ = "number"
    return parse


def int_arg(*, ge: int | None = None, le: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer within ``[ge, le]`` (no ``1e3``, no ``1.0``)."""
    rng = " and ".join(f"{op} {b}" for op, b in ((">=", ge), ("<=", le)) if b is not None)
    wanted = f"an integer{(' ' + rng) if rng else ''}"

    def parse(text: str) -> int:
        s = text.strip()
        body = s[1:] if s[:1] in "+-" else s
        if not body.isdecimal() or len(body) > 30:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}")
        value = int(s)
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {show_value(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def nonempty_arg(text: str) -> str:
    """An argparse ``type``: a non-blank string (a path or a name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value, got ''")
    return text


def _check_parents(path: Path, flag: str) -> None:
    """Refuse a path whose parent chain runs through a regular file or an unwritable folder."""
    parent = path.parent
    for ancestor in [parent, *parent.parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(
                    f"{flag} {path}: {ancestor} is a file, not a directory; choose another path"
                )
            if not os.access(ancestor, os.W_OK | os.X_OK) or not _can_create_in(ancestor):
                raise ConfigError(
                    f"{flag} {path}: directory {ancestor} is not writable; choose another path"
                )
            return


def _can_create_in(directory: Path) -> bool:
    """Whether a file can be created there (permissions alone miss read-only mounts, /sys)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".perseus-probe.", dir=directory)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def check_output_file(path_arg: str | os.PathLike[str], flag: str = "-o") -> Path:
    """Refuse an output file path that cannot be written, before any work starts.

    Raises:
        ConfigError: an empty path, an existing directory, or a path under a regular file.
    """
    if not str(path_arg).strip():
        raise ConfigError(f"{flag}: empty path; pass a file name, e.g. {flag} out.json")
    path = Path(path_arg)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; pass a file path")
    if str(path_arg).endswith(("/", os.sep)):
        raise ConfigError(f"{flag} {path_arg}: ends with a separator; pass a file path")
    _check_parents(path, flag)
    return path


def check_output_dir(
    path_arg: str | os.PathLike[str], known_files: Iterable[str], flag: str = "-o"
) -> Path:
    """Refuse an output directory that cannot be written or would destroy foreign files.

    The directory is replaced as a whole, so an existing one may only hold files a previous
    run of the same command wrote.

    Raises:
        ConfigError: an empty path, a regular file, a path under a regular file, or a
            directory holding other files.
    """
    if not str(path_arg).strip():
        raise ConfigError(f"{flag}: empty path; pass a directory name, e.g. {flag} out")
    path = Path(path_arg)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file; pass a directory path")
    _check_parents(path, flag)
    if path.is_dir():
        known = set(known_files)
        foreign = sorted(p.name for p in path.iterdir() if p.name not in known)
        if foreign:
            raise ConfigError(
                f"{flag} {path}: directory holds files perseus did not write "
                f"({', '.join(show_value(f, 30) for f in foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty directory"
            )
    return path
