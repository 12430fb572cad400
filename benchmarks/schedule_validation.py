"""How long does checking a schedule take at the input limits (4096 stages)?

Every schedule perseus plans or deploys is checked first (:func:`perseus.schedule.validate_schedule`:
counts, owners and a deadlock check). This times that check in-process on the built-in
schedules at the stage limit with one microbatch (the most ranks) and on a long 1F1B, and, with
``--against REV``, the same check as revision REV wrote it (its ``perseus/schedule/validate.py``
loaded beside this tree's schedule types), interleaved A, B, A, B in one run.

    python benchmarks/schedule_validation.py [--against REV] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from perseus.schedule import Schedule, build_schedule, validate_schedule

REPO = Path(__file__).resolve().parent.parent
CASES = [
    ("1f1b", 4096, 1, 1),
    ("gpipe", 4096, 1, 1),
    ("zb", 4096, 1, 1),
    ("interleaved", 4096, 1, 2),
    ("1f1b", 64, 1024, 1),
]


def _validator_at(rev: str) -> Callable[[Schedule], None]:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:perseus/schedule/validate.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "validate_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("validate_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    check: Callable[[Schedule], None] = module.validate_schedule
    return check


def _time_s(check: Callable[[Schedule], None], schedule: Schedule) -> float:
    started = time.perf_counter()
    check(schedule)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="also time REV's check")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    checks = {"this tree": validate_schedule}
    if args.against:
        checks[args.against] = _validator_at(args.against)
    print("schedule      stages x mb   actions  " + "  ".join(f"{k:>12}" for k in checks))
    for name, stages, microbatches, virtual in CASES:
        schedule = build_schedule(name, stages, microbatches, virtual_stages=virtual)
        times: dict[str, list[float]] = {k: [] for k in checks}
        for _ in range(args.repeats):
            for key, check in checks.items():
                times[key].append(_time_s(check, schedule))
        actions = sum(len(a) for a in schedule.rank_actions)
        cells = "  ".join(f"{statistics.median(t):10.3f} s" for t in times.values())
        print(f"{name:12} {stages:5} x {microbatches:<5} {actions:8}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
