"""How close do two-clock ops get to the LP limit on the bundled GPT-3 profiles?

For the bundled GPT-3 175B A100 and A40 profiles (1F1B, 8 stages, 12 layers per stage), at
12, 24, 48 and 96 microbatches this prints the exact-evaluated energy saving of the cheapest
plan no slower than all-max, with one clock per op and with two-clock ops (one switch at a
layer boundary, even split, 5 ms set latency during which the old clock keeps running), beside
the LP limit (each op mixing clocks freely, HiGHS), the gap to it, and the number of mid-op
switches per iteration of the two-clock plan. Every figure is the exact evaluator's.

Usage::

    python benchmarks/two_clock.py
    python benchmarks/two_clock.py --micro 12,24 --switch-latency-s 0.012
"""

from __future__ import annotations

import argparse
import time

from perseus.io import load_profile
from perseus.job import make_job
from perseus.solver import trace
from perseus.solver.lp_bound import lp_energy_floor_j

POWER = {"a100": 83.64, "a40": 70.38}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--micro", default="12,24,48,96", help="microbatch counts")
    ap.add_argument("--layers", type=int, default=12, help="layers per stage (GPT-3 175B: 12)")
    ap.add_argument("--switch-latency-s", type=float, default=0.005)
    ap.add_argument("--switch-energy-j", type=float, default=0.0)
    args = ap.parse_args()
    print(
        f"1F1B, 8 stages, {args.layers} layers/stage, switch latency "
        f"{1e3 * args.switch_latency_s:g} ms, switch energy {args.switch_energy_j:g} J"
    )
    print(
        f"{'profile':<7} {'micro':>5} {'one-clock %':>11} {'two-clock %':>11} {'LP limit %':>10} "
        f"{'gap pts':>7} {'switches':>8} {'1-clk s':>7} {'2-clk s':>7}"
    )
    for name in ("a100", "a40"):
        profile = load_profile(name)
        for micro in (int(m) for m in args.micro.split(",")):
            job = make_job(
                profile,
                "1f1b",
                8,
                micro,
                blocking_power_w=POWER[name],
                layers_per_stage=args.layers,
                switch_latency_s=args.switch_latency_s,
                switch_energy_j=args.switch_energy_j,
            )
            row = []
            for clocks in (1, 2):
                started = time.perf_counter()
                frontier = trace(job, max_clocks_per_op=clocks).frontier
                elapsed = time.perf_counter() - started
                base = frontier.baseline
                plan = frontier.cheapest_within(base.time_s)
                assert plan.time_s <= base.time_s  # never slower than all-max
                row.append((100 * (1 - plan.energy_j / base.energy_j), plan, elapsed))
            floor = lp_energy_floor_j(job, base.time_s)
            limit = 100 * (1 - floor / base.energy_j)
            (one, _, one_s), (two, plan, two_s) = row
            print(
                f"{name:<7} {micro:>5} {one:>11.2f} {two:>11.2f} {limit:>10.2f} "
                f"{limit - two:>7.2f} {plan.num_two_clock_ops:>8} {one_s:>7.1f} {two_s:>7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
