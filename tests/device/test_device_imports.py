"""The device and runtime packages load neither torch nor pynvml at import time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "module",
    ["perseus.device", "perseus.device.nvml", "perseus.device.discovery", "perseus.runtime"],
)
def test_no_heavy_imports(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "print(','.join(m for m in ('torch', 'pynvml', 'matplotlib') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_sim_state_is_standalone() -> None:
    """The watchdog loads sim_state by path: it must not import perseus."""
    path = Path(__file__).resolve().parents[2] / "perseus" / "device" / "sim_state.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(','.join(k for k in sys.modules if k.startswith('perseus')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == ""
