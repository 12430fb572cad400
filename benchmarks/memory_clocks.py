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

Usage::

    python benchmarks/memory_clocks.py
    python benchmarks/memory_clocks.py --micro 12 --layers 6
"""

from __future__ import annotations

import argparse
import time

from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY, switch_cost_for
from perseus.io import load_profile
from perseus.job import make_job
from perseus.profile.model import Profile
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
