"""How fast and how close to optimal is the fleet planner on 1,000 jobs?

Builds 1,000 jobs from the bundled profiles (A100 and A40, 2-4 stages, 4-8 microbatches; weights
0.5-5; one, two or four pipelines each), then plans them at budgets from the fleet's all-max
power down to its minimum-energy power. Prints per budget: the planner's wall time (median of
``--repeats``), its weighted slowdown against the LP bound, the greedy's, and (``--exact``)
HiGHS's exact MILP optimum and time.

    python benchmarks/fleet.py [--jobs 1000] [--repeats 3] [--exact]

With ``--db URL`` (a PostgreSQL or SQLite database of its own: it writes tables there) it
measures the shared store instead: with ``--registered`` (10,000) recurring jobs and fleet
members in the database, the latency of a recurring-job decision (``begin_run``) and of a cap
lookup (``FleetRegistry.assignment``), p50/p99 over a few hundred random jobs; the planner's
re-solve over every member; then ``--writers`` (64) processes deciding and finishing runs at
once, counting what was lost or doubled.

    python benchmarks/fleet.py --db postgresql://USER@HOST:PORT/DB [--registered 10000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter
from pathlib import Path

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


_WRITER = """
import sys
from perseus.recurring.database import open_store
from perseus.recurring.policy import Decision, Observation
url, tag, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = open_store(url, busy_timeout_s=120)
for i in range(runs):
    job = f"w{(tag + i) % 8}"
    started = store.begin_run(job, lambda h, p: Decision(64, "default", None))
    assert store.finish_run(started.run_id, Observation(64, 150.0, 1.0, 1.0, 1.0, True))
    print(started.run_id, flush=True)
store.close()
"""


def _percentiles(samples: list[float]) -> str:
    ms = np.asarray(samples) * 1e3
    return f"p50 {np.percentile(ms, 50):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms"


def database(url: str, registered: int, writers: int) -> None:
    """Latency of a decision and a cap lookup among ``registered`` jobs; concurrent writers."""
    import os
    import subprocess
    import sys

    from perseus.fleet.registry import FleetRegistry
    from perseus.recurring.database import open_store
    from perseus.recurring.policy import Decision, Observation

    jobs = build_jobs(registered)
    store = open_store(url)
    rng = random.Random(1)
    with store._write() as con:  # bulk set-up: a job row and three finished runs each
        for k in range(registered):
            store._x(
                con,
                "INSERT INTO jobs (job, config, created_s) VALUES (?, ?, 0.0) "
                "ON CONFLICT DO NOTHING",
                (f"r{k}", '{"batch_sizes": [32, 64, 128]}'),
            )
            for i, b in enumerate((32, 64, 128)):
                store._x(
                    con,
                    "INSERT INTO runs (run_id, job, status, phase, batch_size, energy_j, "
                    "time_s, cost, reached, started_s, finished_s) VALUES "
                    "(?, ?, 'done', 'explore', ?, 1.0, 1.0, ?, 1, 0.0, 1.0)",
                    (f"r{k}-{i}", f"r{k}", b, 1.0 + rng.random()),
                )
    fleet = FleetRegistry(url)
    for j in jobs:
        fleet.register(j, lease_s=3600.0)
    fleet.set_budget(0.8 * sum(j.average_power_w[0] for j in jobs))
    start = time.perf_counter()
    fleet.replan()
    replan_s = time.perf_counter() - start
    decisions, lookups = [], []
    for _ in range(300):
        job = f"r{rng.randrange(registered)}"
        start = time.perf_counter()
        run = store.begin_run(job, lambda h, p: Decision(64, "thompson", None))
        decisions.append(time.perf_counter() - start)
        store.finish_run(run.run_id, Observation(64, 150.0, 1.0, 1.0, 1.0, True))
        start = time.perf_counter()
        fleet.assignment(f"job{rng.randrange(registered)}")
        lookups.append(time.perf_counter() - start)
    print(f"{registered} recurring jobs and {registered} fleet members in {url.split('@')[-1]}")
    print(f"recurring decision (begin_run): {_percentiles(decisions)}")
    print(f"cap lookup (assignment):        {_percentiles(lookups)}")
    print(f"re-solve over {registered} members: {replan_s:.2f} s (planner and writes)")
    for k in range(8):
        store.register_job(f"w{k}", {"batch_sizes": [64]})
    runs = 10
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, url, str(k), str(runs)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(writers)
    ]
    ids = [line for p in procs for line in p.communicate()[0].split()]
    failed = sum(1 for p in procs if p.returncode != 0)
    wall_s = time.perf_counter() - start
    rows = [r for k in range(8) for r in store.runs(f"w{k}")]
    done = sorted(r["run_id"] for r in rows if r["status"] == "done")
    print(
        f"{writers} writers x {runs} runs in {wall_s:.1f} s: {len(ids)} acknowledged, "
        f"{len(done)} stored done, {len(set(done))} distinct, lost "
        f"{len(set(ids) - set(done))}, doubled {len(done) - len(set(done))}, failed writers "
        f"{failed}"
    )
    fleet.close()
    store.close()


def replay(out: str) -> None:
    """Three jobs through a day of the planner on virtual time, drawn as ``out`` (PNG)."""
    import tempfile

    from perseus.device.clock import VirtualClock
    from perseus.fleet.registry import FleetRegistry
    from perseus.report.fleet import plot_fleet
    from perseus.solver.fleet import FleetJob

    pool = build_jobs(8)
    jobs = [
        FleetJob(name, 1.0 + k, j.points, j.time_s, j.average_power_w, j.peak_power_w)
        for k, (name, j) in enumerate(
            zip(("A", "B", "C"), (pool[0], pool[3], pool[5]), strict=True)
        )
    ]
    all_max_w = sum(j.average_power_w[0] for j in jobs)
    least_w = sum(min(j.average_power_w) for j in jobs)
    clock = VirtualClock()
    with (
        tempfile.TemporaryDirectory() as tmp,
        FleetRegistry(f"sqlite:///{tmp}/fleet.sqlite", clock=clock) as fleet,
    ):
        for j in jobs:
            fleet.register(j, lease_s=20.0)
        budgets = {0: all_max_w, 30: least_w + 0.35 * (all_max_w - least_w), 120: 0.9 * all_max_w}
        for t in range(0, 155, 5):
            clock.advance(t - clock.now())
            if t in budgets:
                fleet.set_budget(budgets[t])
            for j in jobs:
                if j.name != "C" or t < 60:  # C is killed at 60 s: its lease ends at 80 s
                    fleet.heartbeat(j.name)
            fleet.replan()
        events = fleet.timeline()
    Path(out).write_bytes(
        plot_fleet(events, 150.0, title="budget lowered at 30 s, C killed at 60 s, raised at 120 s")
    )
    print(f"wrote {out}: {len(events)} plans")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exact", action="store_true", help="also solve the exact MILP")
    ap.add_argument("--db", help="measure the shared store in this database instead")
    ap.add_argument("--registered", type=int, default=10_000)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--plot", metavar="PNG", help="replay three jobs on virtual time and draw it")
    args = ap.parse_args()
    if args.plot:
        replay(args.plot)
        return
    if args.db:
        database(args.db, args.registered, args.writers)
        return
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
        bound = plan.lp_bound

        def gap(value: float, bound: float = bound) -> str:
            return f"{value / bound - 1:+.2e}" if bound > 0 else "0"

        line = (
            f"{f:6.3f}  {statistics.median(times):7.3f}  {plan.weighted_slowdown:17.6f}  "
            f"{gap(plan.weighted_slowdown):>11}  {gap(greedy.weighted_slowdown):>12}"
        )
        if args.exact:
            start = time.perf_counter()
            opt = exact(jobs, budget_w)
            line += f"  {gap(plan.weighted_slowdown, opt):>8}  {time.perf_counter() - start:7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
