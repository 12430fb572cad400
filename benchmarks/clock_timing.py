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

Usage: ``python benchmarks/clock_timing.py [--iterations 4] [--time-scale 1]``.
Prints a table; no assertions (the test is tests/runtime/test_clock_timing.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from perseus.device.base import DeviceEvent
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.agent import RankAgent
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
            make_job(profile, schedule_name, stages, microbatches, BLOCKING_W)
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
            clock=time.perf_counter,
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
    return Result(
        timing=timing,
        steady_share=steady[0] / steady[1] if steady[1] else 0.0,
        all_share=all_[0] / all_[1] if all_[1] else 0.0,
        op_time_s=steady[1],
        changes=changes,
        median_set_latency_s=latency,
    )


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


if __name__ == "__main__":
    main()
