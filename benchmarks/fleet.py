"""How fast and how close to optimal is the fleet planner on 1,000 jobs?

Builds 1,000 jobs from the bundled profiles (A100 and A40, 2-4 stages, 4-8 microbatches; weights
0.5-5; one, two or four pipelines each), then plans them at budgets from the fleet's all-max
power down to its minimum-energy power. Prints per budget: the planner's wall time (median of
``--repeats``), its weighted slowdown against the LP bound, the greedy's, and (``--exact``)
HiGHS's exact MILP optimum and time.

    python benchmarks/fleet.py [--jobs 1000] [--repeats 3] [--exact]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter

import numpy as np

from perseus.io import load_profile
from perseus.job import make_job
from perseus.runtime.emulation import take_stages
from perseus.solver import trace
from perseus.solver.fleet import FleetJob, fleet_job, plan_fleet
from perseus.solver.power import with_power


def build_jobs(n: int, seed: int = 0) -> list[FleetJob]:
    frontiers = []
    for name in ("a100", "a40"):
        for stages, microbatches in ((2, 4), (2, 8), (3, 6), (4, 4)):
            job = make_job(
                take_stages(load_profile(name), stages), "1f1b", stages, microbatches,
                blocking_power_w=83.64,
            )  # fmt: skip
            frontiers.append(with_power(job, trace(job, min_gap_fraction=0.005).frontier))
    rng = random.Random(seed)
    return [
        fleet_job(
            f"job{k}",
            f := frontiers[k % len(frontiers)],
            weight=rng.choice([0.5, 1.0, 2.0, 5.0]),
            gpus=f.job.ranks * rng.choice([1, 2, 4]),
        )
        for k in range(n)
    ]


def exact(jobs: list[FleetJob], budget_w: float) -> float:
    """HiGHS on the MILP, identical jobs merged into integer counts."""
    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import csr_array

    kinds = Counter((j.time_s, j.average_power_w, j.weight) for j in jobs)
    cost, power, rows, cols = [], [], [], []
    for row, (times, watts, weight) in enumerate(kinds):
        for t, w in zip(times, watts, strict=True):
            rows.append(row)
            cols.append(len(cost))
            cost.append(weight * (t / min(times) - 1))
            power.append(w / budget_w)
    n = len(cost)
    counts = list(kinds.values())
    res = milp(
        np.asarray(cost),
        constraints=[
            LinearConstraint(csr_array((np.ones(n), (rows, cols))), counts, counts),
            LinearConstraint(np.asarray(power)[None, :], -np.inf, 1.0),
        ],
        integrality=np.ones(n),
        bounds=(0, np.inf),
        options={"mip_rel_gap": 1e-6},
    )
    return float(res.fun)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exact", action="store_true", help="also solve the exact MILP")
    args = ap.parse_args()
    jobs = build_jobs(args.jobs)
    all_max_w = sum(j.average_power_w[0] for j in jobs)
    min_energy_w = sum(
        min(zip(j.time_s, j.average_power_w, strict=True), key=lambda tp: tp[0] * tp[1])[1]
        for j in jobs
    )
    points = sum(len(j.points) for j in jobs)
    print(f"{len(jobs)} jobs, {points} points; all-max {all_max_w / 1e3:.1f} kW, "
          f"min-energy {min_energy_w / 1e3:.1f} kW")  # fmt: skip
    head = "budget   plan_s  weighted_slowdown  vs_LP_bound  greedy_vs_LP"
    print(head + ("  exact_vs  exact_s" if args.exact else ""))
    for f in (1.0, 0.999, 0.99, 0.95, 0.8, 0.5, 0.2, 0.0):
        budget_w = min_energy_w + f * (all_max_w - min_energy_w)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            plan = plan_fleet(jobs, budget_w)
            times.append(time.perf_counter() - start)
        greedy = plan_fleet(jobs, budget_w, method="greedy")
        bound = max(plan.lp_bound, 1e-12)
        line = (
            f"{f:6.3f}  {statistics.median(times):7.3f}  {plan.weighted_slowdown:17.6f}  "
            f"{plan.weighted_slowdown / bound - 1:+10.2e}  {greedy.weighted_slowdown / bound - 1:+12.2e}"
        )
        if args.exact:
            start = time.perf_counter()
            opt = exact(jobs, budget_w)
            line += f"  {plan.weighted_slowdown / max(opt, 1e-12) - 1:+8.1e}  {time.perf_counter() - start:7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
