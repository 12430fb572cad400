"""The planning core never loads torch, pynvml or matplotlib."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "pynvml", "matplotlib")


@pytest.mark.parametrize(
    "module",
    [
        "perseus",
        "perseus.solver",
        "perseus.schedule",
        "perseus.dag",
        "perseus.plan",
        "perseus.job",
        "perseus.io",
    ],
)
def test_core_imports_no_heavy_modules(module):
    code = (
        f"import sys, {module}\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""
