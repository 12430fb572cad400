"""The corpus's harness: a case is one broken input; :func:`check` runs it and asserts the
contract of the CLI for bad input (exit 2, one stderr line naming the flag or file and field, no
traceback, nothing written or removed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perseus.cli.main import main

Setup = Callable[[Path, dict[str, Path]], dict[str, str]]


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    mentions: list[str]
    #: Writes the malformed input; returns extra placeholders (e.g. {"bad": path}).
    setup: Setup | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _snapshot(root: Path) -> set[tuple[str, int]]:
    return {
        (str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")
    }


def run_case(case: Case, tmp_path: Path, valid: dict[str, Path], capsys: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    ctx = {k: str(v) for k, v in valid.items()}
    ctx.update(out=str(work / "out.json"), outdir=str(work / "outdir"), tmp=str(work))
    if case.setup is not None:
        ctx.update(case.setup(work, valid))
    before = _snapshot(work)
    argv = [a.format(**ctx) for a in case.argv]
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert rc == 2, f"exit {rc}; stderr: {err!r}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}: {err[:2000]!r}"
    assert len(lines[0]) <= 800, f"stderr line of {len(lines[0])} characters"
    for m in case.mentions:
        assert m.format(**ctx) in lines[0], f"{m.format(**ctx)!r} not in {lines[0]!r}"
    assert _snapshot(work) == before, "files were written or removed"


def check(
    case: Case,
    tmp_path: Path,
    valid: dict[str, Path],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run ``case`` in a clean working directory and assert the bad-input contract."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERSEUS_SIM_DIR", str(tmp_path / "sim"))
    monkeypatch.delenv("RANK", raising=False)
    run_case(case, tmp_path, valid, capsys)


def _write_bad(work: Path, name: str, data: str | bytes) -> dict[str, str]:
    p = work / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return {"bad": str(p), "badname": name}
