"""Baseline frequency plans, evaluated by the same exact evaluator as the frontier.

* ``all-max``: every op at its highest profiled clock (what a GPU does by default).
* ``global-clock`` (Zeus-style): one clock for every GPU; the named baseline is the one with
  the least energy, which the frontier's minimum-energy end must beat.
* ``per-stage`` (ZeusPerStage-style): per GPU, the lowest clock whose per-microbatch work is
  no longer than the slowest GPU's at its highest clock.
* ``envpipe`` (EnvPipe's heuristic): ops on the all-max critical path stay at max; every other
  op, from the end backwards, gets the lowest clock that still fits before its successors.

Complexity: O(C·(N + E)) for C clocks (one exact evaluation per global clock), O(N·K) for the
rest.
"""

from __future__ import annotations

import numpy as np

from perseus.dag.evaluate import node_ops
from perseus.dag.graph import IntArray
from perseus.job import PlanningJob
from perseus.plan import PlanPoint
from perseus.schedule.actions import Kind
from perseus.solver.paths import build_topology

__all__ = ["baseline_freq_plans", "baseline_plans", "global_clock_plans"]

_KINDS = list(Kind)


def _all_clocks(job: PlanningJob) -> list[int]:
    clocks = {o.freq_mhz for op in job.profile.ops.values() for o in op.options}
    return sorted(clocks, reverse=True)


def _clock_for(job: PlanningJob, stage: int, kind: int, freq_mhz: int) -> int:
    """The op's highest measured clock ≤ ``freq_mhz`` (its lowest if none is)."""
    options = job.profile.op(stage, _KINDS[kind]).options  # highest first
    return next((o.freq_mhz for o in options if o.freq_mhz <= freq_mhz), options[-1].freq_mhz)


def _rank_freqs(job: PlanningJob, freqs_mhz: list[int]) -> IntArray:
    """Per node, its op's highest clock at most its rank's clock in ``freqs_mhz``."""
    g = job.graph
    # Each distinct (rank, stage, kind) once, by a code per node: a dense ranks x stages x
    # kinds table was 400 MB at 4096 stages, filled for every global clock.
    stages, kinds = int(g.stage.max()) + 1, len(_KINDS)
    codes, node_code = np.unique((g.rank * stages + g.stage) * kinds + g.kind, return_inverse=True)
    clocks = [
        _clock_for(job, rs % stages, k, freqs_mhz[rs // stages])
        for rs, k in (divmod(c, kinds) for c in codes.tolist())
    ]
    out: IntArray = np.array(clocks, dtype=np.int64)[node_code.reshape(-1)]
    return out


def _global_freqs(job: PlanningJob) -> list[IntArray]:
    return [_rank_freqs(job, [f] * job.graph.num_ranks) for f in _all_clocks(job)]


def global_clock_plans(job: PlanningJob) -> list[PlanPoint]:
    """One exact plan per profiled clock (every GPU at that clock), highest clock first."""
    return [job.point(freqs) for freqs in _global_freqs(job)]


def _per_stage_freqs(job: PlanningJob) -> IntArray:
    g = job.graph
    kinds = sorted(set(g.kind.tolist()))
    ranks = g.num_ranks
    stages_of: list[list[int]] = [[] for _ in range(ranks)]
    for r, s in sorted(set(zip(g.rank.tolist(), g.stage.tolist(), strict=True))):
        stages_of[r].append(s)  # one pass over the nodes (a mask per rank: O(ranks x N))

    def load(r: int, freq: int) -> float:
        total = 0.0
        for s in stages_of[r]:
            for k in kinds:
                total += job.profile.op(s, _KINDS[k]).at(_clock_for(job, s, k, freq)).time_s
        return total

    clocks = _all_clocks(job)
    target = max(load(r, clocks[0]) for r in range(ranks))
    chosen = []
    for r in range(ranks):
        pick = clocks[0]
        for f in clocks:  # descending: keep lowering while the GPU keeps up
            if load(r, f) <= target * (1 + 1e-12):
                pick = f
            else:
                break
        chosen.append(pick)
    return _rank_freqs(job, chosen)


def _envpipe_freqs(job: PlanningJob) -> IntArray:
    g = job.graph
    topo = build_topology(g)
    freqs = job.allmax()
    ops = node_ops(g, job.profile)
    time_s = np.array([op.max_freq.time_s for op in ops])
    start, end = topo.forward(time_s)
    deadline = float(end.max())
    envelope = (topo.backward(time_s, deadline) - end) <= 1e-9 * deadline
    margin = 8 * np.finfo(np.float64).eps * max(deadline, 1.0)
    # One node at a time in reverse topological order: plain floats, not numpy calls.
    late_start = [deadline] * g.num_nodes
    ptr, succ, lat = (a.tolist() for a in (topo.succ_ptr, topo.succ_idx, topo.succ_lat_csr))
    starts, durations, fixed = start.tolist(), time_s.tolist(), envelope.tolist()
    for i in topo.order_array[::-1].tolist():
        lf = deadline
        for a in range(ptr[i], ptr[i + 1]):
            lf = min(lf, late_start[succ[a]] - lat[a])
        if not fixed[i]:
            for o in ops[i].options:  # highest clock first; keep the lowest that fits
                if o.time_s <= lf - starts[i] - margin:
                    freqs[i], durations[i] = o.freq_mhz, o.time_s
        late_start[i] = lf - durations[i]
    return freqs


def baseline_freq_plans(job: PlanningJob) -> list[IntArray]:
    """Per-node clocks of every baseline: all-max, each global clock, per-stage, EnvPipe."""
    return [job.allmax(), *_global_freqs(job), _per_stage_freqs(job), _envpipe_freqs(job)]


def baseline_plans(job: PlanningJob) -> dict[str, PlanPoint]:
    """The named baselines as exact plan points.

    Returns:
        ``{"all-max", "global-clock", "per-stage", "envpipe"}``.
    """
    best_global = min(global_clock_plans(job), key=lambda p: (p.energy_j, p.time_s))
    return {
        "all-max": job.point(job.allmax()),
        "global-clock": best_global,
        "per-stage": job.point(_per_stage_freqs(job)),
        "envpipe": job.point(_envpipe_freqs(job)),
    }
