"""Under a peak cap, how much faster is a plan off the frontier than the frontier's pick?

The bundled GPT-3 A100 profile, 1F1B, 8 stages x 24 microbatches: for each peak cap,
:func:`~perseus.solver.power_peak.fastest_under_peak` with ``method="search"`` against the
frontier's own pick and the average-power lower bound, with the plans timed and the wall time.

Usage::

    python benchmarks/power_peak.py [CAP_W ...]
"""

from __future__ import annotations

import sys
import time

from perseus.io import default_blocking_power_w, load_profile
from perseus.job import make_job
from perseus.solver import trace_frontier
from perseus.solver.power import with_power
from perseus.solver.power_peak import fastest_under_peak

CAPS_W = (3217.0, 3004.0, 2791.0, 2578.0, 2365.0, 2200.0)


def main(caps_w: tuple[float, ...]) -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", 8, 24, blocking_power_w=default_blocking_power_w(profile) or 0)
    frontier = with_power(job, trace_frontier(job))
    peaks = [p.power.peak_power_w for p in frontier.points if p.power is not None]
    print(f"{len(frontier.points)} frontier points, peaks {min(peaks):,.0f}-{max(peaks):,.0f} W")
    print("| peak cap W | frontier pick s | best plan found s | vs frontier pick | bound s | gap to bound | plans timed | search s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for cap_w in caps_w:
        started = time.perf_counter()
        found = fastest_under_peak(job, frontier.points, cap_w, method="search")
        took_s = time.perf_counter() - started
        pick = found.frontier_time_s
        pick_text = "none fits" if pick is None else f"{pick:.4f}"
        vs = "" if pick is None else f"{100 * (found.point.time_s / pick - 1):+.2f} %"
        print(
            f"| {cap_w:,.0f} | {pick_text} | {found.point.time_s:.4f} | {vs} | "
            f"{found.bound_time_s:.4f} | {100 * found.gap:.2f} % | {found.evaluated:,} | "
            f"{took_s:.1f} |"
        )


if __name__ == "__main__":
    main(tuple(float(a) for a in sys.argv[1:]) or CAPS_W)
