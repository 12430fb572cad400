"""How fast and how good is perseus's frontier tracer, against lowtime on the same input?

For each case (1F1B), in a fresh subprocess so peak RSS is per case, this prints perseus's
solve time, min-cut iterations, points and peak RSS, and the gap of its no-slowdown plan to the
LP floor (up to 16×64; HiGHS takes minutes beyond). Then the whole process: `perseus frontier`
on the case's profile file in a fresh interpreter (wall and CPU seconds, best of two), and
where one such process spends its time: start-up, imports, reading the profile and building
the job, the solve (including loading numba's cached kernels), writing the frontier file, and
its peak memory. When ``lowtime`` is installed (``pip install perseus-energy[bench]``) and the case is
not too big for it, it also runs lowtime 0.3.0 (1 ms quanta, exponential cost model fitted to
the same options, effective energy e − P·t, the way Perseus drives it) on the same DAG in the
same run, evaluates every lowtime plan exactly, and reports the time ratio and whether, for
every lowtime plan, perseus (``--all-points``, since lowtime keeps one plan per quantum) has a
point at least as fast with energy no higher ("covered"; "worst" is the largest excess).

Cases: synthetic A100-model profiles (``_synthetic.py``, fixed seeds) at 4×8, 8×32, 8×64,
16×64, 16×128, 32×256 and 32×512, and the bundled GPT-3 175B A100 profile at 8×96. lowtime at 16×64 takes
about 20 minutes, so it is skipped unless ``--lowtime-16x64``; lowtime is never run at 8×96
real or 32×512 (hours). Then the intrinsic-bloat table: on both bundled profiles, the energy of
the cheapest plan no slower than all-max, relative to all-max, at 12/24/48/96 microbatches,
beside the Perseus authors' published planner figures.

Usage::

    python benchmarks/frontier.py                      # everything (about 50 min on 2 cores, most of it lowtime)
    python benchmarks/frontier.py --cases 4x8,8x32     # some cases
    python benchmarks/frontier.py --no-lowtime --no-savings
    python benchmarks/frontier.py --lowtime-cache DIR  # lowtime once per case, then reused

lowtime at 8×64 took 40 minutes on the 2-core dev VM, so a case may run for up to an hour
(``--case-timeout-s``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import SYNTHETIC_BLOCKING_POWER_W, synthetic_profile

from perseus.dag.evaluate import evaluate_many
from perseus.dag.graph import KIND_CODES
from perseus.io import load_profile
from perseus.io.profile_files import write_profile_csv
from perseus.job import PlanningJob, make_job
from perseus.schedule import Kind
from perseus.solver import trace
from perseus.solver.lp_bound import lp_energy_floor_j

CASES = ("4x8", "8x32", "8x64", "16x64", "real-8x96", "16x128", "32x256", "32x512")
LOWTIME_DEFAULT = {"4x8", "8x32", "8x64"}
AUTHORS = {  # The Perseus authors' planner predictions of the intrinsic-bloat saving (%).
    "a100": {12: 15.2, 24: 14.2, 48: 13.6, 96: 13.3},
    "a40": {12: 11.8, 24: 10.2, 48: 9.3, 96: 8.9},
}
POWER = {"a100": 83.64, "a40": 70.38}


def _job(case: str) -> PlanningJob:
    if case.startswith("real-"):
        stages, micro = (int(x) for x in case[5:].split("x"))
        return make_job(load_profile("a100"), "1f1b", stages, micro, blocking_power_w=POWER["a100"])
    stages, micro = (int(x) for x in case.split("x"))
    profile = synthetic_profile(stages, seed=stages)
    return make_job(profile, "1f1b", stages, micro, blocking_power_w=SYNTHETIC_BLOCKING_POWER_W)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_lowtime(job: PlanningJob, unit_time_s: float) -> tuple[float, np.ndarray, np.ndarray]:
    """lowtime's solve time and, per iteration, its predicted time and its plan's clocks."""
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.operation import (
        CandidateExecutionOptions,
        DummyOperation,
        ExecutionOption,
        Operation,
        OperationSpec,
    )
    from lowtime.solver import PhillipsDessouky

    g = job.graph
    power = job.blocking_power_w
    kinds = list(Kind)
    specs: dict[tuple[int, int], OperationSpec[int]] = {}
    dag = nx.DiGraph()
    for i, (s, k) in enumerate(zip(g.stage.tolist(), g.kind.tolist(), strict=True)):
        if (s, k) not in specs:
            opts = job.profile.op(s, kinds[k]).options
            cand = CandidateExecutionOptions[int](
                options=[
                    ExecutionOption[int](
                        real_time=o.time_s,
                        unit_time=unit_time_s,
                        cost=o.energy_j - power * o.time_s,
                        knob=o.freq_mhz,
                    )
                    for o in opts
                ]
            )
            specs[(s, k)] = OperationSpec[int](options=cand, cost_model=ExponentialModel(cand))
        dag.add_node(i, op=Operation(spec=specs[(s, k)]))
    dag.add_edges_from(zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True))
    n = g.num_nodes
    src, snk = n, n + 1
    dag.add_node(src, op=DummyOperation())
    dag.add_node(snk, op=DummyOperation())
    for i in range(n):
        if dag.in_degree(i) == 0:
            dag.add_edge(src, i)
        if dag.out_degree(i) == 0:
            dag.add_edge(i, snk)
    dag.graph["source_node"] = src
    dag.graph["sink_node"] = snk
    solver = PhillipsDessouky(dag)
    plans, times = [], []
    started = time.perf_counter()
    for result in solver.run():
        times.append(result.real_time)
        plans.append([dag.nodes[i]["op"].assigned_knob for i in range(n)])
    elapsed = time.perf_counter() - started
    return elapsed, np.array(times), np.array(plans, dtype=np.int64)


def _evaluate_plans(job: PlanningJob, plans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    g = job.graph
    table: dict[tuple[int, int, int], tuple[float, float]] = {}
    for (s, k), op in job.profile.ops.items():
        for o in op.options:
            table[(s, KIND_CODES[k], o.freq_mhz)] = (o.time_s, o.energy_j)
    stage, kind = g.stage.tolist(), g.kind.tolist()
    t = np.empty(plans.shape)
    e = np.empty(plans.shape)
    for r, row in enumerate(plans.tolist()):
        for i, f in enumerate(row):
            t[r, i], e[r, i] = table[(stage[i], kind[i], f)]
    times, energies = [], []
    for lo in range(0, len(plans), 256):
        a, b = evaluate_many(g, t[lo : lo + 256], e[lo : lo + 256], job.blocking_power_w)
        times.append(a)
        energies.append(b)
    return np.concatenate(times), np.concatenate(energies)


def _lowtime_plans(job: PlanningJob, case: str, cache: Path | None) -> tuple[float, np.ndarray]:
    """lowtime's solve time and plans, from ``cache`` when it holds this case's run.

    lowtime takes minutes (hours beyond 8×64); a cache lets perseus be re-measured against the
    same lowtime run. The cached time is the one measured when the cache was written.
    """
    path = None if cache is None else cache / f"lowtime-{case}.npz"
    if path is not None and path.exists():
        data = np.load(path)
        return float(data["solve_s"]), data["plans"]
    lt_s, _, plans = _run_lowtime(job, 1e-3)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, solve_s=lt_s, plans=plans)
    return lt_s, plans


def run_case(
    case: str, with_lowtime: bool, lp: bool, cache: Path | None = None
) -> dict[str, object]:
    """Solve one case (called in a subprocess) and return its figures."""
    job = _job(case)
    started = time.perf_counter()
    result = trace(job)
    solve_s = time.perf_counter() - started
    started = time.perf_counter()
    trace(job)  # in-process, kernels already loaded
    warm_s = time.perf_counter() - started
    frontier = result.frontier
    base = frontier.baseline
    same = frontier.cheapest_within(base.time_s)
    out: dict[str, object] = {
        "case": case,
        "ops": job.graph.num_nodes,
        "solve_s": solve_s,
        "warm_s": warm_s,
        "iterations": result.iterations,
        "points": len(frontier.points),
        "rss_mb": _peak_rss_mb(),
        "saving_pct": 100 * (1 - same.energy_j / base.energy_j),
        "lp_floor_gap_pct": None,
        "stop_reason": result.stop_reason,
    }
    if lp:
        floor = lp_energy_floor_j(job, base.time_s)
        out["lp_floor_gap_pct"] = 100 * (same.energy_j / floor - 1)
    if with_lowtime:
        lt_s, plans = _lowtime_plans(job, case, cache)
        times, energies = _evaluate_plans(job, plans)
        # lowtime keeps one plan per quantum; compare against perseus's unthinned Pareto set.
        full = trace(job, all_points=True).frontier
        ts = np.array([p.time_s for p in full.points])
        es = np.array([p.energy_j for p in full.points])
        dominated = 0
        worst = -np.inf
        for t, e in zip(times, energies, strict=True):
            ok = ts <= t * (1 + 1e-12)
            ours = es[ok].min() if ok.any() else np.inf
            dominated += bool(ours <= e)
            worst = max(worst, 100 * (ours / e - 1))
        out.update(
            lowtime_s=lt_s,
            ratio=lt_s / solve_s,
            warm_ratio=lt_s / warm_s,
            lowtime_plans=len(times),
            covered=dominated,
            worst_vs_lowtime_pct=float(worst),
            lowtime_fastest_vs_allmax_pct=float(100 * (times.min() / base.time_s - 1)),
        )
    out["rss_mb"] = _peak_rss_mb()
    return out


# One fresh process doing what `perseus frontier` does, timing each step: the imports, reading
# the profile and building the job, the solve (which loads numba's cached kernels), and writing
# the frontier file (with its power figures, as the CLI writes it).
_PHASES = """
import json, resource, sys, time
t0 = time.perf_counter()
from perseus.io import load_profile
from perseus.io.profile_files import write_profile_csv
from perseus.io.frontier_files import write_frontier
from perseus.job import make_job
from perseus.solver import trace
from perseus.solver.power import with_power
t1 = time.perf_counter()
path, stages, micro, power, out = sys.argv[1:]
job = make_job(load_profile(path), "1f1b", int(stages), int(micro), blocking_power_w=float(power))
t2 = time.perf_counter()
frontier = trace(job).frontier
t3 = time.perf_counter()
write_frontier(with_power(job, frontier), out)
t4 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "solve_s": t3 - t2,
                  "write_s": t4 - t3, "rss_mb": rss}))
"""


def _profile_args(case: str, folder: Path) -> tuple[str, int, int, float]:
    """The profile (a path or a bundled name), stages, microbatches and blocking power of a
    case, as `perseus frontier` takes them (synthetic profiles are written to ``folder``)."""
    if case.startswith("real-"):
        stages, micro = (int(x) for x in case[5:].split("x"))
        return "a100", stages, micro, POWER["a100"]
    stages, micro = (int(x) for x in case.split("x"))
    path = folder / f"synthetic-{stages}.csv"
    if not path.exists():
        write_profile_csv(synthetic_profile(stages, seed=stages), path)
    return str(path), stages, micro, SYNTHETIC_BLOCKING_POWER_W


def whole_process(case: str, folder: Path, repeats: int = 2) -> dict[str, float]:
    """`perseus frontier` on ``case`` as a fresh process (best of ``repeats``: wall and CPU
    seconds), and one fresh process's split into imports, read, solve and write."""
    profile, stages, micro, power = _profile_args(case, folder)
    out = folder / f"frontier-{case}.json"
    cli = [sys.executable, "-m", "perseus.cli", "frontier", profile, "--stages", str(stages)]
    cli += ["--microbatches", str(micro), "--blocking-power-w", str(power)]
    cli += ["--no-progress", "-o", str(out)]
    wall_s = cpu_s = float("inf")
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(cli, capture_output=True, check=True)
        wall_s = min(wall_s, time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        cpu_s = min(cpu_s, cpu)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _PHASES, profile, str(stages), str(micro), str(power), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    phases: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    # Start-up: the interpreter and everything before the imports timed inside the process.
    steps = phases["import_s"] + phases["read_s"] + phases["solve_s"] + phases["write_s"]
    phases["startup_s"] = time.perf_counter() - started - steps
    return {"wall_s": wall_s, "cpu_s": cpu_s, **phases}


def savings(profile: str, micro: int) -> tuple[float, float]:
    job = make_job(load_profile(profile), "1f1b", 8, micro, blocking_power_w=POWER[profile])
    started = time.perf_counter()
    f = trace(job).frontier
    elapsed = time.perf_counter() - started
    same = f.cheapest_within(f.baseline.time_s)
    return 100 * (1 - same.energy_j / f.baseline.energy_j), elapsed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {CASES}")
    ap.add_argument("--no-lowtime", action="store_true", help="skip lowtime")
    ap.add_argument(
        "--lowtime-16x64", action="store_true", help="also run lowtime at 16x64 (~20 min)"
    )
    ap.add_argument("--no-savings", action="store_true", help="skip the intrinsic-bloat table")
    ap.add_argument(
        "--case-timeout-s", type=float, default=3600, help="give up on a case after this long"
    )
    ap.add_argument(
        "--lowtime-cache",
        type=Path,
        help="keep lowtime's plans and time per case in this folder and reuse them (its ratio "
        "then compares with the cached run's lowtime time)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--with-lowtime", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lp", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.with_lowtime, args.lp, args.lowtime_cache)))
        return
    try:
        import lowtime  # noqa: F401

        have_lowtime = not args.no_lowtime
    except ImportError:
        have_lowtime = False
        print("lowtime not installed (pip install perseus-energy[bench]); perseus only")
    header = (
        f"{'case':<10} {'ops':>6} {'perseus s':>10} {'iters':>6} {'points':>6} {'RSS MB':>7} "
        f"{'saving %':>8} {'vs LP %':>8} {'lowtime s':>10} {'ratio':>7} {'covered':>13} {'worst %':>8} "
        f"{'process s':>9} {'ratio':>7}"
    )
    # numba compiles the solver's inner loops once and caches them on disk; do it up front so
    # that no case's solve time includes compilation (each case still pays the cache load).
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--one", "2x2"], capture_output=True, check=True)
    print(
        f"warm-up (numba compile or cache load, tiny case): {time.perf_counter() - started:.1f} s"
    )
    with open("/proc/loadavg") as f:
        print(f"load average before the cases: {' '.join(f.read().split()[:3])}")
    print(header)
    for case in args.cases.split(","):
        run_lt = have_lowtime and (
            case in LOWTIME_DEFAULT or (case == "16x64" and args.lowtime_16x64)
        )
        # HiGHS takes minutes beyond 16×64 (2048 ops, 1F1B); skip it there.
        lp = int(np.prod([int(x) for x in case.removeprefix("real-").split("x")])) <= 1024
        cmd = [sys.executable, __file__, "--one", case] + (["--with-lowtime"] if run_lt else [])
        cmd += ["--lp"] if lp else []
        # Whole process: `perseus frontier` in a fresh interpreter (imports, cached kernels,
        # reading the profile, the solve, writing the file), best of two; CPU seconds (user +
        # system) too: unlike wall time they barely depend on load.
        with tempfile.TemporaryDirectory() as tmp:
            whole = whole_process(case, Path(tmp))
        proc_s, proc_cpu_s = whole["wall_s"], whole["cpu_s"]
        if args.lowtime_cache is not None:
            cmd += ["--lowtime-cache", str(args.lowtime_cache)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=args.case_timeout_s
            )
        except subprocess.TimeoutExpired:
            print(f"{case:<10} not finished within {args.case_timeout_s:.0f} s")
            continue
        if proc.returncode != 0:
            print(f"{case:<10} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        lp_gap = f"{r['lp_floor_gap_pct']:.2f}" if r["lp_floor_gap_pct"] is not None else "-"
        lt = (
            f"{r['lowtime_s']:>10.1f} {r['ratio']:>6.0f}x {r['covered']:>6}/{r['lowtime_plans']:<6} "
            f"{r['worst_vs_lowtime_pct']:>8.2f}"
            if "lowtime_s" in r
            else f"{'-':>10} {'-':>7} {'-':>13} {'-':>8}"
        )
        lt += f" {proc_s:>9.2f} " + (
            f"{r['lowtime_s'] / proc_s:>6.0f}x" if "lowtime_s" in r else f"{'-':>7}"
        )
        print(
            f"{case:<10} {r['ops']:>6} {r['solve_s']:>10.2f} {r['iterations']:>6} {r['points']:>6} "
            f"{r['rss_mb']:>7.0f} {r['saving_pct']:>8.2f} {lp_gap:>8} {lt}",
            flush=True,
        )
        print(
            f"{'':<10} in-process after a first solve: {r['warm_s']:.2f} s"
            + (f" ({r['warm_ratio']:.0f}x lowtime)" if "warm_ratio" in r else "")
        )
        print(
            f"{'':<10} whole process: {proc_s:.2f} s wall, {proc_cpu_s:.2f} s CPU"
            + (f" ({r['lowtime_s'] / proc_cpu_s:.0f}x lowtime by CPU)" if "lowtime_s" in r else "")
        )
        print(
            f"{'':<10} where it goes: start-up {whole['startup_s']:.2f} s, imports "
            f"{whole['import_s']:.2f} s, read {whole['read_s']:.2f} s, solve "
            f"{whole['solve_s']:.2f} s, write {whole['write_s']:.2f} s; peak memory "
            f"{whole['rss_mb']:.0f} MB"
        )
        if r.get("stop_reason", "fastest") != "fastest":
            print(f"{'':<10} the walk stopped early: {r['stop_reason']} (frontier incomplete)")
        if "lowtime_fastest_vs_allmax_pct" in r:
            print(
                f"{'':<10} lowtime's fastest plan vs all-max time: {r['lowtime_fastest_vs_allmax_pct']:+.2f} %"
            )
    with open("/proc/loadavg") as f:
        print(f"load average after the cases: {' '.join(f.read().split()[:3])}")
    if args.no_savings:
        return
    print("\nIntrinsic-bloat saving (cheapest plan no slower than all-max, exact), 1F1B, 8 stages")
    print(f"{'profile':<8} {'micro':>5} {'perseus %':>10} {'authors %':>10} {'solve s':>8}")
    for profile in ("a100", "a40"):
        for micro in (12, 24, 48, 96):
            pct, elapsed = savings(profile, micro)
            print(
                f"{profile:<8} {micro:>5} {pct:>10.2f} {AUTHORS[profile][micro]:>10.1f} {elapsed:>8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
