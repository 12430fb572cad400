"""How long do small jobs (up to 16 ops) take to trace? The goal is under a second each.

A user's first toy pipeline is small; the frontier of every 1F1B, GPipe, zero-bubble and
interleaved job of at most 16 ops on the first stages of the bundled GPT-3 A100 profile is
traced in-process (after one warm-up solve that loads numba's cached kernels), one clock per
op and with two-clock ops (12 layers per stage). Prints each job's time and the maximum.

Usage::

    python benchmarks/small_jobs.py
"""

from __future__ import annotations

import time

from perseus.errors import PerseusError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.profile import Profile, build_profile
from perseus.solver import trace

_MAX_OPS = 16


def _first_stages(profile: Profile, stages: int) -> Profile:
    rows = [
        (s, k, o.freq_mhz, o.time_s, o.energy_j)
        for (s, k), op in profile.ops.items()
        if s < stages
        for o in op.options
    ]
    return build_profile(rows, source=f"{profile.source} (stages 0..{stages - 1})")


def main() -> None:
    a100 = load_profile("a100")
    trace(
        make_job(_first_stages(a100, 2), "1f1b", 2, 2, blocking_power_w=83.64)
    )  # warm-up: load kernels
    with open("/proc/loadavg") as f:
        print(f"load average: {' '.join(f.read().split()[:3])}")
    print(
        f"{'schedule':<12} {'stages':>6} {'micro':>5} {'ops':>4} {'1-clock s':>9} {'2-clock s':>9}"
    )
    worst = 0.0
    for schedule, virtual in (("1f1b", 1), ("gpipe", 1), ("zb", 1), ("interleaved", 2)):
        for stages in range(1, 9):
            for micro in range(1, 17):
                try:
                    profile = _first_stages(a100, stages * virtual)
                    job = make_job(
                        profile, schedule, stages * virtual, micro, blocking_power_w=83.64, virtual_stages=virtual,
                        layers_per_stage=12,
                    )  # fmt: skip
                except PerseusError:
                    continue  # the schedule does not exist at this size
                if job.graph.num_nodes > _MAX_OPS:
                    continue
                times = []
                for clocks in (1, 2):
                    started = time.perf_counter()
                    trace(job, max_clocks_per_op=clocks)
                    times.append(time.perf_counter() - started)
                worst = max(worst, *times)
                print(
                    f"{schedule:<12} {stages * virtual:>6} {micro:>5} {job.graph.num_nodes:>4} "
                    f"{times[0]:>9.2f} {times[1]:>9.2f}",
                    flush=True,
                )
    print(f"slowest: {worst:.2f} s")


if __name__ == "__main__":
    main()
