"""Small jobs for solver tests: noisy profiles with few clocks, so hulls are non-trivial."""

from __future__ import annotations

import numpy as np

from perseus.job import PlanningJob, make_job
from perseus.profile import Profile, build_profile
from perseus.schedule import Kind


def noisy_profile(stages: int, clocks: int, seed: int, weight: bool = False) -> Profile:
    """Time falls and power rises with the clock; energy gets ±15 % noise (non-convex)."""
    rng = np.random.default_rng(seed)
    freqs = [1400 - 100 * i for i in range(clocks)]
    rows: list[tuple[int, Kind, int, float, float]] = []
    kinds = [Kind.F, Kind.B] + ([Kind.W] if weight else [])
    for s in range(stages):
        for kind in kinds:
            base = rng.uniform(0.5, 1.5) * (2.0 if kind is Kind.B else 1.0)
            for f in freqs:
                t = base * (1400 / f) ** rng.uniform(0.5, 0.9)
                p = 60 + 300 * (f / 1400) ** 2
                rows.append((s, kind, f, t, p * t * rng.uniform(0.85, 1.15)))
    return build_profile(rows, source=f"noisy(seed={seed})")


#: Small jobs of every schedule kind: (schedule, stages, microbatches, virtual stages, seed).
CASES = [
    ("gpipe", 3, 4, 1, 3),
    ("1f1b", 4, 6, 1, 5),
    ("1f1b", 3, 8, 1, 7),
    ("interleaved", 4, 4, 2, 2),
    ("zb", 3, 5, 1, 9),
]


def small_job(
    schedule: str = "1f1b",
    stages: int = 3,
    microbatches: int = 4,
    clocks: int = 5,
    seed: int = 0,
    power_w: float = 80.0,
    virtual_stages: int = 1,
) -> PlanningJob:
    profile = noisy_profile(stages, clocks, seed)
    return make_job(
        profile,
        schedule,
        stages,
        microbatches,
        blocking_power_w=power_w,
        virtual_stages=virtual_stages,
    )
