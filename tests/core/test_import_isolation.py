"""``import perseus`` and every public name load neither torch, pynvml nor matplotlib.

The import-layer rules (the pure core, nothing imports the CLI, ...) are import-linter
contracts in pyproject.toml, checked by ``lint-imports`` in CI. Those see every import
statement, lazy ones included; whether a third-party package is *loaded* when a module is
imported is a run-time fact, checked here once, in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "pynvml", "matplotlib")

#: Modules a user or the CLI imports before any GPU work starts.
MODULES = (
    "perseus.solver",
    "perseus.schedule",
    "perseus.dag",
    "perseus.plan",
    "perseus.job",
    "perseus.io",
    "perseus.device",
    "perseus.device.nvml",
    "perseus.device.discovery",
    "perseus.runtime",
    "perseus.runtime.straggler.policy",
    "perseus.runtime.straggler.sweep",
    "perseus.recurring",
    "perseus.recurring.replay",
)

_CODE = f"""
import importlib, json, sys
import perseus, perseus.runtime
after_import = [m for m in {HEAVY!r} if m in sys.modules]
missing = [n for n in perseus.__all__ if getattr(perseus, n, None) is None]
missing += ["runtime." + n for n in perseus.runtime.__all__ if getattr(perseus.runtime, n, None) is None]
for name in {MODULES!r}:
    importlib.import_module(name)
print(json.dumps({{
    "after_import": after_import,
    "after_names": [m for m in {HEAVY!r} if m in sys.modules],
    "missing": missing,
}}))
"""


def test_public_names_and_core_modules_load_no_heavy_package() -> None:
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result == {"after_import": [], "after_names": [], "missing": []}
