"""Bounded reads of input files: the one way perseus reads a file it is given.

perseus runs as root on shared machines, so an input path may name anything: ``/dev/zero``
(endless), a FIFO (blocks for ever), a huge file, a directory. :func:`read_bounded` reads
**regular files only** and at most ``limit_bytes + 1`` bytes whatever ``st_size`` says (it is 0
for devices and FIFOs, and a file may grow while it is read). FIFOs, character and block
devices and sockets are refused *before they are opened*: opening a device can act on it (a
watchdog arms, a tape rewinds), and opening a FIFO waits for a writer. On Linux the path is
first opened with ``O_PATH`` (which never calls a driver), checked, and then re-opened through
that descriptor, so a file swapped in between cannot be a device.

Each format has its own cap, sized to what real files need (see :data:`INPUT_LIMITS`); the
benchmark ``benchmarks/input_limits.py`` measures the peak memory of the worst input each cap
accepts.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from perseus.errors import ConfigError

__all__ = [
    "INPUT_LIMITS",
    "MB",
    "check_regular_input",
    "describe_file_type",
    "read_bounded",
]

MB = 1024 * 1024

#: Largest file read per kind of input, in bytes, and why (shown in the refusal).
INPUT_LIMITS: dict[str, int] = {
    # A 128-stage profile at all 81 A100 clocks is 0.8 MB; 128 stages x 8 ranks ~7 MB.
    "profile": 16 * MB,
    # A 32-stage x 512-microbatch frontier of 100 points is ~20 MB.
    "frontier": 64 * MB,
    # A job config is a dozen keys.
    "config": 1 * MB,
    # A run's summary holds a few figures (plus whatever a runner adds).
    "summary": 16 * MB,
    # Zeus's NSDI'23 traces are 0.2 MB for six jobs.
    "trace": 16 * MB,
    # Job definitions: one row per recurring job.
    "jobs": 1 * MB,
    # A price/carbon signal: a year of per-minute rows is ~16 MB.
    "signal": 16 * MB,
    # A plan schedule: one record per signal interval.
    "schedule": 64 * MB,
}

_CHUNK = 1 << 20


def describe_file_type(mode: int) -> str:
    """``"a FIFO (named pipe)"``, ``"a character device"``, ... for an ``st_mode``."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _refuse_kind(p: Path, mode: int, what: str, error: type[ConfigError]) -> ConfigError:
    kind = describe_file_type(mode)
    if stat.S_ISDIR(mode):
        return error(f"{p}: is a directory; pass {what}")
    return error(
        f"{p}: is {kind}, not a regular file; perseus reads inputs only from regular files "
        f"(copy the data to a file first); pass {what}"
    )


def check_regular_input(
    path: str | os.PathLike[str], what: str, error: type[ConfigError] = ConfigError
) -> Path:
    """Refuse, without opening it, a path that is not an existing regular file.

    For inputs that another library opens itself (SQLite); :func:`read_bounded` does the same
    check and more for files perseus reads.

    Raises:
        error: the file is missing, unreadable, or a directory, FIFO, device or socket.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{p}: file not found; pass {what}") from None
    except OSError as e:
        raise error(f"{p}: cannot read file ({e.strerror}); pass {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refuse_kind(p, st.st_mode, what, error)
    return p


def _open_regular(p: Path, what: str, error: type[ConfigError]) -> tuple[int, int]:
    """A read-only descriptor of the regular file ``p`` and its size; never opens anything
    else."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    o_path = getattr(os, "O_PATH", 0)
    if o_path and os.path.isdir("/proc/self/fd"):
        handle = os.open(p, o_path | os.O_CLOEXEC)
        try:
            st = os.fstat(handle)
            if not stat.S_ISREG(st.st_mode):
                raise _refuse_kind(p, st.st_mode, what, error)
            # Re-open the very inode the O_PATH handle holds (no second path lookup).
            fd = os.open(f"/proc/self/fd/{handle}", flags)
        finally:
            os.close(handle)
    else:  # pragma: no cover - non-Linux: stat, open, and check it is still the same file
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_kind(p, st.st_mode, what, error)
        fd = os.open(p, flags)
    try:
        st2 = os.fstat(fd)
        if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            raise error(f"{p}: changed while it was opened; pass {what}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st2.st_size


def read_bounded(
    path: str | os.PathLike[str],
    *,
    limit_bytes: int,
    what: str,
    error: type[ConfigError] = ConfigError,
    name: str = "file",
) -> bytes:
    """The bytes of the regular file ``path``, refusing one larger than ``limit_bytes``.

    Reads at most ``limit_bytes + 1`` bytes, whatever the file's size says, and never opens a
    FIFO, device or socket (see the module docstring).

    Args:
        path: The file.
        limit_bytes: The largest size accepted.
        what: What the file should be, for messages (``"a profile CSV/JSON path"``).
        error: The :class:`~perseus.errors.ConfigError` subclass to raise.
        name: What to call the file when it is missing (``"config file"``).

    Returns:
        The file's content.

    Raises:
        error: one line naming the file: missing, unreadable, a directory, not a regular
            file, or too large.
    """
    p = Path(path)
    try:
        fd, size = _open_regular(p, what, error)
    except FileNotFoundError:
        raise error(f"{p}: {name} not found; pass {what}") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory; pass {what}") from None
    except OSError as e:
        raise error(f"{p}: cannot read file ({e.strerror}); pass {what}") from None
    want = limit_bytes + 1
    try:
        # One read is the whole file in practice: ask for its size (+1 to see EOF) at most.
        first = os.read(fd, min(want, size + 1 if size > 0 else _CHUNK))
        parts = [first]
        total = len(first)
        while first and total < want:
            first = os.read(fd, min(_CHUNK, want - total))
            parts.append(first)
            total += len(first)
    except OSError as e:
        raise error(f"{p}: cannot read file ({e.strerror}); pass {what}") from None
    finally:
        os.close(fd)
    if total > limit_bytes:
        raise error(
            f"{p}: larger than {_size(limit_bytes)}, the most perseus reads as {what}; "
            "check that this is the right file"
        )
    parts = [part for part in parts if part]
    # The usual case is one part: return it as is rather than copy it.
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _size(n: int) -> str:
    return f"{n // MB} MB" if n >= MB else f"{n} bytes"
