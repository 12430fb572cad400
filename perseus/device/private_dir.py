"""Directories nobody else controls, and files in them opened without following links.

perseus runs as root on shared machines and keeps GPU ownership locks and simulated GPUs' state
outside its outputs. Their directory is verified the way ``ssh`` verifies ``~/.ssh`` (a real
directory, ours or root's, not writable by others unless sticky and ours; every directory above
likewise; missing ones created 0700), and files in it are opened with ``O_NOFOLLOW`` and checked
with ``fstat`` (a regular file of ours with one link). Standard library only: the watchdog loads
it by file path; refusals raise ``ConfigError``, or ``PermissionError`` without perseus.
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
    """Whether the group of ``st`` is its owner's private group (umask 002 systems): same
    name, its primary group, no other member or user; never gid 0."""
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
    """Why a directory with ``lstat`` status ``st`` is not one we may keep files in."""
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


def verify_private_dir(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    what: str = "directory",
    env: str | None = None,
) -> Path:
    """Create or verify directory ``path`` (and every directory above it); return its path.

    Args:
        create: Create it (and missing parents) with mode 0700 when missing.
        what: What it is, for the message ("lock directory").
        env: The environment variable that overrides it, named in the fix.

    Raises:
        ConfigError: a link, not a directory, another user's, or writable by others.
        FileNotFoundError: missing and ``create`` is False.
    """
    target = Path(os.path.abspath(path))
    _check_links_on_the_way(target, what, env)
    # Links above are resolved (``/var/run -> /run``); each real directory must be trusted.
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
            name = what if final else f"{what} {target}: its parent"
            where = f"point ${env} at" if env else "use"
            raise _error(
                f"{name} {directory} {why} ({_describe(st)}); perseus keeps its files only in a "
                f"directory nobody else controls: remove it or {where} a directory of yours with "
                "mode 0700 (mkdir -m 700 DIR)"
            )
    return chain[-1]


def _check_links_on_the_way(target: Path, what: str, env: str | None) -> None:
    """Refuse a symbolic link on the way to ``target`` that someone else could repoint: one
    owned by another user, or in a directory others can write."""
    for prefix in [*reversed(target.parents), target][1:]:
        try:
            st = os.lstat(prefix)
        except OSError:
            return  # missing: created below as a real directory; else the walk reports it
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
    """Where perseus keeps locks and simulated state: ``/run/perseus`` as root, else
    ``$XDG_RUNTIME_DIR/perseus`` when that is the user's own, else ``<tmp>/perseus-<uid>``."""
    if os.geteuid() == 0 and os.path.isdir(_ROOT_BASE.parent):
        return _ROOT_BASE
    xdg = _xdg_runtime_dir()
    if xdg is not None:
        return xdg / "perseus"
    return Path(tempfile.gettempdir()) / f"perseus-{os.geteuid()}"


def _env_path(name: str) -> Path | None:
    """``$name`` as a path, None when unset or empty; a blank one (spaces) is refused."""
    env = os.environ.get(name)
    if env and not env.strip():
        raise _error(
            f"${name} is blank ({env!r}); unset it or point it at a directory of yours with "
            "mode 0700 (mkdir -m 700 DIR)"
        )
    return Path(env) if env else None


def lock_dir() -> Path:
    """``$PERSEUS_LOCK_DIR`` or ``<runtime_dir>/locks``, verified (and created)."""
    path = _env_path(LOCK_DIR_ENV) or runtime_dir() / "locks"
    return verify_private_dir(path, what="lock directory", env=LOCK_DIR_ENV)


def sim_dir() -> Path:
    """``$PERSEUS_SIM_DIR`` or ``<runtime_dir>/sim``, verified (and created)."""
    path = _env_path(SIM_DIR_ENV) or runtime_dir() / "sim"
    return verify_private_dir(path, what="simulated GPU directory", env=SIM_DIR_ENV)


_DEVICE = "is a device node, not a regular file"


def _refuse_file(path: Path, why: str) -> Exception:
    rm = "rm -r" if why == "is a directory" else "rm"
    fix = f"remove it ({rm} {path}) and check who put it there"
    if why == _DEVICE:  # never advise removing a device node
        fix = f"point ${LOCK_DIR_ENV} or ${SIM_DIR_ENV} at a directory of yours (mkdir -m 700 DIR)"
    return _error(
        f"{path} {why}; perseus opens its lock and state files only when they are its own "
        f"regular files: {fix}"
    )


def open_private(
    path: str | os.PathLike[str], flags: int, *, mode: int = 0o600, create: bool = True
) -> int:
    """Open ``path`` without following links; the descriptor is of a regular file of ours.

    A new file is created with ``O_CREAT | O_EXCL`` and ``mode`` when ``create``; the open
    never blocks (a planted FIFO is refused, not waited on).

    Raises:
        ConfigError: a link, not a regular file, another user's, or with hard links.
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
    """Create or open ``p``: its descriptor, or None when removed between the two opens."""
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                return os.open(p, base | os.O_CREAT | os.O_EXCL, mode)
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
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return _DEVICE
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to {_owner(st.st_uid)}, not to this user"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} names (hard links)"
    return None


def replace_private(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace(src, dst)`` (a link at ``dst`` is replaced, never followed).

    Raises:
        ConfigError: ``dst`` is a directory.
    """
    try:
        os.replace(src, dst)
    except IsADirectoryError:
        raise _refuse_file(Path(dst), "is a directory") from None


def read_private(path: str | os.PathLike[str], limit_bytes: int = 1 << 20) -> bytes:
    """The first ``limit_bytes`` of an existing file of ours (see :func:`open_private`)."""
    with open(open_private(path, os.O_RDONLY, create=False), "rb") as f:
        return f.read(limit_bytes)


def check_private_file(
    path: str | os.PathLike[str],
    *,
    what: str,
    siblings: tuple[str, ...] = (),
    create_dir: bool = True,
    shared_dir_ok: bool = True,
) -> bool:
    """Verify a file another library opens itself (a SQLite store) before it is opened: its
    directory private, and it and each ``path + suffix`` of ``siblings`` (``"-wal"``), where
    present, a regular file of ours with one name. Returns whether it exists.

    Args:
        what: What it is, for the message ("recurring store").
        siblings: Suffixes of files that are opened with it.
        create_dir: Create a missing directory; False: a missing directory means no file.
        shared_dir_ok: Accept a sticky directory of ours that others may write (``/tmp``).
            False for a file the other library creates or opens by name after this check
            (SQLite's database and siblings, each open following links): another user could
            plant one there between this check and that open.

    Raises:
        ConfigError: the directory or a file is refused.
    """
    p = Path(os.path.abspath(path))
    if not p.name:
        raise _error(f"{what} {path}: names a directory; pass a file path")
    try:
        folder = verify_private_dir(p.parent, create=create_dir, what=f"{what} directory")
    except FileNotFoundError:
        return False
    if not shared_dir_ok:
        st = os.lstat(folder)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o002 or (mode & 0o020 and not _private_group(st)):
            raise _error(
                f"{what} directory {folder} is writable by others (sticky, {_describe(st)}); "
                f"another user could plant the {what}'s files there between perseus's check "
                "and their open: pass a path in a directory of yours with mode 0700 "
                "(mkdir -m 700 DIR)"
            )
    exists = False
    for suffix in ("", *siblings):
        entry = folder / f"{p.name}{suffix}"
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            continue
        why = _file_problem(st)
        if why is not None:
            fix = "pass the path of a new file in a directory of yours"
            if _removable(st, os.lstat(folder)):
                fix = f"remove it (rm {entry}) or pass a path in a directory of yours"
            raise _error(
                f"{what} file {entry} {why}; perseus opens it only when it is its own regular "
                f"file: {fix}"
            )
        exists = exists or suffix == ""
    return exists


def _removable(st: os.stat_result, folder: os.stat_result) -> bool:
    """Whether to advise removing an entry a user named (status ``st``) in ``folder``: never
    a directory or device node, only in a directory of this user's (as root, a private one:
    never a system directory such as ``/dev`` or ``/etc``)."""
    if stat.S_ISDIR(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return False
    me = os.geteuid()
    return folder.st_uid == me and not (me == 0 and stat.S_IMODE(folder.st_mode) & 0o077)
