"""Directories nobody else controls, and files in them opened without following links.

perseus runs as root on machines other users share, and keeps two kinds of files outside its
``-o`` outputs: real GPUs' ownership locks and simulated GPUs' state. Both live in a directory
that this module creates or verifies the way ``ssh`` verifies ``~/.ssh``:

* the directory itself is a real directory (``lstat``: a symbolic link is refused), owned by
  this user or root, and not writable by group or others, unless it is sticky and ours;
* every directory above it is owned by this user or root and not writable by group or others
  unless sticky (``/tmp`` passes: root's and sticky), so nobody can swap it for theirs;
* missing directories are created with mode 0700.

Files in it are opened with ``O_NOFOLLOW`` (``O_CREAT | O_EXCL`` when new) and checked after the
open (``fstat``) to be a regular file of ours with one link, so a link or a hard link planted
under a lock's name never makes root write somewhere else.

Default places (:func:`runtime_dir`): as root ``/run/perseus``; as a user
``$XDG_RUNTIME_DIR/perseus`` when that runtime directory is the user's own, else
``<tmp>/perseus-<uid>``. Locks go in ``locks/`` (``$PERSEUS_LOCK_DIR`` overrides), simulated
GPUs in ``sim/`` (``$PERSEUS_SIM_DIR``); overrides are verified the same way.

This module uses the standard library only: the watchdog process and the simulated GPU's state
module load it by file path (see :mod:`perseus.device.ownership`). Refusals raise
:class:`~perseus.errors.ConfigError` (one line: the path, its owner and mode, the fix), or
``PermissionError`` where perseus itself cannot be imported.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import stat
import tempfile
from pathlib import Path

__all__ = [
    "LOCK_DIR_ENV",
    "SIM_DIR_ENV",
    "check_private_file",
    "lock_dir",
    "open_private",
    "read_private",
    "replace_private",
    "runtime_dir",
    "sim_dir",
    "verify_private_dir",
]

LOCK_DIR_ENV = "PERSEUS_LOCK_DIR"
SIM_DIR_ENV = "PERSEUS_SIM_DIR"

_ROOT_BASE = Path("/run/perseus")


def _error(message: str) -> Exception:
    try:
        from perseus.errors import ConfigError
    except ImportError:  # loaded by path without perseus on sys.path (a bare watchdog)
        return PermissionError(message)
    return ConfigError(message)


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _describe(st: os.stat_result) -> str:
    return f"owner {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"


def _private_group(st: os.stat_result) -> bool:
    """Whether the group of ``st`` is its owner's own (a user private group: same name as
    the owner, its primary group, no other member and nobody else's primary group), as on
    systems with umask 002 where a user's directories are group-writable. Never root's
    group (gid 0)."""
    if st.st_gid == 0:
        return False
    try:
        owner = pwd.getpwuid(st.st_uid)
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    if not (
        group.gr_gid == owner.pw_gid
        and group.gr_name == owner.pw_name
        and set(group.gr_mem) <= {owner.pw_name}
    ):
        return False
    return all(u.pw_uid == owner.pw_uid for u in pwd.getpwall() if u.pw_gid == group.gr_gid)


def _why_untrusted(st: os.stat_result, *, final: bool) -> str | None:
    """Why a directory with status ``st`` (from ``lstat``) is not one we may keep files in."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return "belongs to another user"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o002 or (mode & 0o020 and not _private_group(st)):
        if not mode & stat.S_ISVTX:
            return "is writable by group or others"
        if final and st.st_uid != me:
            return "is writable by others (sticky, but not ours)"
    return None


def _refuse(path: Path, st: os.stat_result, why: str, what: str, env: str | None) -> Exception:
    where = f"point ${env} at" if env else "use"
    return _error(
        f"{what} {path} {why} ({_describe(st)}); perseus keeps its files only in a directory "
        f"nobody else controls: remove it or {where} a directory of yours with mode 0700 "
        "(mkdir -m 700 DIR)"
    )


def verify_private_dir(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    what: str = "directory",
    env: str | None = None,
) -> Path:
    """Create or verify directory ``path`` (and every directory above it); return its path.

    Args:
        path: The directory.
        create: Create it (and missing parents) with mode 0700 when missing; otherwise a
            missing directory raises ``FileNotFoundError``.
        what: What it is, for the message ("lock directory").
        env: The environment variable that overrides it, named in the fix.

    Raises:
        ConfigError: a link, not a directory, another user's, or writable by others.
        FileNotFoundError: missing and ``create`` is False.
    """
    target = Path(os.path.abspath(path))
    _check_links_on_the_way(target, what, env)
    # Links above the directory are resolved (``/var/run -> /run``): each real directory on
    # the way must then be one that nobody else can rename or replace entries in.
    parent = Path(os.path.realpath(target.parent))
    chain = [*reversed(parent.parents), parent, parent / target.name]
    for i, directory in enumerate(chain):
        final = i == len(chain) - 1
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
            st = os.lstat(directory)
        why = _why_untrusted(st, final=final)
        if why is not None:
            return_what = what if final else f"{what} {target}: its parent"
            raise _refuse(directory, st, why, return_what, env)
    return chain[-1]


def _check_links_on_the_way(target: Path, what: str, env: str | None) -> None:
    """Refuse a symbolic link on the way to ``target`` that someone else could repoint
    between our check and our open: a link owned by another user, or one in a directory that
    others can write (and that is not sticky). ``/var/run -> /run`` (root's, in root's
    ``/var``) passes."""
    for prefix in [*reversed(target.parents), target][1:]:
        try:
            st = os.lstat(prefix)
        except FileNotFoundError:
            return  # created below, as real directories
        except OSError:
            return  # the chain walk reports it
        if not stat.S_ISLNK(st.st_mode):
            continue
        why = None
        if st.st_uid not in (os.geteuid(), 0):
            why = f"is a symbolic link owned by {_owner(st.st_uid)}"
        else:
            holder = Path(os.path.realpath(prefix.parent))
            try:
                holder_why = _why_untrusted(os.lstat(holder), final=False)
            except OSError:
                holder_why = None
            if holder_why is not None:
                why = f"is a symbolic link in {holder}, which {holder_why}"
        if why is not None:
            raise _error(
                f"{what} {target}: {prefix} on the way {why}; another user could point it "
                "elsewhere between perseus's check and its open: "
                f"{'point $' + env + ' at' if env else 'use'} the real path "
                f"({os.path.realpath(target)}) or a directory of yours with mode 0700"
            )


def _xdg_runtime_dir() -> Path | None:
    value = os.environ.get("XDG_RUNTIME_DIR")
    if not value or not os.path.isabs(value):
        return None
    try:
        st = os.lstat(value)
    except OSError:
        return None
    ours = st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
    return Path(value) if stat.S_ISDIR(st.st_mode) and ours else None


def runtime_dir() -> Path:
    """Where perseus keeps its locks and simulated state by default (not created here).

    Root: ``/run/perseus`` (when ``/run`` exists). A user: ``$XDG_RUNTIME_DIR/perseus`` when
    that directory is theirs (mode 0700), else ``<tmp>/perseus-<uid>``.
    """
    if os.geteuid() == 0 and os.path.isdir(_ROOT_BASE.parent):
        return _ROOT_BASE
    xdg = _xdg_runtime_dir()
    if xdg is not None:
        return xdg / "perseus"
    return Path(tempfile.gettempdir()) / f"perseus-{os.geteuid()}"


def lock_dir(*, create: bool = True) -> Path:
    """Real GPUs' ownership lock directory: ``$PERSEUS_LOCK_DIR`` or ``<runtime_dir>/locks``,
    verified (and created) by :func:`verify_private_dir`."""
    env = os.environ.get(LOCK_DIR_ENV)
    path = Path(env) if env else runtime_dir() / "locks"
    return verify_private_dir(path, create=create, what="lock directory", env=LOCK_DIR_ENV)


def sim_dir(*, create: bool = True) -> Path:
    """Simulated GPUs' state directory: ``$PERSEUS_SIM_DIR`` or ``<runtime_dir>/sim``,
    verified (and created) by :func:`verify_private_dir`."""
    env = os.environ.get(SIM_DIR_ENV)
    path = Path(env) if env else runtime_dir() / "sim"
    return verify_private_dir(path, create=create, what="simulated GPU directory", env=SIM_DIR_ENV)


def _refuse_file(path: Path, why: str) -> Exception:
    rm = "rm -r" if why == "is a directory" else "rm"
    return _error(
        f"{path} {why}; perseus opens its lock and state files only when they are its own "
        f"regular files: remove it ({rm} {path}) and check who put it there"
    )


def open_private(
    path: str | os.PathLike[str], flags: int, *, mode: int = 0o600, create: bool = True
) -> int:
    """Open ``path`` without following links; the descriptor is of a regular file of ours.

    ``flags`` is ``os.O_RDONLY``/``O_RDWR``/``O_WRONLY`` (plus e.g. ``O_APPEND``); a new file
    is created with ``O_CREAT | O_EXCL`` and ``mode`` when ``create``. The open never blocks
    (a FIFO planted under the name is refused, not waited on).

    Raises:
        ConfigError: a link, not a regular file, another user's file, or a file with other
            names (hard links).
        FileNotFoundError: missing and ``create`` is False.
    """
    p = Path(path)
    base = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    for _ in range(16):  # a file removed between our two opens: try again
        fd = _open_once(p, base, create, mode)
        if fd is not None:
            break
    else:
        raise FileNotFoundError(errno.ENOENT, "created and removed repeatedly", str(p))
    try:
        why = _file_problem(os.fstat(fd))
        if why is not None:
            raise _refuse_file(p, why)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: What an ``open`` error says about the entry under the name.
_OPEN_REFUSALS = {
    errno.ELOOP: "is a symbolic link",
    errno.ENXIO: "is not a regular file",  # a FIFO with no reader (write-only open)
    errno.EISDIR: "is a directory",  # a directory planted under the name (write open)
}


def _open_once(p: Path, base: int, create: bool, mode: int) -> int | None:
    """Create ``p`` (when ``create``) or open the existing file: its descriptor, or None when
    it was removed between the two opens."""
    try:
        if create:
            try:
                return os.open(p, base | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                pass
        try:
            return os.open(p, base)
        except FileNotFoundError:
            if not create:
                raise
            return None
    except OSError as e:
        why = _OPEN_REFUSALS.get(e.errno or 0)
        if why is None:
            raise
        raise _refuse_file(p, why) from None


def _file_problem(st: os.stat_result) -> str | None:
    """Why a file with status ``st`` is not one of ours to open, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to {_owner(st.st_uid)}, not to this user"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} names (hard links)"
    return None


def replace_private(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace(src, dst)`` (a link at ``dst`` is replaced, never followed); a directory
    planted at ``dst`` is refused with one line.

    Raises:
        ConfigError: ``dst`` is a directory.
    """
    try:
        os.replace(src, dst)
    except IsADirectoryError:
        raise _refuse_file(Path(dst), "is a directory") from None


def read_private(path: str | os.PathLike[str], limit_bytes: int = 1 << 20) -> bytes:
    """The first ``limit_bytes`` of an existing file of ours (see :func:`open_private`).

    Raises:
        ConfigError: as :func:`open_private`.
        FileNotFoundError: when missing.
    """
    fd = open_private(path, os.O_RDONLY, create=False)
    try:
        chunks = []
        left = limit_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_private_file(
    path: str | os.PathLike[str],
    *,
    what: str,
    siblings: tuple[str, ...] = (),
    create_dir: bool = True,
) -> bool:
    """Verify a file that perseus reads back or that another library opens itself (a
    SQLite store, an online-profile cache) before it is opened; return whether it exists.

    Its directory must be one nobody else controls (:func:`verify_private_dir`; created with
    mode 0700 when missing and ``create_dir``), so nothing can be planted in it after this
    check. The file, and ``path + suffix`` for each of ``siblings`` (``"-wal"``, ``"-shm"``,
    ``"-journal"``), where present, must be a regular file of this user with one name: a
    symbolic link, a FIFO, a device or another user's file is refused.

    Args:
        path: The file.
        what: What it is, for the message ("recurring store").
        siblings: Suffixes of files that are opened with it.
        create_dir: Create a missing directory; False: a missing directory means no file.

    Raises:
        ConfigError: the directory or a file is refused (one line: path, why, the fix).
    """
    p = Path(os.path.abspath(path))
    if not p.name:
        raise _error(f"{what} {path}: names a directory; pass a file path")
    try:
        folder = verify_private_dir(p.parent, create=create_dir, what=f"{what} directory")
    except FileNotFoundError:
        return False
    exists = False
    for suffix in ("", *siblings):
        entry = folder / f"{p.name}{suffix}"
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            continue
        why = _file_problem(st)
        if why is not None:
            raise _error(
                f"{what} file {entry} {why}; perseus opens it only when it is its own regular "
                f"file: remove it (rm {entry}) or pass a path in a directory of yours"
            )
        exists = exists or suffix == ""
    return exists
