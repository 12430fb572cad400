from __future__ import annotations

import subprocess
import sys


def test_solver_imports_no_heavy_or_io_modules():
    code = (
        "import sys, perseus.solver, perseus.solver.check.milp, perseus.solver.lp_bound; "
        "bad = [m for m in ('torch', 'pynvml', 'matplotlib', 'tqdm', 'perseus.io', 'perseus.cli') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_default_solve_stays_off_the_test_oracles():
    code = (
        "import sys; from perseus.io import load_profile; from perseus.job import make_job; "
        "from perseus.solver import trace; "
        "trace(make_job(load_profile('a100'), '1f1b', 8, 2, 83.64)); "
        "print([m for m in sys.modules if m.startswith('perseus.solver.check')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
