"""Bounded reads of input files: the one way perseus reads a file it is given.

perseus runs as root on shared machines, so an input path may name anything (``/dev/zero``, a
FIFO, a huge file, a directory). :func:`read_bounded` reads regular files only, at most
``limit_bytes + 1`` bytes whatever ``st_size`` says, and refuses FIFOs, devices and sockets
before opening them: on Linux the path is opened with ``O_PATH`` (which never calls a driver),
checked, and re-opened through that descriptor, so a file swapped in between cannot be a device.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from perseus.errors import ConfigError
from perseus.validate import show_value

__all__ = ["INPUT_LIMITS", "MB", "decode_text", "describe_file_type", "read_bounded"]

MB = 1024 * 1024

#: Largest file read per kind of input, in bytes (``benchmarks/input_limits.py`` measures the
#: memory of the largest accepted ones). A 128-stage x 8-rank profile is ~7 MB, a 32x512
#: frontier of 100 points ~20 MB, a year of per-minute signal rows ~16 MB; a job config or a
#: job list is a dozen keys or rows.
INPUT_LIMITS: dict[str, int] = {
    "profile": 16 * MB,
    "frontier": 64 * MB,
    "config": 1 * MB,
    "summary": 16 * MB,
    "trace": 16 * MB,
    "jobs": 1 * MB,
    "signal": 16 * MB,
    "schedule": 64 * MB,
}

_CHUNK = 1 << 20


_FILE_TYPES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISREG, "a regular file"),
)


def describe_file_type(mode: int) -> str:
    """``"a FIFO (named pipe)"``, ``"a character device"``, ... for an ``st_mode``."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


def _open_regular(p: Path, what: str, error: type[ConfigError]) -> tuple[int, int]:
    """A read-only descriptor of the regular file ``p`` and its size."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    o_path = getattr(os, "O_PATH", 0)
    # Linux: check the inode an O_PATH handle holds, then re-open that very inode (no second
    # path lookup); elsewhere stat, open, and check below that it is still the same file.
    handle = os.open(p, o_path | os.O_CLOEXEC) if o_path and os.path.isdir("/proc/self/fd") else -1
    try:
        st = os.fstat(handle) if handle >= 0 else os.stat(p)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{p}: is a directory; pass {what}")
        if not stat.S_ISREG(st.st_mode):
            raise error(
                f"{p}: is {describe_file_type(st.st_mode)}, not a regular file; perseus reads "
                f"inputs only from regular files (copy the data to a file first); pass {what}"
            )
        fd = os.open(f"/proc/self/fd/{handle}" if handle >= 0 else p, flags)
    finally:
        if handle >= 0:
            os.close(handle)
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
    Messages say what the file should be (``what``: ``"a profile CSV/JSON path"``) and what
    to call it when missing (``name``: ``"config file"``).

    Raises:
        error: one line naming the file: missing, unreadable, not a regular file, or too large.
    """
    p = Path(path)
    if "\0" in str(p):  # os.open would raise ValueError
        raise error(f"{show_value(str(p), 200)}: a path cannot hold a NUL byte; pass {what}")
    try:
        fd, size = _open_regular(p, what, error)
    except FileNotFoundError:
        raise error(f"{p}: {name} not found; pass {what}") from None
    except OSError as e:
        raise error(f"{p}: cannot read file ({e.strerror}); pass {what}") from None
    want = limit_bytes + 1
    try:
        # One read is the whole file in practice: ask for its size (+1 to see EOF) at most.
        parts = [os.read(fd, min(want, size + 1 if size > 0 else _CHUNK))]
        total = len(parts[0])
        while parts[-1] and total < want:
            parts.append(os.read(fd, min(_CHUNK, want - total)))
            total += len(parts[-1])
    except OSError as e:
        raise error(f"{p}: cannot read file ({e.strerror}); pass {what}") from None
    finally:
        os.close(fd)
    if total > limit_bytes:
        cap = f"{limit_bytes // MB} MB" if limit_bytes >= MB else f"{limit_bytes} bytes"
        raise error(
            f"{p}: larger than {cap}, the most perseus reads as {what}; "
            "check that this is the right file"
        )
    parts = [part for part in parts if part]
    # The usual case is one part: return it as is rather than copy it.
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decode_text(
    p: Path, data: bytes, what: str, error: type[ConfigError], encoding: str = "utf-8"
) -> str:
    """``data`` decoded; ``"<p>:<line>: not valid UTF-8 text; pass <what>"`` if it is not."""
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{p}:{line}: not valid UTF-8 text; pass {what}") from None
