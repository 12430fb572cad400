"""How long does `perseus demo` take, the first time after install and then warm?

The first run compiles the solver's numba kernels and caches them on disk; later runs load
them. This script runs `perseus demo` as a user would (a fresh process each time) with an empty
numba cache for the first run (``NUMBA_CACHE_DIR`` set to a new temporary folder) and the
filled cache for the warm runs, and prints the wall-clock seconds of each.

    python benchmarks/demo_startup.py [--warm-runs 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run_demo(cache: Path, out: Path) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "perseus.cli", "demo", "--no-progress", "-o", str(out)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "numba-cache"
        cache.mkdir()
        out = Path(tmp) / "report"
        first = _run_demo(cache, out)
        warm = [_run_demo(cache, out) for _ in range(args.warm_runs)]
    load = os.getloadavg()[0]
    print(f"cores: {os.cpu_count()}, load average (1 min) after the runs: {load:.1f}")
    print(f"first run (empty numba cache): {first:.1f} s")
    for i, w in enumerate(warm, 1):
        print(f"warm run {i}:                    {w:.1f} s")
    print(f"first / warm: {first / min(warm):.1f}x")


if __name__ == "__main__":
    main()
