"""Outputs: whole or nothing, never replacing what is not a regular file, nothing left behind."""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from perseus.errors import ConfigError
from perseus.io.atomic import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    check_output_directory,
    check_output_path,
    open_output_dir,
)

REPO = Path(__file__).resolve().parents[2]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "a" / "out.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert _names(path.parent) == ["out.txt"]


def test_atomic_directory_leaves_nothing_on_error(tmp_path: Path) -> None:
    target = tmp_path / "report"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "half.png").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replaces_existing(tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_outputs_get_ordinary_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
        with atomic_directory(tmp_path / "d") as tmp:
            (tmp / "a").write_text("y")
    finally:
        os.umask(mask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    ("umask", "dir_mode"),
    [(0, 0o755), (0o020, 0o755), (0o002, 0o775), (0o022, 0o755), (0o077, 0o700)],
)
def test_created_directories_are_never_writable_by_others(
    tmp_path: Path, umask: int, dir_mode: int
) -> None:
    """Report directories and an output's missing parents: the umask's mode, but never
    writable by others (under umask 0 ``mkdir -p`` would make them 0777); a directory that
    was there keeps its mode. Files written likewise (under umask 0 they were 0666)."""
    kept = tmp_path / "kept"
    kept.mkdir()
    kept.chmod(0o777)
    mask = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a" / "b" / "f.txt", "x")
        atomic_write_text(kept / "f.txt", "x")
        with atomic_directory(tmp_path / "c" / "report") as tmp:
            (tmp / "a").write_text("y")
    finally:
        os.umask(mask)
    for made in ("a", "a/b", "c", "c/report"):
        assert stat.S_IMODE((tmp_path / made).stat().st_mode) == dir_mode, made
    assert stat.S_IMODE(kept.stat().st_mode) == 0o777
    for written in ("a/b/f.txt", "kept/f.txt"):
        assert stat.S_IMODE((tmp_path / written).stat().st_mode) == dir_mode & 0o666, written


def test_the_umask_is_read_without_setting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting the umask to read it applies, for that instant, to every thread's new files:
    a training run's metrics sink (open_output_dir) making its directory would let a
    checkpoint or event-file thread create a 0666 file. Linux says the umask in
    /proc/self/status."""
    if not Path("/proc/self/status").read_text().count("\nUmask:"):
        pytest.skip("no Umask line in /proc/self/status (Linux before 4.7)")
    set_to: list[int] = []
    real = os.umask
    mask = real(0o027)
    try:
        monkeypatch.setattr(os, "umask", lambda m: set_to.append(m) or real(m))
        fd = open_output_dir(tmp_path / "metrics" / "run")
        os.close(fd)
        atomic_write_text(tmp_path / "metrics" / "f.txt", "x")
        with atomic_directory(tmp_path / "report"):
            pass
    finally:
        real(mask)
    assert set_to == []
    assert stat.S_IMODE((tmp_path / "metrics" / "run").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "metrics" / "f.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "report").stat().st_mode) == 0o750


def test_a_failed_write_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out.json").write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ConfigError, match="the disk is full") as raised:
        atomic_write_text(tmp_path / "out.json", "new")
    assert str(raised.value).startswith(f"{tmp_path / 'out.json'}: ")  # the CLI's error names it
    assert _names(tmp_path) == ["out.json"]
    assert (tmp_path / "out.json").read_text() == "old"


def test_ctrl_c_during_a_write_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perseus.io.atomic as atomic

    def interrupted(fd: int, data: bytes) -> None:
        os.write(fd, data[:3])
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "out.json", "whole text")
    with pytest.raises(KeyboardInterrupt), atomic_directory(tmp_path / "report") as tmp:
        atomic_write_text(tmp / "a.txt", "x")
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_with_a_reader_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 10
    data = b"x" * 300_000  # more than a pipe's buffer: the write must wait for the reader
    while True:
        try:
            atomic_write_bytes(fifo, data)
            break
        except ConfigError:  # the reader has not opened its end yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
    reader.join(10)
    assert got == [data]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _names(tmp_path) == ["pipe"]


def test_a_fifo_nobody_reads_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert check_output_path(fifo).kind == "stream"
    with pytest.raises(ConfigError, match="FIFO that no process reads"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _names(tmp_path) == ["pipe"]


def test_a_character_device_is_written_through_not_replaced(tmp_path: Path) -> None:
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    atomic_write_text(null, "discarded")
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert _names(tmp_path) == ["null"]


def test_stdout_is_written_to_the_descriptor(capfd: pytest.CaptureFixture[str]) -> None:
    atomic_write_text("/dev/stdout", "to stdout\n")
    assert capfd.readouterr().out == "to stdout\n"


def test_sockets_and_directories_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(ConfigError, match="is a socket"):
            atomic_write_text(sock_path, "x")
    with pytest.raises(ConfigError, match="is a directory"):
        atomic_write_text(tmp_path, "x")
    for name in (".", "..", "sub/"):
        with pytest.raises(ConfigError, match="directory"):
            check_output_path(name)


def test_a_link_within_the_directory_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "out.json").symlink_to("real.json")
    (tmp_path / "dangling.json").symlink_to("later.json")
    atomic_write_text(tmp_path / "out.json", "new")
    atomic_write_text(tmp_path / "dangling.json", "made")
    assert (tmp_path / "real.json").read_text() == "new"
    assert os.readlink(tmp_path / "out.json") == "real.json"  # still a link
    assert (tmp_path / "later.json").read_text() == "made"
    assert _names(tmp_path) == ["dangling.json", "later.json", "out.json", "real.json"]


def test_a_link_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "passwd"
    victim.write_text("root:x:0:0")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "out.json").symlink_to(victim)
    with pytest.raises(ConfigError, match="outside"):
        atomic_write_text(shared / "out.json", "{}")
    assert victim.read_text() == "root:x:0:0"
    assert os.readlink(shared / "out.json") == str(victim)
    assert _names(shared) == ["out.json"]


def test_current_directory_cannot_be_an_output_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in (".", "..", str(tmp_path), "./"):
        with pytest.raises(ConfigError, match="current directory"):
            check_output_directory(name)
        with pytest.raises(ConfigError, match="current directory"), atomic_directory(name):
            pass
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to("real")
    with pytest.raises(ConfigError, match="symbolic link"):
        check_output_directory("linked")


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **_text())
    pid = int(dead.stdout)
    stale = tmp_path / f".out.json.{pid}.0123abcd.tmp"
    stale.write_text("half")
    alive = tmp_path / f".out.json.{os.getppid()}.0123abcd.tmp"  # a live process's: kept
    alive.write_text("busy")
    atomic_write_text(tmp_path / "out.json", "whole")
    assert _names(tmp_path) == [alive.name, "out.json"]


def test_a_temporary_named_with_an_impossible_pid_does_not_break_the_write(
    tmp_path: Path,
) -> None:
    # A name planted in a shared output directory: os.kill(pid, 0) once raised OverflowError.
    huge = tmp_path / f".out.json.{10**20}.0123abcd.tmp"
    huge.write_text("planted")
    group = tmp_path / ".out.json.0.0123abcd.tmp"  # pid 0 names a process group, not a process
    group.write_text("planted")
    atomic_write_text(tmp_path / "out.json", "whole")
    assert _names(tmp_path) == ["out.json"]


def _text() -> dict[str, object]:
    return {"capture_output": True, "text": True, "check": True, "timeout": 60}


_SLOW_WRITER = textwrap.dedent(
    """
    import os, signal, sys, time
    import perseus.io.atomic as atomic

    mode, target = sys.argv[1], sys.argv[2]
    seen = []
    if mode == "handler":
        signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    real = atomic._write_all

    def slow(fd, data):
        real(fd, data[:10])
        print("writing", flush=True)
        time.sleep(3)
        real(fd, data[10:])

    atomic._write_all = slow
    if target.endswith("dir"):
        with atomic.atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("a")
            atomic.atomic_write_text(tmp / "b.txt", "b" * 100)
    else:
        atomic.atomic_write_text(target, "x" * 100)
    print("done", seen, flush=True)
    """
)


@pytest.mark.parametrize("target", ["out.json", "outdir"])
def test_sigterm_during_a_write_leaves_no_temporary(tmp_path: Path, target: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, "default", str(tmp_path / target)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "writing\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # still ends as SIGTERM does
    assert list(tmp_path.iterdir()) == []


def test_a_programs_sigterm_handler_runs_after_the_write(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, "handler", str(tmp_path / "out.json")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "writing\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out == f"done [{int(signal.SIGTERM)}]\n"  # not swallowed: delivered after the write
    assert (tmp_path / "out.json").read_text() == "x" * 100
    assert _names(tmp_path) == ["out.json"]


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    from perseus.io.atomic import check_distinct_outputs

    (tmp_path / "sub").mkdir()
    out = tmp_path / "out.json"
    same = [
        str(out),  # not there yet: the same name
        str(tmp_path / "sub" / ".." / "out.json"),
    ]
    for other in same:
        with pytest.raises(ConfigError, match=r"^--power-curve .*: the same file as -o "):
            check_distinct_outputs({"-o": out, "--power-curve": other})
    out.write_text("{}")
    (tmp_path / "link.json").symlink_to("out.json")
    os.link(out, tmp_path / "hard.json")
    for other in ("link.json", "hard.json"):
        with pytest.raises(ConfigError, match="the same file as"):
            check_distinct_outputs({"-o": out, "--power-curve": tmp_path / other})
    # Distinct files, an output not asked for, and a device named twice are fine.
    check_distinct_outputs({"-o": out, "--power-curve": tmp_path / "curve.csv"})
    check_distinct_outputs({"-o": out, "--power-curve": None})
    check_distinct_outputs({"-o": "/dev/null", "--power-curve": "/dev/null"})
    assert out.read_text() == "{}"


def _interrupt_between_renames(monkeypatch: pytest.MonkeyPatch, stop: Callable[[], None]) -> None:
    """Call ``stop`` once, right after atomic_directory moved the old directory aside."""
    real = os.rename
    calls: list[str] = []

    def rename(src: str, dst: str, **kw: int) -> None:
        real(src, dst, **kw)
        calls.append(dst)
        if len(calls) == 1 and dst.endswith(".tmp"):  # the old one went to its temporary name
            stop()

    monkeypatch.setattr(os, "rename", rename)


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def test_ctrl_c_while_a_directory_is_replaced_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report"
    target.mkdir()
    (target / "old.txt").write_text("old")
    _interrupt_between_renames(monkeypatch, _raise_keyboard_interrupt)
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _names(tmp_path) == ["report"]
    assert (target / "old.txt").read_text() == "old"
    assert _names(target) == ["old.txt"]


_SIGTERM_CHILD = """
import os, signal, sys
from pathlib import Path
import pytest
from tests.io.test_atomic import _interrupt_between_renames
from perseus.io.atomic import atomic_directory
target = Path(sys.argv[1])
with pytest.MonkeyPatch.context() as mp:
    _interrupt_between_renames(mp, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
print("not killed")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_sigterm_while_a_directory_is_replaced_keeps_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.mkdir()
    (target / "old.txt").write_text("old")
    proc = subprocess.run(
        [sys.executable, "-c", _SIGTERM_CHILD, str(target)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert (target / "old.txt").read_text() == "old"
    assert _names(target) == ["old.txt"]
    assert "report" in _names(tmp_path)
