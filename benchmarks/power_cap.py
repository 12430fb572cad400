"""Under a power budget, how fast does each approach run an iteration?

For the bundled GPT-3 profiles (A100 SXM4 and A40, 8 stages, 1F1B), at pipeline power caps
from the all-max plan's average power down to the minimum-energy plan's, compares the iteration
time of:

* **perseus**: the fastest frontier plan whose average summed power fits the cap
  (``perseus plan pick --power-cap-w``);
* **power limit**: one GPU power limit for every GPU (what ``nvidia-smi -pl`` does), modelled
  by the simulated GPU's power-cap model (:func:`perseus.device.power_model.capped_clock_mhz`:
  each op runs at the highest clock whose power fits the limit; waiting GPUs draw blocking
  power); the fastest limit whose pipeline average power fits the cap;
* **global clock**: one SM clock for every GPU (Zeus-style); the fastest clock that fits.

Every plan is evaluated by the same exact evaluator, so all three are compared at the same
average power. The margin is how much slower the alternative is than perseus (positive: perseus
faster). Usage::

    python benchmarks/power_cap.py [--microbatches 16] [--caps 9]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from perseus.device.power_model import capped_clock_mhz
from perseus.io import default_blocking_power_w, load_profile
from perseus.job import PlanningJob, make_job
from perseus.plan import PlanPoint
from perseus.schedule.actions import Kind
from perseus.solver import global_clock_plans, trace
from perseus.solver.power import fastest_under_power

_KINDS = list(Kind)


def power_limit_plans(job: PlanningJob) -> list[tuple[float, PlanPoint]]:
    """``(per-GPU limit W, exact plan)`` for every limit at which some op's clock changes."""
    g = job.graph
    ops = {
        (int(s), int(k)): job.profile.op(int(s), _KINDS[int(k)])
        for s, k in zip(g.stage, g.kind, strict=True)
    }
    power_of = {
        key: {o.freq_mhz: o.energy_j / o.time_s for o in op.options} for key, op in ops.items()
    }
    limits = sorted({w for table in power_of.values() for w in table.values()}, reverse=True)
    out = []
    for limit in limits:
        freqs = np.empty(g.num_nodes, dtype=np.int64)
        chosen: dict[tuple[int, int], int] = {}
        for key, op in ops.items():
            clocks = [o.freq_mhz for o in op.options]  # highest first
            chosen[key] = capped_clock_mhz(clocks, clocks[0], power_of[key], limit)
        for i, (s, k) in enumerate(zip(g.stage.tolist(), g.kind.tolist(), strict=True)):
            freqs[i] = chosen[(s, k)]
        out.append((limit, job.point(freqs)))
    return out


def _fastest(configs: list[tuple[str, PlanPoint]], cap_w: float) -> tuple[str, PlanPoint] | None:
    fits = [(label, p) for label, p in configs if p.avg_power_w <= cap_w * (1 + 1e-12)]
    return min(fits, key=lambda c: (c[1].time_s, c[1].energy_j)) if fits else None


def run(profile_name: str, microbatches: int, caps: int) -> bool:
    profile = load_profile(profile_name)
    blocking = default_blocking_power_w(profile)
    assert blocking is not None  # bundled profiles declare it
    job = make_job(profile, "1f1b", profile.num_stages, microbatches, blocking_power_w=blocking)
    started = time.perf_counter()
    frontier = trace(job).frontier
    limits = [(f"{w:.0f} W/GPU", p) for w, p in power_limit_plans(job)]
    clocks = [
        (f"{max(max(r) for r in p.freqs_mhz if r)} MHz", p)  # type: ignore[type-var]
        for p in global_clock_plans(job)
    ]
    elapsed = time.perf_counter() - started
    allmax = job.point(job.allmax())
    top, bottom = allmax.avg_power_w, frontier.min_energy.avg_power_w
    print(
        f"\n{profile_name}: 1f1b, {job.spec.stages} stages x {microbatches} microbatches, "
        f"{len(frontier.points)} frontier plans, {len(limits)} power limits, {len(clocks)} "
        f"global clocks (built in {elapsed:.1f} s); all-max {allmax.time_s:.4f} s at "
        f"{top:.0f} W, minimum-energy plan {frontier.min_energy.time_s:.4f} s at {bottom:.0f} W"
    )
    print(
        f"{'cap W':>7} {'perseus s':>10} {'power limit s':>14} {'(limit)':>11} {'margin':>8} "
        f"{'global clock s':>15} {'(clock)':>9} {'margin':>8}"
    )
    ok = True
    for cap_w in np.linspace(top, bottom, caps):
        mine = fastest_under_power(frontier.points, float(cap_w))
        row = f"{cap_w:7.0f} {mine.time_s:10.4f}"
        for configs, width in ((limits, 11), (clocks, 9)):
            best = _fastest(configs, float(cap_w))
            if best is None:
                row += f" {'none fits':>14} {'':>{width}} {'':>8}"
                continue
            label, p = best
            margin = p.time_s / mine.time_s - 1
            ok &= margin >= -1e-12
            row += (
                f" {p.time_s:{14 if width == 11 else 15}.4f} {label:>{width}} {100 * margin:+7.2f}%"
            )
        print(row)
    print(f"perseus at least as fast as both at every cap: {'yes' if ok else 'NO'}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--caps", type=int, default=9, help="caps from all-max power to T*'s")
    args = p.parse_args()
    results = [run(name, args.microbatches, args.caps) for name in ("a100", "a40")]
    print(f"\nall profiles: perseus at least as fast at every cap: {all(results)}")


if __name__ == "__main__":
    main()
