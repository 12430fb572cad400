"""The optional pieces (figures: matplotlib, progress bars: tqdm) are extras: without them the
CLI says in one line what to install, or carries on with log lines."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli import _progress


def test_a_missing_plot_extra_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    # A fresh interpreter in which matplotlib cannot be imported; the demo loads the report
    # first, so it stops before planning and writes nothing.
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from perseus.cli.main import main\n"
        f"sys.exit(main(['demo', '-o', {str(tmp_path / 'out')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: matplotlib is not installed; `perseus demo` needs it: "
        "pip install 'perseus-energy[plot]'"
    ]
    assert not (tmp_path / "out").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_tqdm_progress_goes_to_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with (
        caplog.at_level(logging.INFO, logger="perseus"),
        _progress.progress_bar("frontier") as update,
    ):
        update(0.5)
    messages = [r.getMessage() for r in caplog.records]
    assert "no progress bar: pip install 'perseus-energy[progress]' (--no-progress: quiet)" in (
        messages
    )
    assert "frontier: 50 %" in messages and "frontier: 100 %" in messages
    assert "%|" not in terminal.getvalue()  # no bar drawn (log lines may reach the terminal)
