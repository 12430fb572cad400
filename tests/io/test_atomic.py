from __future__ import annotations

import pytest

from perseus.io import atomic_directory, atomic_write_text


def test_atomic_write_replaces_whole(tmp_path):
    path = tmp_path / "a" / "out.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.txt"]


def test_atomic_directory_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "report"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "half.png").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replaces_existing(tmp_path):
    target = tmp_path / "report"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_outputs_get_ordinary_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
        with atomic_directory(tmp_path / "d") as tmp:
            (tmp / "a").write_text("y")
    finally:
        os.umask(mask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
