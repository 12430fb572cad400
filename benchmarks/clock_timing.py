"""How much op time runs at the wrong clock: host-timed vs device-timed clock control?

CUDA launches are asynchronous: the host runs ahead of the GPU. Host-timed control (perseus
before issue 14: post an op's clock when the host enters the op, the next op's clock when the
host leaves it) therefore sets clocks while the GPU is still busy with earlier ops.
Device-timed control (the default now) records an event on the compute stream at each op
boundary; the controller thread waits for the op's start on the device and issues the next
clock early by the measured set latency.

Setup: a pipeline of simulated A100 GPUs (bundled profile, ``--stages`` stages, 1F1B by
default) run from one host thread that launches every op as soon as its inputs were launched
(like a CUDA host: nothing waits for the device except the end of each iteration). Each
consumer's stream waits on the producer's end event (as NCCL's receive kernel does). One
rank agent per GPU with its own controller thread; set-clock latency lognormal (median 5 ms,
p99 12 ms, scaled with ``--time-scale``); per-op noise on. The plan alternates clocks
(forward at ``--f-mhz``, backward at ``--b-mhz``), so nearly every op boundary changes the
clock: the worst case. The simulated GPUs trace which clock every slice of every op ran at.

Wrong-clock share = op time run at a clock other than the op's planned one / all op time,
over iterations after the first ("steady": device timing learns each op's time in the first
iteration) and over all iterations.

The floor: no controller can know the set call's random latency, so even one that knew every
op's true end and the next op's start would lose E[(end - x)+ + (x - next start)+] per change
at its best fixed lead (landing ``x``): E|L - median L| = 1.57 ms for the notes' lognormal with
no idle gap between the ops, less in a gap. The benchmark prints that floor (expected, for the
notes' distribution; and paired on this run's real issue-to-landing times, which include the
simulator's sleep overshoot and lock waits on a loaded machine), a floor for a controller that
knows each op's noise-free time but not its 1 % jitter draw, and the device-timed excess over
the oracle, split into targeting (lead and aim in the gap), the prediction of op ends and
gaps, the worker being busy, and late wake-ups (the set call issued after its aim).

Usage: ``python benchmarks/clock_timing.py [--iterations 6] [--seeds 3] [--time-scale 1]``.
Prints a table; no assertions (the test is tests/runtime/test_clock_timing.py).
"""

from __future__ import annotations

import argparse
import bisect
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np

from perseus.device.base import DeviceEvent
from perseus.device.clock import REAL_CLOCK
from perseus.device.sim_stream import OpTrace
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.agent.boundary import Boundary
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.schedule import Action, Kind, action_dependencies, build_schedule

BLOCKING_W = 83.64


@dataclass(frozen=True)
class Result:
    timing: str
    steady_share: float
    all_share: float
    op_time_s: float
    changes: int
    median_set_latency_s: float
    parts: dict[str, float] = field(default_factory=dict)


def alternating_plan(schedule_name: str, stages: int, microbatches: int, f_mhz: int, b_mhz: int):  # type: ignore[no-untyped-def]
    """A plan running forwards at ``f_mhz`` and backwards at ``b_mhz`` (no solver needed)."""
    schedule = build_schedule(schedule_name, stages, microbatches)
    freqs = tuple(
        tuple(f_mhz if a.kind is Kind.F else b_mhz for a in actions)
        for actions in schedule.rank_actions
    )
    job = JobSpec(
        schedule=schedule_name,
        ranks=schedule.num_ranks,
        stages=stages,
        microbatches=microbatches,
        blocking_power_w=BLOCKING_W,
        profile_sha256="0" * 64,
    )
    plan = Frontier(
        job=job,
        stage_ops=schedule.stage_ops(),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=freqs),),
    )
    return schedule, plan


def run_pipeline(
    timing: str,
    *,
    schedule_name: str = "1f1b",
    stages: int = 4,
    microbatches: int = 8,
    iterations: int = 3,
    time_scale: float = 1.0,
    f_mhz: int = 1200,
    b_mhz: int = 1005,
    seed: int = 0,
    state_dir: Path | None = None,
    plan_name: str = "alternating",
) -> Result:
    """Run ``iterations`` of the pipeline with ``timing`` control; measure wrong-clock time.

    ``plan_name``: ``alternating`` (forward/backward clocks, the worst case) or ``fastest`` /
    ``min-energy`` (points of the frontier traced for the job: what perseus deploys).
    """
    profile = scale_profile(take_stages(load_profile("a100"), stages), time_scale)
    schedule, plan = alternating_plan(schedule_name, stages, microbatches, f_mhz, b_mhz)
    if plan_name != "alternating":
        from perseus.job import make_job
        from perseus.solver import trace_frontier

        frontier = trace_frontier(
            make_job(profile, schedule_name, stages, microbatches, blocking_power_w=BLOCKING_W)
        )
        point = frontier.points[0] if plan_name == "fastest" else frontier.min_energy
        plan = frontier.model_copy(update={"points": (point,)})
    directory = Path(state_dir or tempfile.mkdtemp(prefix="perseus-clock-timing-"))
    gpus = [
        SimulatedGPU.from_profile(
            profile,
            blocking_power_w=BLOCKING_W,
            index=r,
            state_dir=directory,
            set_latency_s=0.005 * time_scale,
            publish_interval_s=0.1 * time_scale,
            clock=REAL_CLOCK,
            noise=SimNoise(seed=seed),
            seed=seed,
            trace_ops=True,
        )
        for r in range(schedule.num_ranks)
    ]
    agents = [
        RankAgent(plan, gpu, r, watchdog=False, handle_signals=False, timing=timing)
        for r, gpu in enumerate(gpus)
    ]
    for agent in agents:
        agent.start()
    posted: list[list[Boundary]] = [[] for _ in agents]
    landed: list[list[tuple[float, float]]] = [[] for _ in agents]
    for r, gpu in enumerate(gpus):
        gpu._stream.set_lock = _landing(gpu, landed[r])  # type: ignore[method-assign]
    for r, agent in enumerate(agents):
        ctl = agent.controller
        if ctl is not None and timing == "device":
            ctl.post = _recording(ctl.post, posted[r])  # type: ignore[method-assign]
    latency = 0.0
    try:
        for agent in agents:
            agent.wait_for_clock(5.0)
        for _ in range(iterations):
            _iteration(schedule, gpus, agents)
        ctl = agents[0].controller
        latency = ctl.stats().median_set_latency_s if ctl is not None else 0.0
    finally:
        for agent in agents:
            agent.close()
    steady = all_ = (0.0, 0.0)
    changes = 0
    for r, gpu in enumerate(gpus):
        planned = agents[r].planned_clocks_mhz
        n = len(planned)
        changes += sum(planned[j] != planned[j - 1] for j in range(1, n))
        for op in gpu.op_trace:
            want = planned[op.seq % n]
            total = sum(t for _, t in op.pieces)
            wrong = sum(t for c, t in op.pieces if c != want)
            all_ = (all_[0] + wrong, all_[1] + total)
            if op.seq >= n:
                steady = (steady[0] + wrong, steady[1] + total)
    parts: dict[str, float] = {}
    notes_lat = latency_quantiles_s(NOTES_MEDIAN_S * time_scale, NOTES_P99_S * time_scale)
    for r, gpu in enumerate(gpus):
        for key, value in decompose(
            posted[r],
            landed[r],
            gpu.op_trace,
            len(agents[r].planned_clocks_mhz),
            notes_lat,
            _mean_time(gpu, agents[r].planned_clocks_mhz),
            SimNoise().time_sigma,
        ).items():
            parts[key] = parts.get(key, 0.0) + value
    return Result(
        parts=parts,
        timing=timing,
        steady_share=steady[0] / steady[1] if steady[1] else 0.0,
        all_share=all_[0] / all_[1] if all_[1] else 0.0,
        op_time_s=steady[1],
        changes=changes,
        median_set_latency_s=latency,
    )


#: The notes' set latency (gpu-backend.md §5.1): lognormal, median 5 ms, p99 12 ms.
NOTES_MEDIAN_S = 0.005
NOTES_P99_S = 0.012


def latency_quantiles_s(median_s: float, p99_s: float, n: int = 2000) -> np.ndarray:
    """``n`` equally likely set latencies of the lognormal with this median and p99."""
    sigma = math.log(p99_s / median_s) / NormalDist().inv_cdf(0.99)
    z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    return np.asarray(median_s * np.exp(sigma * z))


def wrong_time_s(offset_s: float, latencies_s: np.ndarray, gap_s: float) -> float:
    """Expected wrong-clock time of a change issued ``offset_s`` after the op's end (negative:
    before) when the next op starts ``gap_s`` after it: landing before the end runs the op's
    tail at the next clock, landing after the next op's start runs its head at the old one."""
    x = offset_s + latencies_s
    return float(np.mean(np.maximum(0.0, -x) + np.maximum(0.0, x - gap_s)))


def best_offset_s(latencies_s: np.ndarray, gap_s: float) -> float:
    """The issue offset minimising :func:`wrong_time_s` (known end and gap, random latency):
    where landing before the end is as likely as landing after the next start."""
    lat = np.sort(latencies_s)
    lo, hi = -float(lat[-1]) - 1e-3, gap_s - float(lat[0]) + 1e-3
    n = len(lat)
    for _ in range(60):
        y = 0.5 * (lo + hi)
        early = np.searchsorted(lat, -y, side="left") / n  # P(L < -y)
        late = 1.0 - np.searchsorted(lat, gap_s - y, side="right") / n  # P(L > gap - y)
        if late > early:
            hi = y
        else:
            lo = y
    return 0.5 * (lo + hi)


_Z9 = np.array([NormalDist().inv_cdf((i + 0.5) / 9) for i in range(9)])


def decompose(
    jobs: list[Boundary],
    landed: list[tuple[float, float]],
    trace: list[OpTrace],
    n_ops: int,
    notes_lat_s: np.ndarray,
    mean_time_s: Callable[[OpTrace], float],
    time_sigma: float,
) -> dict[str, float]:
    """Wrong-clock time of every steady clock change on one GPU (s), actual and with each
    source of error taken away, paired on the latency each call really took.

    Keys: ``actual`` (the landing observed), ``no_wake`` (issued when the worker was ready,
    or at its aim if it was ready earlier: no sleep overshoot), ``no_busy`` (issued exactly at
    the aim: neither), ``exact_times`` (our targeting rule, median lead and the middle of the
    gap, given the op's true end and the next op's true start), ``oracle`` (true end and
    start, the best fixed lead for the measured latency distribution), ``oracle_notes``
    (its expected wrong time for the notes' latency distribution, not paired),
    ``oracle_mean`` (knows the op's noise-free time, its start and the gap after it, but not
    its noise draw: the best any controller can do without seeing the future).
    """
    ops = {op.seq: op for op in trace}
    # The set call's return -> when the clock took effect (the simulator applies it before it
    # publishes the new state to its shared file, so a little before the call returns).
    applied = sorted(t for t, _ in landed)
    rows = []
    for k, boundary in enumerate(jobs):
        job = boundary.report
        if k < n_ops or job.issue_s is None or job.return_s is None or job.aim_s is None:
            continue
        op, nxt = ops.get(k), ops.get(k + 1)
        if op is None or nxt is None or job.ready_s is None:
            continue
        expected_s = boundary.request.expected_s
        if expected_s is None:
            continue
        i = bisect.bisect_left(applied, job.issue_s)
        if i == len(applied) or applied[i] > job.return_s:
            continue
        rows.append((op, nxt, job, applied[i], boundary.start.device_time_s(), expected_s))
    if not rows:
        return {}
    measured = np.array([t - job.issue_s for _, _, job, t, _, _ in rows])  # type: ignore[operator]
    out = dict.fromkeys(
        (
            "actual",
            "no_wake",
            "no_busy",
            "exact_times",
            "oracle_mean",
            "oracle",
            "oracle_notes",
            "tail_s",
        ),
        0.0,
    )
    for op, nxt, job, landing, start, expected_s in rows:
        assert job.return_s is not None and job.issue_s is not None and job.aim_s is not None
        assert job.ready_s is not None
        t0, t1, t2, t3 = op.start_s, op.end_s, nxt.start_s, nxt.end_s
        lat = landing - job.issue_s
        out["tail_s"] += job.return_s - landing
        offset = job.aim_s - start - expected_s  # issue time - the predicted end

        def cost(x: float, t0: float = t0, t1: float = t1, t2: float = t2, t3: float = t3) -> float:
            return min(max(0.0, t1 - x), t1 - t0) + min(max(0.0, x - t2), t3 - t2)

        gap = t2 - t1
        out["actual"] += cost(landing)
        out["no_wake"] += cost(max(job.aim_s, job.ready_s) + lat)
        out["no_busy"] += cost(job.aim_s + lat)
        out["exact_times"] += cost(t1 + offset + lat)
        out["oracle"] += cost(t1 + best_offset_s(measured, gap) + lat)
        mean = mean_time_s(op)
        noise = mean * (np.exp(time_sigma * _Z9) - 1.0)  # the op's end - its noise-free end
        spread = (measured[:, None] - noise[None, :]).ravel()
        out["oracle_mean"] += cost(t0 + mean + best_offset_s(spread, gap) + lat)
        y = best_offset_s(notes_lat_s, gap)
        out["oracle_notes"] += wrong_time_s(y, notes_lat_s, gap)
    out["changes"] = float(len(rows))
    out["mean_lat_s"] = float(np.mean(measured))
    out["ranks"] = 1.0
    return out


def _mean_time(gpu: SimulatedGPU, planned: tuple[int, ...]) -> Callable[[OpTrace], float]:
    """An op's noise-free device time at its planned clock (the profile's)."""

    def mean(op: OpTrace) -> float:
        return gpu._cost_fn(op.stage_index, op.kind, planned[op.seq % len(planned)])[0]

    return mean


def _landing(gpu: SimulatedGPU, into: list[tuple[float, float]]):  # type: ignore[no-untyped-def]
    """Wrap the stream's lock change: note (device time it took effect, time it returned)."""
    stream = gpu._stream
    set_lock = stream.set_lock

    def record(lock_mhz: int | None) -> None:
        with stream._lock:
            t = gpu._clock()
            set_lock(lock_mhz)
        into.append((t, gpu._clock()))

    return record


def _recording(post, into: list[Boundary]):  # type: ignore[no-untyped-def]
    def record(job: Boundary) -> None:
        into.append(job)
        post(job)

    return record


def _iteration(schedule, gpus: list[SimulatedGPU], agents: list[RankAgent]) -> None:  # type: ignore[no-untyped-def]
    """Launch every op as soon as its inputs were launched; wait for the devices at the end."""
    for agent in agents:
        agent.step_begin()
    ends: dict[Action, DeviceEvent] = {}
    cursors = [0] * len(gpus)
    remaining = sum(map(len, schedule.rank_actions))
    while remaining:
        progressed = False
        for r, actions in enumerate(schedule.rank_actions):
            while cursors[r] < len(actions):
                action = actions[cursors[r]]
                deps = action_dependencies(action, schedule.num_stages)
                if any(d not in ends for d in deps):
                    break
                gpu = gpus[r]
                for d in deps:
                    gpu.wait_event(ends[d])  # the receive waits on the device, not the host
                with agents[r].op(action.kind, action.microbatch_index, action.stage_index):
                    gpu.launch(action.stage_index, action.kind)
                ends[action] = gpu.record_event()
                cursors[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")  # cannot happen for a valid schedule
    for gpu in gpus:
        gpu.synchronize()  # what a loss.item() or the optimizer step does once per iteration
    for agent in agents:
        agent.step_end()


_FLOOR_ROWS = (
    ("oracle_mean", "floor: knows each op's noise-free time, not its draw"),
    ("oracle", "floor: knows each op's true end (this run's latencies)"),
    ("oracle_notes", "floor: knows each op's true end (notes' latency, expected)"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--plans", default="alternating,fastest,min-energy")
    args = p.parse_args()
    print(
        f"{args.schedule}, {args.stages} simulated A100s, {args.microbatches} microbatches, "
        f"{args.iterations} iterations, time scale {args.time_scale:g} "
        "(set latency lognormal median 5 ms / p99 12 ms, scaled)"
    )
    print(
        "| plan | control | wrong-clock share (steady) | (all iterations) "
        "| clock changes / iteration |"
    )
    print("|---|---|---|---|---|")
    breakdown: list[str] = []
    for plan_name in args.plans.split(","):
        for timing in ("host", "device"):
            results = [
                run_pipeline(
                    timing,
                    schedule_name=args.schedule,
                    stages=args.stages,
                    microbatches=args.microbatches,
                    iterations=args.iterations,
                    time_scale=args.time_scale,
                    seed=seed,
                    plan_name=plan_name,
                )
                for seed in range(args.seeds)
            ]
            steady = sum(r.steady_share for r in results) / len(results)
            all_ = sum(r.all_share for r in results) / len(results)
            name = "host-timed (before)" if timing == "host" else "device-timed (now)"
            print(
                f"| {plan_name} | {name} | {100 * steady:.2f} % | {100 * all_:.2f} % "
                f"| {results[0].changes} |"
            )
            if timing != "device":
                continue

            def share(key: str, results: list[Result] = results) -> float:
                return (
                    100 * sum(r.parts.get(key, 0.0) / r.op_time_s for r in results) / len(results)
                )

            for key, label in _FLOOR_ROWS:
                print(f"| {plan_name} | {label} | {share(key):.2f} % | | |")
            lat = [r.parts.get("mean_lat_s", 0.0) / r.parts.get("ranks", 1.0) for r in results]
            breakdown.append(
                f"| {plan_name} | {share('actual'):.2f} % | {share('oracle'):.2f} % "
                f"| {share('exact_times') - share('oracle'):+.2f} "
                f"| {share('no_busy') - share('exact_times'):+.2f} "
                f"| {share('no_wake') - share('no_busy'):+.2f} "
                f"| {share('actual') - share('no_wake'):+.2f} "
                f"| {1000 * sum(lat) / len(lat):.2f} ms |"
            )
    print()
    print(
        "Device-timed wrong-clock share, steady, decomposed (paired on each call's real "
        "latency; points of op time):"
    )
    print(
        "| plan | ours | oracle (true ends) | + our targeting | + op end / gap prediction "
        "| + worker busy | + late wake-up | mean issue-to-landing |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for line in breakdown:
        print(line)


if __name__ == "__main__":
    main()
