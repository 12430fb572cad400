"""The runnable CPU example: a recurring job on a simulated GPU, re-run three times."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_recurring_example_runs_and_keeps_history(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        str(REPO / "examples" / "recurring_train.py"),
        "--runs",
        "3",
        "--db",
        str(db),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert "(default )" in lines[0] and "limit" in lines[0]
    # The first run profiled the power limit; the next runs of other sizes explore.
    assert any("explore" in line for line in lines[1:])
    from perseus.recurring.store import SQLiteStore

    store = SQLiteStore(db)
    assert len(store.runs("mlp-example")) == 3
    assert store.cached_power_limit_w("mlp-example", "Simulated NVIDIA A40", 128) is not None
