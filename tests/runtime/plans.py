"""Small hand-written plans for agent and safety tests (no solver needed)."""

from __future__ import annotations

from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint

__all__ = ["tiny_plan"]


def tiny_plan(
    freq_mhz: int = 1095,
    stage_ops: tuple[tuple[str, ...], ...] = (("F0", "F1", "B0", "B1"), ("F0", "B0", "F1", "B1")),
    points: int = 1,
) -> Frontier:
    """A 2-rank 1F1B-like plan with every op at ``freq_mhz`` (point k at ``freq_mhz - 15k``)."""
    ranks = len(stage_ops)
    job = JobSpec(
        schedule="1f1b",
        ranks=ranks,
        stages=ranks,
        microbatches=2,
        blocking_power_w=83.64,
        profile_sha256="0" * 64,
    )
    pts = tuple(
        PlanPoint(
            time_s=1.0 + k,
            energy_j=100.0 - k,
            freqs_mhz=tuple(tuple(freq_mhz - 15 * k for _ in ops) for ops in stage_ops),
        )
        for k in range(points)
    )
    return Frontier(
        job=job, stage_ops=stage_ops, baseline=Baseline(time_s=1.0, energy_j=100.0), points=pts
    )
