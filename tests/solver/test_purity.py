from __future__ import annotations

import subprocess
import sys


def test_solver_imports_no_heavy_or_io_modules():
    code = (
        "import sys, perseus.solver, perseus.solver.exact, perseus.solver.lp_bound; "
        "bad = [m for m in ('torch', 'pynvml', 'matplotlib', 'tqdm', 'perseus.io', 'perseus.cli') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
