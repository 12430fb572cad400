"""Online profiling on the simulated GPU vs the profile it was built from.

Two modes.

``--runs N`` (the check the online profiler is held to): N seeded four-rank 1F1B pipelines on
four simulated A100s sharing one virtual clock (:class:`~perseus.device.clock.VirtualClock`),
so a run is deterministic and takes seconds whatever the machine's load. Each rank runs the
real agent (its clock worker inline), sweep (:class:`ClockSweep`), counter sampler (called
by the virtual clock every sampling period) and energy fit (:class:`SweepWindow`), as
``RankSession`` wires them; the counter is published every 100 ms, per-op time and power
noise, a blocking-power error and a counter gain error are on. Per run it prints the worst
row's energy and time error against the truth (gain x the profile the GPUs charge), and the
saving of the deployed plan against the offline plan's: the plan traced from the online
profile and the plan traced from the true profile, both at the same frontier point, both
priced exactly on the true profile.

    python benchmarks/online_profile.py --runs 20 [--ranks 4] [--point fastest]

Without ``--runs``, the single-rank, real-time run below.

One pipeline rank runs 1F1B through ``RankSession(plan=OnlineProfile(...))`` on a simulated GPU: the
real agent -> controller -> device path, op energy from the energy counter read on a
background thread (published every 100 ms x ``--time-scale``, the ops scaled alike), per-op
noise, a blocking-power error and a counter gain error on. Each profiled row is compared with
the truth (the profile the simulated GPU charges, times the counter gain for energy: a uniform
gain no profiler can see, and one that does not move a plan).

    python benchmarks/online_profile.py [--time-scale 0.1] [--gain 0.95] [--clock-step 2]

Prints the median and max relative error of time and energy per row, the rows, the sweep
steps and windows used, and the error the old per-op counter stamps would have had.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

from perseus.device.clock import REAL_CLOCK, VirtualClock
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.errors import ProfileError
from perseus.io import default_blocking_power_w, load_profile
from perseus.job import make_job
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.profile.model import Profile, build_profile
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import EmulationOverrunWarning, scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.profiling.energy_attribution import OpSpan, SweepWindow
from perseus.runtime.profiling.energy_windows import CounterSampler, sample_period_for
from perseus.runtime.profiling.sweep import ClockSweep, check_fit
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import Schedule, build_schedule
from perseus.schedule.actions import Action
from perseus.schedule.dependencies import action_dependencies
from perseus.solver import trace_frontier


def truth_profile(scale: float, clock_step: int, f_power: float) -> Profile:
    """The bundled A100 stage 0, every ``clock_step``-th clock, F energy times ``f_power``."""
    base = scale_profile(take_stages(load_profile("a100"), 1), scale)
    rows = []
    for (stage, kind), op in base.ops.items():
        for i, o in enumerate(sorted(op.options, key=lambda o: -o.freq_mhz)):
            if i % clock_step == 0:
                e = o.energy_j * (f_power if kind.value == "F" else 1.0)
                rows.append((stage, kind, o.freq_mhz, o.time_s, e))
    return build_profile(rows, source=f"a100 stage 0 x{scale}")


def run(args: argparse.Namespace) -> dict[str, float]:
    truth = truth_profile(args.time_scale, args.clock_step, args.f_power)
    with tempfile.TemporaryDirectory() as state_dir:
        gpu = SimulatedGPU.from_profile(
            truth,
            blocking_power_w=83.64,
            state_dir=state_dir,
            set_latency_s=0.005 * args.time_scale,
            publish_interval_s=0.1 * args.time_scale,
            noise=SimNoise(seed=args.seed, counter_gain=args.gain),
            clock=REAL_CLOCK,
        )
        schedule = build_schedule("1f1b", 1, args.microbatches)
        session = RankSession(
            schedule,
            0,
            gpu=gpu,
            plan=OnlineProfile(min_windows=args.min_windows),
            options=SessionOptions(blocking_power_w=83.64, watchdog=False, handle_signals=False),
        )
        t0 = time.perf_counter()
        with session:
            while session.profiling:
                with session.iteration():
                    for action in schedule.rank_actions[0]:
                        with session.op(action):
                            pass
            agent = session.agent
            assert agent is not None
            records = agent.records.ops
        wall_s = time.perf_counter() - t0
    profiled = session.profiled
    assert profiled is not None
    e_err, t_err = [], []
    print("stage kind  MHz   time err  energy err")
    for (stage, kind), op in sorted(profiled.ops.items(), key=lambda x: x[0][1].value):
        for o in op.options:
            ref = truth.op(stage, kind).at(o.freq_mhz)
            te = o.time_s / ref.time_s - 1
            ee = o.energy_j / (args.gain * ref.energy_j) - 1
            t_err.append(abs(te))
            e_err.append(abs(ee))
            if args.rows:
                print(f"{stage:5d} {kind.value:4s} {o.freq_mhz:5d} {te:+9.2%} {ee:+10.2%}")
    # What the old path would have fed the sweep: per-op counter stamps at the op's clock.
    old = []
    for r in records:
        op = next(v for (s, k), v in truth.ops.items() if k is r.op.kind)
        if r.iteration < len(session.history) and session.history[r.iteration].phase == "profile":
            old.append(abs(r.energy_j / (args.gain * op.at(r.freq_mhz).energy_j) - 1))
    out = {
        "rows": len(e_err),
        "profile_iterations": sum(1 for h in session.history if h.phase == "profile"),
        "wall_s": wall_s,
        "time_median": statistics.median(t_err),
        "time_max": max(t_err),
        "energy_median": statistics.median(e_err),
        "energy_max": max(e_err),
        "old_per_op_energy_median": statistics.median(old),
    }
    return out


# --------------------------------------------------------------------------------------------
# Four ranks on virtual time


def _sweep_plan(schedule: Schedule, profilers: list[ClockSweep]) -> Frontier:
    """Every rank's ops at the clock its sweep measures next (as ``RankSession`` does)."""
    freqs = tuple(
        tuple(profilers[r].clock_for(a.stage_index, a.kind) for a in actions)
        for r, actions in enumerate(schedule.rank_actions)
    )
    spec = JobSpec(
        schedule=schedule.name,
        ranks=schedule.num_ranks,
        stages=schedule.num_stages,
        microbatches=schedule.num_microbatches,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
    )
    return Frontier(
        job=spec,
        stage_ops=schedule.stage_ops(),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
    )


def _launch_iteration(
    schedule: Schedule, agents: list[RankAgent], gpus: list[SimulatedGPU]
) -> None:
    """Launch one iteration on every rank, the hosts running ahead of the devices: an op
    waits on the device for the ops of other ranks it depends on (a receive)."""
    ends: dict[Action, object] = {}
    cursor = [0] * len(agents)
    total = sum(map(len, schedule.rank_actions))
    while len(ends) < total:
        progressed = False
        for r, actions in enumerate(schedule.rank_actions):
            while cursor[r] < len(actions):
                action = actions[cursor[r]]
                deps = action_dependencies(action, schedule.num_stages)
                if any(d not in ends for d in deps if schedule.stage_to_rank[d.stage_index] != r):
                    break
                for d in deps:
                    if schedule.stage_to_rank[d.stage_index] != r:
                        gpus[r].wait_event(ends[d])  # type: ignore[arg-type]
                agent = agents[r]
                with agent.op(action.kind, action.microbatch_index, action.stage_index):
                    gpus[r].launch(action.stage_index, action.kind)
                ends[action] = agent.last_op_end_event
                cursor[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")


def virtual_run(args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One seeded pipeline's sweep on virtual time; errors and savings (see the docstring)."""
    ranks = args.ranks
    truth = take_stages(load_profile("a100"), ranks)
    blocking = default_blocking_power_w(load_profile("a100")) or 83.64
    schedule = build_schedule("1f1b", ranks, args.microbatches)
    clock = VirtualClock(1000.0)
    t_wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as state_dir:
        gpus = [
            SimulatedGPU.from_profile(
                truth,
                blocking_power_w=blocking,
                index=r,
                state_dir=state_dir,
                clock=clock,
                noise=SimNoise(seed=seed, counter_gain=args.gain),
                seed=seed,
            )
            for r in range(ranks)
        ]
        profilers = [
            ClockSweep(
                {(a.stage_index, a.kind) for a in schedule.rank_actions[r]},
                gpus[r].supported_clocks_mhz(),
            )
            for r in range(ranks)
        ]
        steps = []
        for gpu in gpus:
            sampler = CounterSampler(
                gpu.energy_mj, gpu.timeline_now_s, period_s=sample_period_for(gpu)
            )
            clock.call_every(sampler.next_period_s, sampler.sample)
            steps.append(
                SweepWindow(sampler, min_intervals=args.min_windows, idle_power_w=blocking)
            )
        plan = _sweep_plan(schedule, profilers)
        agents = [
            RankAgent(
                plan,
                gpus[r],
                r,
                watchdog=False,
                handle_signals=False,
                measure_op_energy=False,
                clock=clock,
            ).start()
            for r in range(ranks)
        ]
        iterations = 0
        try:
            while not all(p.done for p in profilers):
                for agent in agents:
                    agent.step_begin()
                _launch_iteration(schedule, agents, gpus)
                for agent in agents:
                    agent.step_end()
                iterations += 1
                advanced = False
                for r, agent in enumerate(agents):
                    actions = schedule.rank_actions[r]
                    spans = []
                    for op in agent.records.ops[-len(actions) :]:
                        a = actions[op.index]
                        profilers[r].record(a.stage_index, a.kind, op.time_s)
                        assert op.start_s is not None and op.end_s is not None
                        spans.append(OpSpan((a.stage_index, a.kind), op.start_s, op.end_s))
                    steps[r].add_iteration(spans)
                    if steps[r].ready():
                        fit = steps[r].fit()
                        profilers[r].end_iteration(
                            power_w=None if fit is None else fit.power_w,
                            fit=fit,
                        )
                        steps[r].reset()
                        advanced = True
                if advanced:
                    plan = _sweep_plan(schedule, profilers)
                    for agent in agents:
                        agent.swap_plan(plan)
        finally:
            for agent in agents:
                agent.close()
    rows = [row for p in profilers for row in p.rows()]
    online = build_profile(rows, source="online profile")
    e_err, t_err = [], []
    for (stage, kind), op in online.ops.items():
        for o in op.options:
            ref = truth.op(stage, kind).at(o.freq_mhz)
            t_err.append(abs(o.time_s / ref.time_s - 1))
            e_err.append(abs(o.energy_j / (args.gain * ref.energy_j) - 1))
    refused = ""
    try:
        check_fit(profilers)
    except ProfileError as e:
        refused = str(e)
    # The plans: traced from the truth (offline) and from the online profile (deployed), at
    # the same frontier point, both priced exactly on the truth.
    true_job = make_job(truth, "1f1b", ranks, args.microbatches, blocking_power_w=blocking)
    online_job = make_job(online, "1f1b", ranks, args.microbatches, blocking_power_w=blocking)
    offline_frontier = trace_frontier(true_job)
    online_frontier = trace_frontier(online_job)
    base = offline_frontier.baseline

    def pick(frontier: Frontier) -> PlanPoint:
        if args.point == "fastest":
            return frontier.points[0]
        return min(frontier.points, key=lambda p: p.energy_j)

    offline = true_job.evaluate(true_job.flat(pick(offline_frontier)))
    deployed = true_job.evaluate(true_job.flat(pick(online_frontier)))
    return {
        "seed": seed,
        "rows": len(e_err),
        "iterations": iterations,
        "energy_max": max(e_err),
        "time_max": max(t_err),
        "offline_saving": 1 - offline.energy_j / base.energy_j,
        "deployed_saving": 1 - deployed.energy_j / base.energy_j,
        "deployed_time_vs_offline": deployed.time_s / offline.time_s - 1,
        "virtual_s": clock.now() - 1000.0,
        "wall_s": time.perf_counter() - t_wall,
        "refused": refused,
    }


def main_runs(args: argparse.Namespace) -> None:
    print(
        f"{args.ranks}-rank 1F1B, {args.microbatches} microbatches, bundled A100 profile, "
        f"virtual time, counter every 100 ms, gain {args.gain}, noise on; point {args.point}"
    )
    print(
        "seed  rows  iters  worst row energy  worst row time  offline saving  deployed saving"
        "  diff (points)  virtual s  wall s"
    )
    worst_e = worst_d = 0.0
    for seed in range(args.seed, args.seed + args.runs):
        out = virtual_run(args, seed)
        diff = 100 * (out["deployed_saving"] - out["offline_saving"])
        worst_e = max(worst_e, out["energy_max"])
        worst_d = max(worst_d, abs(diff))
        print(
            f"{seed:4d} {out['rows']:5d} {out['iterations']:6d} {out['energy_max']:17.2%} "
            f"{out['time_max']:15.2%} {out['offline_saving']:15.2%} "
            f"{out['deployed_saving']:16.2%} {diff:+14.2f} {out['virtual_s']:10.1f} "
            f"{out['wall_s']:7.1f}" + (f"  REFUSED: {out['refused']}" if out["refused"] else ""),
            flush=True,
        )
    print(f"worst row energy error over all runs: {worst_e:.2%}")
    print(f"largest |deployed - offline saving|: {worst_d:.2f} points")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--gain", type=float, default=0.95)
    p.add_argument("--clock-step", type=int, default=2, help="profile every N-th clock")
    p.add_argument("--f-power", type=float, default=0.8, help="F energy factor (F != B power)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-windows", type=int, default=20, help="counter windows per sweep step")
    p.add_argument("--rows", action="store_true", help="print every row")
    p.add_argument("--runs", type=int, help="seeded multi-rank runs on virtual time")
    p.add_argument("--ranks", type=int, default=4, help="pipeline ranks (with --runs)")
    p.add_argument("--point", choices=("fastest", "min-energy"), default="fastest")
    args = p.parse_args()
    if args.runs is not None:
        if args.microbatches == 4:
            args.microbatches = 8
        main_runs(args)
        return
    warnings.simplefilter("ignore", EmulationOverrunWarning)
    out = run(args)
    print(
        f"time scale {args.time_scale} (counter every {100 * args.time_scale:g} ms, ops "
        f"{50 * args.time_scale:.3g}-{99 * args.time_scale:.3g} ms), gain {args.gain}, "
        f"F power x{args.f_power}, noise on"
    )
    for k, v in out.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")


if __name__ == "__main__":
    main()
