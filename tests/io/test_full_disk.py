"""A full disk under an output: one line naming the path, "the disk is full" and the fix; what
was there is left whole and no temporary stays behind."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.cli.main import main
from perseus.errors import ConfigError
from perseus.io.atomic import atomic_directory, atomic_write_text

REPO = Path(__file__).resolve().parents[2]
SMALL = str(REPO / "configs" / "small-ci.toml")
FIX = "nothing was written; free space or choose another path"


def _full(*_: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_in_a_report_directory_names_the_output_not_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of a report directory that does not fit named the removed temporary directory
    (``.rep.PID.RANDOM.tmp/frontier.png: No space left on device``)."""
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "report.html").write_text("old")
    monkeypatch.setattr(os, "fsync", _full)
    with pytest.raises(ConfigError) as raised, atomic_directory(tmp_path / "rep") as tmp:
        atomic_write_text(tmp / "frontier.png", "new")
    assert str(raised.value) == (
        f"{tmp_path / 'rep' / 'frontier.png'}: cannot write (the disk is full (ENOSPC)); {FIX}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
    assert (tmp_path / "rep" / "report.html").read_text() == "old"


def test_a_file_size_limit_says_how_to_raise_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def too_big(*_: object) -> None:
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(os, "fsync", too_big)
    with pytest.raises(
        ConfigError, match=r"\(EFBIG\)\); .*raise the file size limit \(ulimit -f\)"
    ):
        atomic_write_text(tmp_path / "out.json", "new")
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _small_disk(folder: Path, size: str = "64k", inodes: int = 0) -> Iterator[Path]:
    """A tmpfs of ``size`` (and ``inodes``, when given) mounted on ``folder`` (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir()
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are left."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with contextlib.suppress(OSError), open(disk / "filler", "ab") as f:
        f.write(b"\0" * max(free - leave, 0))


@pytest.mark.parametrize("leave", [None, 4096, 0], ids=["empty", "4k-left", "full"])
def test_frontier_onto_a_full_tmpfs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], leave: int | None
) -> None:
    """The frontier (90 kB) onto a 64 kB disk: empty, a few kB left, or full."""
    with _small_disk(tmp_path / "disk") as disk:
        out = disk / "front.json"
        out.write_text("PREVIOUS")
        if leave is not None:
            _fill(disk, leave)
        code = main(["frontier", "--config", SMALL, "-o", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err == f"error: {out}: cannot write (the disk is full (ENOSPC)); {FIX}\n"
        assert out.read_text() == "PREVIOUS"
        assert sorted(p.name for p in disk.iterdir()) == sorted(
            ["front.json"] + (["filler"] if leave is not None else [])
        )


def test_frontier_and_power_curve_are_written_both_or_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o was replaced by the new frontier when --power-curve then did not fit, and the error
    said "nothing was written": the pair on disk came from two runs."""
    out, curve = tmp_path / "f.json", tmp_path / "p.csv"
    out.write_text("OLD FRONTIER")
    curve.write_text("OLD CURVE")
    real_fsync, calls = os.fsync, []

    def second_is_full(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            _full()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", second_is_full)
    args = ["frontier", "--config", SMALL, "-o", str(out), "--power-curve", str(curve)]
    code = main([*args, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == f"error: {curve}: cannot write (the disk is full (ENOSPC)); {FIX}\n"
    assert (out.read_text(), curve.read_text()) == ("OLD FRONTIER", "OLD CURVE")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "p.csv"]
    monkeypatch.undo()
    assert main([*args, "--no-progress"]) == 0
    assert out.read_text().startswith("{") and curve.read_text() != "OLD CURVE"


def test_an_interrupt_inside_atomic_outputs_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    from perseus.io.atomic import atomic_outputs

    (tmp_path / "a").write_text("old a")
    with pytest.raises(KeyboardInterrupt), atomic_outputs():
        atomic_write_text(tmp_path / "a", "new a")
        atomic_write_text(tmp_path / "b", "new b")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert (tmp_path / "a").read_text() == "old a"


def test_a_disk_out_of_inodes_is_named_full_not_unwritable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o into a new directory on a disk with no inode left said "directory ... is not
    writable", as for a permission."""
    with _small_disk(tmp_path / "disk", "1m", inodes=2) as disk:
        (disk / "a").mkdir()  # the root and this take the two inodes
        out = disk / "a" / "front.json"
        assert main(["frontier", "--config", SMALL, "-o", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"error: -o {out}: directory {disk / 'a'} is not writable (the disk is full "
            "(ENOSPC)); choose another path\n"
        )
