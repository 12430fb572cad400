"""What do memory clocks and phase switches buy on a GDDR GPU, and what does a switch cost?

Part 1 (clock pairs): the bundled GPT-3 175B A40 profile (measured at the A40's one default
memory clock) is extended to (SM, memory) clock pairs with the ``a40`` preset's memory model
(:data:`perseus.device.presets.A40_MEMORY`: memory clocks 7251/5001/810/405 MHz, 60 W of
GDDR6 power, memory-bound share 0.20 forward / 0.15 backward; all estimates). For 1F1B, 8
stages, 12 layers per stage, it prints the exact-evaluated saving of the cheapest plan no
slower than all-max with SM clocks only and with clock pairs (both with two-phase ops), with
clock pairs and up to three phases per op, the LP limit over pairs (HiGHS) and the gap of the
two-phase pair plan to it, and the memory clocks the pair plan sets.

Part 2 (switch cost): the same no-slowdown plans with zero switch latency, with the Hopper
preset's latency (5 ms, the old clocks keep running meanwhile) and with that latency also
charged as a stall (time added at the new phase's power, as for a runtime that waits for the
set call), on the A40 pair profile and the A100 profile: mid-op switches per iteration and
saving, beside one clock (pair) per op, which any plan that switches must beat. Every figure is the exact evaluator's.

Part 3 (run time): the A40 pair profile cut to 4 stages, 1F1B, 8 microbatches, 12 layers per
stage; its no-slowdown plan (two and three phases per op) deployed on four emulated ranks
(``benchmarks/_virtual_pipeline.py``: the rank agents and their clock workers on
simulated A40s, seeded noise, 5 ms lognormal set latency, on virtual time), against the
all-max plan run the same way: predicted and measured saving, measured against predicted time,
and the mid-op switches and memory-clock set calls per iteration (means over iterations 2-6).

Usage::

    python benchmarks/memory_clocks.py
    python benchmarks/memory_clocks.py --micro 12 --layers 6
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from _virtual_pipeline import run_virtual_pipeline

from perseus.device.clock import VirtualClock
from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY, switch_cost_for
from perseus.device.simulated import SimNoise, SimulatedGPU
from perseus.io import load_profile
from perseus.job import make_job
from perseus.profile.model import Profile
from perseus.runtime.emulation import take_stages
from perseus.schedule import Kind
from perseus.solver import trace
from perseus.solver.lp_bound import lp_energy_floor_j

POWER = {"a100": 83.64, "a40": 70.38}


def _saving(
    profile: Profile, power_w: float, micro: int, layers: int, phases: int = 2, **switch: float
) -> tuple:
    job = make_job(
        profile, "1f1b", 8, micro, blocking_power_w=power_w, layers_per_stage=layers, **switch
    )
    started = time.perf_counter()
    frontier = trace(job, max_clocks_per_op=phases).frontier
    elapsed = time.perf_counter() - started
    base = frontier.baseline
    plan = frontier.cheapest_within(base.time_s)
    if plan.time_s > base.time_s:
        raise RuntimeError("the no-slowdown plan is slower than all-max")
    return job, 100 * (1 - plan.energy_j / base.energy_j), plan, base, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--micro", default="12,24", help="microbatch counts")
    ap.add_argument("--layers", type=int, default=12, help="layers per stage (GPT-3 175B: 12)")
    ap.add_argument("--runtime-only", action="store_true", help="print Part 3 only")
    args = ap.parse_args()
    if args.runtime_only:
        runtime_part()
        return
    a40 = load_profile("a40")
    pairs = with_memory_clocks(a40, A40_MEMORY)
    micros = [int(m) for m in args.micro.split(",")]

    print(f"Part 1: A40, 1F1B, 8 stages, {args.layers} layers/stage, two-phase ops, 5 ms latency")
    print(
        f"{'micro':>5} {'SM only %':>9} {'pairs %':>8} {'3 phases %':>10} {'LP pairs %':>10} "
        f"{'gap pts':>7} {'mem clocks used':>16} {'SM s':>5} {'pair s':>6}"
    )
    for micro in micros:
        _, sm_only, _, _, sm_s = _saving(a40, POWER["a40"], micro, args.layers)
        job, paired, plan, base, pair_s = _saving(pairs, POWER["a40"], micro, args.layers)
        _, three, _, _, _ = _saving(pairs, POWER["a40"], micro, args.layers, phases=3)
        limit = 100 * (1 - lp_energy_floor_j(job, base.time_s) / base.energy_j)
        used = ",".join(str(m) for m in sorted(plan.memory_clocks_mhz)) or "default"
        print(
            f"{micro:>5} {sm_only:>9.2f} {paired:>8.2f} {three:>10.2f} {limit:>10.2f} "
            f"{limit - paired:>7.2f} {used:>16} {sm_s:>5.1f} {pair_s:>6.1f}",
            flush=True,
        )

    hopper = switch_cost_for("hopper").latency_s
    print(f"\nPart 2: switch cost (Hopper preset latency {1e3 * hopper:g} ms), same jobs")
    print(f"{'profile':<9} {'micro':>5} {'switch cost':<22} {'saving %':>8} {'switches':>8}")
    cases: tuple[tuple[str, dict[str, float]], ...] = (
        ("none (one clock/op)", {"phases": 1}),
        ("zero", {"switch_latency_s": 0.0}),
        ("latency", {"switch_latency_s": hopper}),
        ("latency + stall", {"switch_latency_s": hopper, "switch_stall_s": hopper}),
    )
    for name, profile, power in (
        ("a40 pairs", pairs, POWER["a40"]),
        ("a100", load_profile("a100"), POWER["a100"]),
    ):
        for micro in micros:
            for label, switch in cases:
                kw = dict(switch)
                phases = int(kw.pop("phases", 2))
                _, saving, plan, _, _ = _saving(profile, power, micro, args.layers, phases, **kw)
                print(
                    f"{name:<9} {micro:>5} {label:<22} {saving:>8.2f} {plan.num_switches:>8}",
                    flush=True,
                )
    runtime_part()


class _CountingGPU(SimulatedGPU):
    """Counts memory-clock set calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memory_sets = 0

    def set_memory_locked_clock(self, mem_freq_mhz: int) -> int:
        self.memory_sets += 1
        return super().set_memory_locked_clock(mem_freq_mhz)


def runtime_part(iterations: int = 6) -> None:
    """Part 3: the no-slowdown pair plan on four emulated ranks, on virtual time."""
    profile = with_memory_clocks(take_stages(load_profile("a40"), 4), A40_MEMORY)
    power = POWER["a40"]

    def op_time_s(stage: int, kind: Kind, freq_mhz: int, mem_freq_mhz: int | None = None) -> float:
        return profile.op(stage, kind).at(freq_mhz, mem_freq_mhz).time_s

    def run(plan: Any) -> tuple[float, float, float, float]:
        with tempfile.TemporaryDirectory() as d:
            gpus = [
                _CountingGPU.from_profile(
                    profile,
                    blocking_power_w=power,
                    index=r,
                    state_dir=d,
                    set_latency_s=0.005,
                    clock=VirtualClock(1000.0),
                    noise=SimNoise(seed=11 + r),
                )
                for r in range(4)
            ]
            ran = run_virtual_pipeline(plan, gpus, iterations=iterations, op_time_s=op_time_s)
            t, e = ran.mean(skip=1)
            switches = sum(ran.mid_op_switches[1:]) / (iterations - 1)
            sets = sum(g.memory_sets for g in gpus if isinstance(g, _CountingGPU)) / iterations
        return t, e, switches, sets

    print(
        "\nPart 3: 4 emulated ranks (A40 pairs, 1F1B, 4 stages, 8 micro, 12 layers), virtual time"
    )
    print(
        f"{'phases':>6} {'pred %':>7} {'meas %':>7} {'gap pts':>7} {'time err %':>10} "
        f"{'planned sw':>10} {'issued sw':>9} {'mem sets/it':>11}"
    )
    for phases in (2, 3):
        job = make_job(profile, "1f1b", 4, 8, blocking_power_w=power, layers_per_stage=12)
        frontier = trace(job, max_clocks_per_op=phases).frontier
        point = frontier.cheapest_within(frontier.baseline.time_s)
        allmax = job.frontier([job.point(job.allmax())])
        _, base_e, _, _ = run(allmax)
        t, e, switches, sets = run(frontier.with_points((point,)))
        predicted = 100 * (1 - point.energy_j / allmax.points[0].energy_j)
        measured = 100 * (1 - e / base_e)
        print(
            f"{phases:>6} {predicted:>7.2f} {measured:>7.2f} {measured - predicted:>7.2f} "
            f"{100 * (t / point.time_s - 1):>10.2f} {point.num_switches:>10} {switches:>9.1f} "
            f"{sets:>11.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
