"""How long do ``plan schedule`` and a re-plan take, on a week and on a signal at the row limit?

1. A week of hourly prices (the synthetic solar week of the tests, with negative hours) on the
   bundled GPT-3 A100 frontier (1F1B, 8 stages x 16 microbatches): the schedule, then a
   re-plan at the start of every hour from the cached frontier with "realised" values (the
   forecast times a seeded ±20 % error), as a running job does when the market settles
   (:class:`~perseus.runtime.power.replan.Replanner`: the LP, then the schedule document the
   boundary hook follows).
2. ``perseus plan schedule`` on a 1,000,000-row per-minute signal (the documented limit), in a
   child process: wall time and peak memory (``ru_maxrss`` of the child).

Usage::

    python benchmarks/power_schedule.py
"""

from __future__ import annotations

import math
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perseus.io import default_blocking_power_w, load_profile
from perseus.io.frontier_files import write_frontier
from perseus.io.power_files import read_signal, schedule_document
from perseus.job import make_job
from perseus.runtime.power.replan import Replanner
from perseus.solver import trace_frontier
from perseus.solver.power import with_power
from perseus.solver.power_schedule import schedule_plans

WEEK = (
    Path(__file__).parents[1]
    / "tests"
    / "solver"
    / "signals"
    / "de_lu_2023-06-27_negative_prices.csv"
)


def main() -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", 8, 16, blocking_power_w=default_blocking_power_w(profile) or 0)
    frontier = with_power(job, trace_frontier(job))
    points = frontier.points
    signal = read_signal(WEEK)
    starts, forecast = signal.starts_s, signal.series[0].values_per_kwh
    deadline, n, idle_w = 168 * 3600.0, 100_000, 60.0 * 8
    started = time.perf_counter()
    plan = schedule_plans(
        points, starts, forecast, iterations=n, deadline_s=deadline, idle_power_w=idle_w
    )
    print(
        f"week: {len(points)} frontier points, 168 hourly intervals, N={n}: schedule in {time.perf_counter() - started:.3f} s"
    )
    rng = random.Random(0)
    # An additive error (up to 20 % of the mean price): a zero hour's realised value differs too.
    scale = 0.2 * float(np.abs(forecast).mean())
    realised = forecast + np.array([scale * rng.uniform(-1, 1) for _ in forecast])
    # What the running job does at each hour: the re-planner's LP from the cached frontier,
    # then the schedule document the hook follows.
    replanner = Replanner(frontier, schedule_document(plan, frontier), starts, forecast,
                          lambda k: float(realised[k]))  # fmt: skip
    done, took = 0, []
    for hour in range(167):
        if done >= n:
            break
        t0 = time.perf_counter()
        again = replanner.replan(hour * 3600.0, done)
        assert again is not None
        schedule_document(again, frontier)
        took.append(time.perf_counter() - t0)
        done += int(again.interval_iterations[0])
    print(
        f"re-plan at each hour ({len(took)} re-plans): median {1000 * statistics.median(took):.1f} ms, "
        f"max {1000 * max(took):.1f} ms"
    )
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_frontier(frontier, d / "f.json")
        rows = d / "signal.csv"
        r = random.Random(1)
        with rows.open("w") as f:
            for k in range(1_000_000):
                f.write(
                    f"{60 * k},{80 + 60 * math.sin(2 * math.pi * k / 1440) + r.gauss(0, 10):.2f}\n"
                )
        argv = [sys.executable, "-m", "perseus.cli", "plan", "schedule", str(d / "f.json"), "--signal",
                str(rows), "--iterations", "1000000", "--deadline-s", "60000000", "--idle-power-w",
                "60", "-o", str(d / "s.json")]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        size_mb = (d / "s.json").stat().st_size / 2**20
    print(
        f"1,000,000-row signal, N=1,000,000: plan schedule in {wall:.1f} s, peak memory "
        f"{peak_mb:.0f} MB, schedule file {size_mb:.1f} MB"
    )


if __name__ == "__main__":
    main()
