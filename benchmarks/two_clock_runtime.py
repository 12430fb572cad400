"""Two-clock ops at runtime: how close to the planned layer boundary does the second clock land?

Setup: one simulated A100 (bundled profile, stage 0 of a 4-stage cut, 1F1B with
``--microbatches``), asynchronous (the host launches a whole iteration ahead of the device),
per-op noise on, set-clock latency lognormal (median 5 ms, p99 12 ms). Every op is a
two-clock op of ``--layers`` layers: forwards run their first ``--k-fwd`` layers at 1410 MHz
and the rest at 1005 MHz, backwards their first ``--k-bwd`` at 1005 and the rest at 1410, so
every op has a mid-op switch and nearly every op boundary a change too: the worst case. The
agent times the mid-op switch from the profile (``op_time_s``) or, with ``--no-profile``, from
the op's device time in the previous iteration.

Wrong-clock share = (|time at the first clock − planned time of the first layers at that
clock| + time at any third clock) / all op time, over iterations after the first. For
reference the same figure is printed for the two failure modes (switch never issued, switch
issued at op start), computed from the same trace.

Usage: ``python benchmarks/two_clock_runtime.py [--iterations 4] [--no-profile]``.
Prints figures; no assertions (the test is tests/runtime/test_two_clock_runtime.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from perseus.device.clock import REAL_CLOCK
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.plan import Baseline, Frontier, JobSpec, PlanOp, PlanPoint
from perseus.runtime.agent.rank_agent import RankAgent
from perseus.runtime.emulation import take_stages
from perseus.schedule import Kind, build_schedule


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--k-fwd", type=int, default=4)
    p.add_argument("--k-bwd", type=int, default=6)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args()
    if not (0 < args.k_fwd < args.layers and 0 < args.k_bwd < args.layers):
        p.error("--k-fwd and --k-bwd must be at least 1 and below --layers (the switch is inside)")

    profile = take_stages(load_profile("a100"), 4)
    actions = build_schedule("1f1b", 4, args.microbatches).rank_actions[0]
    names = tuple(f"{a.kind.value}{a.microbatch_index}" for a in actions)
    fwd: PlanOp = (1410, 1005, args.k_fwd)
    bwd: PlanOp = (1005, 1410, args.k_bwd)
    ops = tuple(fwd if a.kind is Kind.F else bwd for a in actions)
    spec = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=args.microbatches,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
        layers_per_stage=(args.layers,),
    )
    plan = Frontier(
        job=spec,
        stage_ops=(names,),
        baseline=Baseline(time_s=1.0, energy_j=1.0),
        points=(PlanPoint(time_s=1.0, energy_j=1.0, freqs_mhz=(ops,)),),
    )

    def op_time_s(stage: int, kind: Kind, freq_mhz: int) -> float:
        return profile.op(stage, kind).at(freq_mhz).time_s

    with tempfile.TemporaryDirectory() as tmp:
        gpu = SimulatedGPU.from_profile(
            profile,
            blocking_power_w=83.64,
            state_dir=Path(tmp),
            set_latency_s=0.005,
            clock=REAL_CLOCK,
            noise=SimNoise(seed=args.seed),
            seed=args.seed,
            trace_ops=True,
        )
        agent = RankAgent(
            plan,
            gpu,
            0,
            watchdog=False,
            handle_signals=False,
            op_time_s=None if args.no_profile else op_time_s,
        )
        switches = []
        with agent:
            agent.wait_for_clock(5.0)
            for _ in range(args.iterations):
                agent.step_begin()
                for a in actions:
                    with agent.op(a.kind, a.microbatch_index):
                        gpu.launch(a.stage_index, a.kind)
                gpu.synchronize()
                switches.append(agent.step_end().mid_op_switches)
        trace = gpu.op_trace

    n = len(actions)
    total = wrong = never = at_start = 0.0
    for op in trace:
        if op.seq < n:
            continue
        a = actions[op.seq % n]
        fa, fb, k = ops[op.seq % n]
        ta = profile.op(a.stage_index, a.kind).at(fa).time_s
        tb = profile.op(a.stage_index, a.kind).at(fb).time_s
        planned_a = k / args.layers * ta
        at_a = sum(t for c, t in op.pieces if c == fa)
        other = sum(t for c, t in op.pieces if c not in (fa, fb))
        total += op.end_s - op.start_s
        wrong += abs(at_a - planned_a) + other
        never += (1 - k / args.layers) * ta  # later layers run at the first clock
        at_start += planned_a * tb / ta  # first layers run at the second clock
    print(f"ops per iteration: {n}, all two-clock ({args.layers} layers)")
    print(f"mid-op switches per iteration: {switches}")
    print(f"op time (steady iterations): {total:.3f} s")
    print(f"wrong-clock share, device-timed mid-op switch: {wrong / total:.2%}")
    print(f"wrong-clock share if never switched (model):   {never / total:.2%}")
    print(f"wrong-clock share if switched at op start:     {at_start / total:.2%}")


if __name__ == "__main__":
    main()
