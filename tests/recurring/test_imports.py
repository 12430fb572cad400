"""The pure parts of perseus.recurring load no I/O, device, torch or plotting modules."""

from __future__ import annotations

import subprocess
import sys


def test_pure_parts_import_no_io() -> None:
    code = (
        "import sys\n"
        "import perseus.recurring, perseus.recurring.simulator, perseus.recurring.results\n"
        "bad = [m for m in ('sqlite3', 'torch', 'matplotlib', 'pynvml', 'perseus.device',"
        " 'perseus.io', 'perseus.runtime') if m in sys.modules]\n"
        "print(bad)\n"
        "from perseus.recurring import SQLiteStore, RecurringJob\n"
        "print(SQLiteStore.__name__, RecurringJob.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "SQLiteStore RecurringJob"]
