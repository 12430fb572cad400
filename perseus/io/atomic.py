"""Outputs: files and directories appear whole or not at all, and never replace what is not
a regular file (docs/formats.md, "Inputs and outputs on a shared machine").

Everything perseus writes goes through here. A missing or regular file is replaced by a fsynced
temporary sibling (``.NAME.PID.RANDOM.tmp``, created ``O_EXCL``) renamed over it inside the
directory opened once; a link is followed only when it is ours (or root's) and points to a
regular file in its own directory; a character device or FIFO named directly is written
through, ``/dev/stdout`` and ``/dev/fd/N`` to that descriptor; anything else is refused. The
directory is opened one component at a time without following another user's links. No
temporary survives a failed write (exceptions, Ctrl-C, SIGTERM/SIGHUP); one left by a killed
process is removed by the next write of the same name.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from perseus.errors import ConfigError
from perseus.io._errors import FULL_DISK_ERRNOS, full_disk_error
from perseus.io._signal_cleanup import SignalCleanup
from perseus.io.process_identity import pid_alive
from perseus.io.reading import describe_file_type

__all__ = [
    "OutputTarget",
    "atomic_directory",
    "atomic_outputs",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_distinct_outputs",
    "check_output_directory",
    "check_output_path",
    "check_plain_directory",
    "lstat_or_none",
    "open_output_dir",
    "writes_to_stdout",
]

_FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d{1,6})$")
_STD_NAMES = {"/dev/stdout": 1, "/dev/stderr": 2}
_TEMP_RE = re.compile(r"^\.(.+)\.(\d+)\.[0-9a-f]{8}\.tmp$")


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """How an output path is written.

    Attributes:
        path: The path as named.
        kind: ``"file"`` (temporary file, then rename), ``"stream"`` (a character device or
            FIFO, written through) or ``"fd"`` (this process's descriptor ``fd``).
        entry: For ``"file"``: the directory entry replaced (the path, or the in-directory
            file a link of ours points to).
        fd: For ``"fd"``: the descriptor.
    """

    path: Path
    kind: Literal["file", "stream", "fd"]
    entry: Path
    fd: int = -1


def _umask() -> int:
    # Linux says it (4.7+); os.umask can only read it by setting it, which for that instant
    # applies to every thread's new files (a training run's checkpoints beside its metrics).
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _dir_mode() -> int:
    """The mode of a directory perseus creates (and, without its execute bits, of a file): as
    the umask says, but never writable by others (a umask that lets others write, such as 0,
    keeps the group out too)."""
    mask = _umask()
    return 0o777 & ~(mask if mask & 0o002 else mask | 0o022)


def _std_fd(text: str) -> int | None:
    m = _FD_PATH.match(text)
    return int(m.group(1)) if m else _STD_NAMES.get(text)


def writes_to_stdout(path: str | os.PathLike[str]) -> bool:
    """Whether writing ``path`` writes this process's standard output (``/dev/stdout``)."""
    return _std_fd(os.fspath(path)) == 1


def check_output_path(path: str | os.PathLike[str]) -> OutputTarget:
    """How ``path`` will be written, or :class:`ConfigError` if perseus must not write it.

    Raises:
        ConfigError: ``"<path>: ..."``: an empty path, a directory, a socket or block device,
            a link out of its directory or planted by another user, a closed descriptor.
    """
    text = os.fspath(path)
    if not text.strip():
        raise ConfigError("empty output path; pass a file name")
    p = Path(text)
    fd = _std_fd(text)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise ConfigError(f"{p}: descriptor {fd} is not open; pass a file path") from None
        return OutputTarget(p, "fd", p, fd)
    if text.endswith(("/", os.sep)) or p.name in ("", ".", ".."):
        raise ConfigError(f"{p}: names a directory; pass a file path")
    _check_dir(p.parent)
    st = lstat_or_none(p)
    if st is None or stat.S_ISREG(st.st_mode):
        return OutputTarget(p, "file", p)
    mode = st.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return OutputTarget(p, "stream", p)
    if stat.S_ISLNK(mode):
        return OutputTarget(p, "file", _link_entry(p, st))
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{p}: is a directory; pass a file path")
    raise ConfigError(
        f"{p}: is {describe_file_type(mode)}; perseus writes regular files (or a character "
        "device or FIFO named directly); pass another path"
    )


def check_distinct_outputs(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Refuse two outputs that name one file (``d/../F``, a link, a hard link); devices, FIFOs
    and descriptors may repeat. ``outputs`` maps each output's name in messages
    (``"--power-curve"``) to its path (None: not asked).

    Raises:
        ConfigError: ``"<name> <path>: the same file as <name> <path>; ..."``.
    """
    seen: dict[object, tuple[str, str]] = {}
    for name, path in outputs.items():
        if path is None or _std_fd(text := os.fspath(path)) is not None:
            continue
        try:
            st = os.stat(text)
            key: object = (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None
        except OSError:  # not there yet: where it would be created
            key = os.path.realpath(text)
        if key is not None and key in seen:
            first, first_path = seen[key]
            raise ConfigError(
                f"{name} {text}: the same file as {first} {first_path}; give each output a "
                "path of its own"
            )
        if key is not None:
            seen[key] = (name, text)


def _link_entry(p: Path, st: os.stat_result) -> Path:
    """The in-directory file a link of ours points to, else :class:`ConfigError`."""
    _refuse_foreign_link(st, f"{p}: is")
    folder = os.path.realpath(p.parent)
    target = os.path.realpath(p)
    if os.path.dirname(target) != folder:
        raise ConfigError(
            f"{p}: is a symbolic link to {target}, outside {p.parent}; perseus does not follow "
            "links out of the named directory; pass the real path"
        )
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"{p}: is a symbolic link to {describe_file_type(mode)} ({target}); pass a "
            "regular file's path"
        )
    return p.parent / os.path.basename(target)


def _refuse_foreign_link(st: os.stat_result, shown: str) -> None:
    """Refuse a link another user planted; ``shown`` starts the message (``"<path>: is"``)."""
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{shown} a symbolic link owned by another user (uid {st.st_uid}); perseus does not "
            "follow another user's links; remove the link or pass the real path"
        )


def check_output_directory(path: str | os.PathLike[str]) -> Path:
    """Refuse an output directory that cannot be replaced as a whole.

    Raises:
        ConfigError: ``"<path>: ..."``: empty, the current directory or one holding it, a
            symbolic link, or an existing non-directory.
    """
    text = os.fspath(path)
    if not text.strip():
        raise ConfigError("empty output path; pass a directory name")
    p = Path(text)
    real = os.path.realpath(p)
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed: nothing can hold it
        cwd = ""
    holds_cwd = bool(cwd) and (cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep))
    if p.name in ("", ".", "..") or holds_cwd:
        raise ConfigError(
            f"{p}: is the current directory or holds it, which cannot be replaced; pass a new "
            "directory name (e.g. report)"
        )
    _check_dir(p.parent)
    st = lstat_or_none(p)
    if st is not None:
        check_plain_directory(p, st.st_mode)
    return p


def lstat_or_none(p: Path, prefix: str = "") -> os.stat_result | None:
    """``os.lstat(p)``, None when nothing is there.

    Raises:
        ConfigError: ``"<prefix><p>: cannot check the output path (...)"``.
    """
    try:
        return os.lstat(p)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{prefix}{p}: cannot check the output path ({e.strerror})") from None


def check_plain_directory(p: Path, mode: int, prefix: str = "") -> None:
    """Refuse an output directory that is a symbolic link or not a directory (``mode``)."""
    if stat.S_ISLNK(mode):
        raise ConfigError(
            f"{prefix}{p}: is a symbolic link; perseus does not follow links for outputs; "
            "pass the real directory"
        )
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{prefix}{p}: is {describe_file_type(mode)}; pass a directory path")


def _temp_name(name: str) -> str:
    return f".{name[:200]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _remove_stale_temps(dfd: int, name: str) -> None:
    """Remove temporaries of ``name`` that a killed process of this user left behind."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(dfd):
            m = _TEMP_RE.match(entry)
            if m is None or m.group(1) != name[:200]:
                continue
            pid = int(m.group(2))
            if pid == os.getpid() or pid_alive(pid):
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(entry, dir_fd=dfd)
                if st.st_uid != os.geteuid():
                    continue
                if stat.S_ISDIR(st.st_mode):
                    _rmtree_at(dfd, entry)
                elif stat.S_ISREG(st.st_mode):
                    os.unlink(entry, dir_fd=dfd)


def _rmtree_at(dfd: int, name: str) -> None:
    # rmtree never follows links inside the tree (it walks by descriptor on Linux).
    with contextlib.suppress(OSError):
        if sys.version_info >= (3, 11):
            shutil.rmtree(name, dir_fd=dfd)
        else:  # pragma: no cover - the descriptor's path
            shutil.rmtree(os.path.join(f"/proc/self/fd/{dfd}", name))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINK_HOPS = 40
#: Removes this process's temporaries on SIGTERM/SIGHUP.
_CLEANUP = SignalCleanup()


def _walk_dir(folder: Path, *, create: bool) -> int | None:
    """``folder`` opened one component at a time with ``O_NOFOLLOW`` relative to the one
    before, following only our or root's links (``/var/run -> /run``). Missing directories
    are created like ``mkdir -p`` when ``create``; else None is returned.

    Raises:
        ConfigError: a link of another user on the way, a component that is not a directory,
            or too many links.
    """
    parts = [part for part in os.path.abspath(folder).split("/") if part]
    fd = os.open("/", _DIR_FLAGS)
    hops = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            try:
                next_fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, _dir_mode(), dir_fd=fd)
                parts.insert(0, name)  # open it (or what raced us to the name) as above
                continue
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                hops += 1
                target = _link_target(folder, name, fd, hops)
                parts[:0] = [part for part in target.split("/") if part]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                continue
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_target(folder: Path, name: str, fd: int, hops: int) -> str:
    """Where the link ``name`` in directory ``fd`` points, when perseus may follow it."""
    st = os.lstat(name, dir_fd=fd)
    if not stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{folder}: {name} on the way is {describe_file_type(st.st_mode)}, not a "
            "directory; pass another path"
        ) from None
    _refuse_foreign_link(st, f"{folder}: {name} on the way is")
    if hops > _MAX_LINK_HOPS:
        raise ConfigError(f"{folder}: too many symbolic links; pass the real path") from None
    return os.readlink(name, dir_fd=fd)


def open_output_dir(folder: str | os.PathLike[str]) -> int:
    """A descriptor of directory ``folder`` (created when missing, no foreign links on the way).

    Raises:
        ConfigError: another user's link on the way, or a component that is not a directory.
        OSError: the directory cannot be created or opened.
    """
    fd = _walk_dir(Path(folder), create=True)
    assert fd is not None  # created
    return fd


def _check_dir(folder: Path) -> None:
    """Refuse now (before any work) what :func:`_walk_dir` would refuse at the write."""
    try:
        fd = _walk_dir(folder, create=False)
    except OSError as e:
        raise ConfigError(
            f"{folder}: cannot open the directory ({e.strerror}); pass another path"
        ) from None
    if fd is not None:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_stream(p: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    dfd = open_output_dir(p.parent)
    try:
        fd = os.open(p.name, flags, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise ConfigError(
                f"{p}: is a FIFO that no process reads; start its reader first, or pass a file"
            ) from None
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{p}: became a symbolic link; pass another path") from None
        raise ConfigError(f"{p}: cannot open for writing ({e.strerror})") from None
    finally:
        os.close(dfd)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise ConfigError(f"{p}: changed while it was opened; pass another path")
        os.set_blocking(fd, True)  # a reader that is slower than us is not an error
        _write_all(fd, data)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _temp_sibling(entry: Path, directory: bool = False) -> Iterator[tuple[int, str, int]]:
    """Yield ``(directory fd, name, file fd)`` of a new temporary sibling of ``entry`` (a file
    open for writing, or a directory and -1), removed on any exception or SIGTERM."""
    dfd = open_output_dir(entry.parent)
    try:
        _remove_stale_temps(dfd, entry.name)
        tmp = _temp_name(entry.name)
        fd = -1
        if directory:
            os.mkdir(tmp, 0o700, dir_fd=dfd)
        else:
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dfd)

        def remove() -> None:
            if directory:
                _rmtree_at(dfd, tmp)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dfd)

        try:
            with _CLEANUP.protect(remove):
                yield dfd, tmp, fd
        except BaseException:
            remove()
            raise
    finally:
        os.close(dfd)


#: Inside :func:`atomic_outputs`: its exit stack and the renames it makes at the end.
_STAGED: contextvars.ContextVar[tuple[contextlib.ExitStack, list[Callable[[], None]]] | None] = (
    contextvars.ContextVar("perseus_staged_outputs", default=None)
)


@contextlib.contextmanager
def atomic_outputs() -> Iterator[None]:
    """The files the block writes (:func:`atomic_write_bytes`) replace their paths together
    when it ends, so that a failed one (a full disk) leaves every one as it was."""
    with contextlib.ExitStack() as stack:
        commits: list[Callable[[], None]] = []
        token = _STAGED.set((stack, commits))
        try:
            yield
        finally:
            _STAGED.reset(token)
        for commit in commits:
            commit()


def _write_file(entry: Path, data: bytes) -> None:
    staged = _STAGED.get()
    if staged is None:
        with _staged_file(entry, data) as commit:
            commit()
        return
    stack, commits = staged
    commits.append(stack.enter_context(_staged_file(entry, data)))


@contextlib.contextmanager
def _staged_file(entry: Path, data: bytes) -> Iterator[Callable[[], None]]:
    """Yield the rename that puts a written, fsynced temporary sibling in ``entry``'s place
    (the temporary is removed when the block fails)."""
    with _temp_sibling(entry) as (dfd, tmp, fd):
        try:
            _write_all(fd, data)
            os.fsync(fd)
            # O_EXCL created it 0600; give it the permissions a plain open() would, but never
            # writable by others.
            os.fchmod(fd, _dir_mode() & 0o666)
        finally:
            os.close(fd)

        def commit() -> None:
            _entry_mode(dfd, entry.name, entry, lambda m: stat.S_ISREG(m) or stat.S_ISLNK(m))
            os.replace(tmp, entry.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            with contextlib.suppress(OSError):
                os.fsync(dfd)  # the rename itself survives a crash

        yield commit


def _entry_mode(dfd: int, name: str, shown: object, ok: Callable[[int], bool]) -> int | None:
    """The mode of ``name`` in ``dfd`` (None when missing), refused unless ``ok(mode)``: what
    is about to be replaced changed while perseus worked."""
    mode = _mode_at(dfd, name)
    if mode is not None and not ok(mode):
        raise ConfigError(
            f"{shown}: became {describe_file_type(mode)} while perseus worked; nothing was "
            "written; pass another path"
        )
    return mode


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path``: atomically for files, through for devices and FIFOs.

    Raises:
        ConfigError: what :func:`check_output_path` refuses, or a FIFO nobody reads.
        ConfigError: the disk is full (or over quota, or past the file size limit), naming
            ``path``; what was there is left as it was.
        OSError: the write itself failed otherwise (permissions), naming ``path`` (but for
            standard output); nothing is left behind.
    """
    target = check_output_path(path)
    if target.kind == "fd":
        _write_all(target.fd, data)
        return
    try:
        if target.kind == "stream":
            _write_stream(target.path, data)
        else:
            _write_file(target.entry, data)
    except OSError as e:
        if e.errno in FULL_DISK_ERRNOS or e.filename is None:
            named = OSError(e.errno, e.strerror, os.fspath(path))
            raise full_disk_error(named, path) or named from None
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds (on an
    exception or SIGTERM it is removed and ``path`` is left as it was).

    Raises:
        ConfigError: what :func:`check_output_directory` refuses, or a full disk (naming
            ``path``, not the temporary directory).
    """
    target = check_output_directory(path)
    with _temp_sibling(target, directory=True) as (dfd, tmp, _):
        os.chmod(tmp, _dir_mode(), dir_fd=dfd)
        try:
            yield target.parent / tmp
        except (OSError, ConfigError) as e:
            # Name the file as it would have been, not inside the removed temporary.
            raise _renamed(e, os.fspath(target.parent / tmp), os.fspath(target)) from None
        _replace_directory(dfd, tmp, target.name)


def _renamed(error: Exception, tmp: str, final: str) -> Exception:
    """``error`` with the temporary directory ``tmp`` in its path or message named ``final``."""
    if isinstance(error, OSError):
        name = str(error.filename)
        return (
            OSError(error.errno, error.strerror, name.replace(tmp, final)) if tmp in name else error
        )
    return type(error)(str(error).replace(tmp, final)) if tmp in str(error) else error


def _mode_at(dfd: int, name: str) -> int | None:
    """The mode of ``name`` in directory ``dfd``, None when nothing is there."""
    try:
        return os.lstat(name, dir_fd=dfd).st_mode
    except FileNotFoundError:
        return None


def _replace_directory(dfd: int, tmp_name: str, name: str) -> None:
    if _entry_mode(dfd, name, name, stat.S_ISDIR) is None:
        os.rename(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return
    # Move the old directory onto a fresh empty one of ours (a name nobody else can hold),
    # put the new one in place, then remove the old one.
    old_name = _temp_name(name)
    os.mkdir(old_name, 0o700, dir_fd=dfd)

    def restore() -> None:
        # Between the renames (an error, Ctrl-C, SIGTERM): put the old directory back.
        with contextlib.suppress(OSError):
            os.rename(old_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    with _CLEANUP.protect(restore):
        try:
            os.rename(name, old_name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.rename(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            if _mode_at(dfd, name) is None:
                restore()
            if _mode_at(dfd, name) is not None:  # else old_name holds the only copy: leave it
                _rmtree_at(dfd, old_name)
            raise
    _rmtree_at(dfd, old_name)
