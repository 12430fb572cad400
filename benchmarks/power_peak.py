"""Under a peak cap, how much faster is a plan off the frontier than the frontier's pick?

The bundled GPT-3 A100 profile, 1F1B, 8 stages x 24 microbatches: for each peak cap,
:func:`~perseus.solver.power_peak.fastest_under_peak` with ``method="search"`` against the
frontier's own pick, the peak LP's lower bound (``INTERVALS`` intervals) and the bound it
replaces (the frontier's fastest plan whose average power fits), with the plans timed and the
wall time of the search and its bound.

Usage::

    python benchmarks/power_peak.py [--intervals N] [CAP_W ...]
"""

from __future__ import annotations

import argparse
import time

from perseus.io import default_blocking_power_w, load_profile
from perseus.job import make_job
from perseus.solver import trace_frontier
from perseus.solver.power import fastest_under_power, with_power
from perseus.solver.power_peak import fastest_under_peak

CAPS_W = (3217.0, 3004.0, 2791.0, 2578.0, 2365.0, 2200.0)


def main(caps_w: tuple[float, ...], intervals: int) -> None:
    profile = load_profile("a100")
    job = make_job(profile, "1f1b", 8, 24, blocking_power_w=default_blocking_power_w(profile) or 0)
    frontier = with_power(job, trace_frontier(job))
    peaks = [p.power.peak_power_w for p in frontier.points if p.power is not None]
    print(f"{len(frontier.points)} frontier points, peaks {min(peaks):,.0f}-{max(peaks):,.0f} W")
    print("| peak cap W | frontier pick s | best plan found s | vs frontier pick | LP bound s | gap to bound | average-power bound s | plans timed | search + bound s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for cap_w in caps_w:
        started = time.perf_counter()
        found = fastest_under_peak(
            job, frontier.points, cap_w, method="search", bound_intervals=intervals
        )
        took_s = time.perf_counter() - started
        pick = found.frontier_time_s
        pick_text = "none fits" if pick is None else f"{pick:.4f}"
        vs = "" if pick is None else f"{100 * (found.point.time_s / pick - 1):+.2f} %"
        average_s = fastest_under_power(frontier.points, cap_w).time_s
        print(
            f"| {cap_w:,.0f} | {pick_text} | {found.point.time_s:.4f} | {vs} | "
            f"{found.bound_time_s:.4f} | {100 * found.gap:.2f} % | {average_s:.4f} | "
            f"{found.evaluated:,} | {took_s:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=64, help="intervals of the peak LP")
    parser.add_argument("caps_w", nargs="*", type=float, help="peak caps in W")
    args = parser.parse_args()
    main(tuple(args.caps_w) or CAPS_W, args.intervals)
