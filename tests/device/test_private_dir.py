"""Directories nobody else controls and files opened without following links
(:mod:`perseus.device.private_dir`), checked as the current user; the attacker's side is in
tests/security/test_private_dirs.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from perseus.device import private_dir
from perseus.device.private_dir import (
    lock_dir,
    open_private,
    read_private,
    runtime_dir,
    sim_dir,
    verify_private_dir,
)
from perseus.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_missing_directories_are_created_0700(tmp_path: Path) -> None:
    made = verify_private_dir(tmp_path / "a" / "b")
    assert made == tmp_path / "a" / "b"
    assert _mode(tmp_path / "a") == 0o700 and _mode(made) == 0o700
    with pytest.raises(FileNotFoundError):
        verify_private_dir(tmp_path / "missing", create=False)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(ConfigError) as e:
        verify_private_dir(d, what="lock directory", env="PERSEUS_LOCK_DIR")
    message = str(e.value)
    assert "\n" not in message
    assert f"lock directory {d} is writable by group or others" in message
    assert f"mode {mode:04o}" in message and "$PERSEUS_LOCK_DIR" in message


def test_sticky_and_ours_is_accepted_and_a_link_is_not(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    assert verify_private_dir(d) == d
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "shared")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        verify_private_dir(link)
    # A link above the directory is resolved (like /var/run -> /run) and its target checked.
    assert verify_private_dir(link / "inner") == d / "inner"


def test_a_writable_parent_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(ConfigError, match=r"its parent .*open is writable by group or others"):
        verify_private_dir(parent / "mine")
    assert not (parent / "mine").exists()


def test_environment_overrides_are_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(loose))
    monkeypatch.setenv("PERSEUS_SIM_DIR", str(loose))
    with pytest.raises(ConfigError, match="PERSEUS_LOCK_DIR"):
        lock_dir()
    with pytest.raises(ConfigError, match="PERSEUS_SIM_DIR"):
        sim_dir()
    monkeypatch.setenv("PERSEUS_SIM_DIR", str(tmp_path / "fine"))
    assert sim_dir() == tmp_path / "fine" and _mode(tmp_path / "fine") == 0o700


@pytest.mark.parametrize("env", ["PERSEUS_LOCK_DIR", "PERSEUS_SIM_DIR"])
def test_a_blank_environment_override_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    """A value of spaces made a directory named ' ' in the current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env, "  ")
    with pytest.raises(ConfigError, match=rf"^\${env} is blank \('  '\); unset it"):
        (lock_dir if env == "PERSEUS_LOCK_DIR" else sim_dir)()
    assert not list(tmp_path.iterdir())


def test_default_runtime_dir_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("plays another uid with chown: needs root")
    monkeypatch.setattr(private_dir.os, "geteuid", lambda: 4321)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    os.chown(xdg, 4321, 4321)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert runtime_dir() == xdg / "perseus"
    xdg.chmod(0o755)  # not a private runtime directory: the temp dir instead
    assert runtime_dir() == Path(tempfile.gettempdir()) / "perseus-4321"
    monkeypatch.setattr(private_dir.os, "geteuid", lambda: 0)
    if os.path.isdir("/run"):
        assert runtime_dir() == Path("/run/perseus")


def test_open_private_creates_exclusively_and_refuses_links_fifos_and_hard_links(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.owner"
    fd = open_private(path, os.O_RDWR, mode=0o644)
    os.write(fd, b"1\n")
    os.close(fd)
    assert _mode(path) == 0o644 and read_private(path) == b"1\n"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link.owner").symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        open_private(tmp_path / "link.owner", os.O_RDWR)
    os.mkfifo(tmp_path / "fifo.owner")
    for flags in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):  # refused at once, never waited on
        with pytest.raises(ConfigError, match="is not a regular file"):
            open_private(tmp_path / "fifo.owner", flags)
    os.link(victim, tmp_path / "hard.owner")
    with pytest.raises(ConfigError, match="2 names"):
        open_private(tmp_path / "hard.owner", os.O_RDWR)
    assert victim.read_text() == "keep"
    with pytest.raises(FileNotFoundError):
        open_private(tmp_path / "none", os.O_RDONLY, create=False)


def test_loads_alone_by_path(tmp_path: Path) -> None:
    """The watchdog loads it by path under ``python -I``: stdlib only until it must refuse."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    path = REPO / "perseus" / "device" / "private_dir.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('p', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(','.join(k for k in sys.modules if k.startswith(('perseus', 'torch', 'pynvml'))))\n"
        "try:\n"
        f"    m.verify_private_dir({str(loose)!r})\n"
        "except (PermissionError, ValueError) as e:\n"
        "    print(type(e).__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    loaded, refused = proc.stdout.split("\n")[:2]
    assert loaded == ""
    assert refused in ("ConfigError", "PermissionError")


@pytest.mark.parametrize("path", ["/dev/null", "/dev/full", "/dev", "/dev/"])
def test_a_device_node_or_system_directory_is_never_advised_removed(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--db sqlite:////dev/full`` or a store at ``/dev/null``: say what to pass instead,
    never ``rm`` a device node or a system path."""
    from perseus.cli.main import main

    if not os.path.exists(path):
        pytest.skip(f"no {path} here")
    with pytest.raises(ConfigError) as e:
        private_dir.check_private_file(path, what="recurring store", shared_dir_ok=False)
    assert "rm " not in str(e.value) and "remove" not in str(e.value)
    assert str(e.value).endswith(": pass the path of a new file in a directory of yours")
    assert main(["fleet", "budget", "--db", f"sqlite:///{path}", "--set-w", "100"]) == 2
    err = capsys.readouterr().err
    assert "pass the path of a new file" in err and "rm " not in err
    if path.startswith("/dev/") and len(path) > 5:
        with pytest.raises(ConfigError, match="is a device node, not a regular file") as e:
            open_private(path, os.O_RDONLY, create=False)
        assert "rm " not in str(e.value) and "$PERSEUS_LOCK_DIR" in str(e.value)


def test_removing_a_planted_link_is_advised_only_in_a_directory_of_ours(tmp_path: Path) -> None:
    """A link beside a store in the user's own directory: ``rm`` it. As root, only in a
    private directory (a root-owned 0755 one may be a system directory)."""
    for mode in (0o700, 0o755):
        folder = tmp_path / f"d{mode:o}"
        folder.mkdir(mode=mode)
        folder.chmod(mode)
        (folder / "jobs.db").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(ConfigError) as e:
            private_dir.check_private_file(folder / "jobs.db", what="recurring store")
        advised = f"remove it (rm {folder / 'jobs.db'}) or pass a path" in str(e.value)
        assert advised == (mode == 0o700 or os.geteuid() != 0), str(e.value)
