"""Fold a long job into a short one with the same stages, and lift its plans back.

The walk's time grows with the square of the microbatch count, but a schedule's middle is
periodic: the same schedule with ``stages + FOLD_EXTRA_MICROBATCHES`` microbatches is walked,
and each of its plans lifted rank by rank (the ends kept, the middle repeating the folded
sequence's last period before its midpoint; :func:`lift_plans`). Lifted plans are reclaimed
and evaluated exactly, so every point is a real, exact plan, but no longer the full job's
relaxation optimum.

Complexity: O(N·P) for the map (P periods tried), the walk on the folded job, and per lifted
candidate O(N + E) per speed-up round plus the reclaim and the evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.dag.evaluate import evaluate_many
from perseus.dag.graph import BoolArray, FloatArray, IntArray, OpGraph
from perseus.job import PlanningJob, make_job
from perseus.solver.cost_model import CostModel, build_cost_model
from perseus.solver.paths import Topology

__all__ = [
    "FOLD_ABOVE_OPS",
    "FOLD_EXTRA_MICROBATCHES",
    "FoldedJob",
    "Lift",
    "balance_periods",
    "fold_job",
    "lift_map",
    "lift_plans",
    "period_times_s",
]

#: Jobs with more ops than this are folded unless asked not to (16×64 1F1B walks exactly in
#: ~20 s on two cores).
FOLD_ABOVE_OPS = 2048
#: Steady-state periods kept beyond one per stage.
FOLD_EXTRA_MICROBATCHES = 8
#: Longest per-rank period tried (1F1B: 2; interleaved: 2 × virtual stages; zero bubble: 3).
_MAX_PERIOD = 64


@dataclass(frozen=True, eq=False)
class FoldedJob:
    """A job with fewer microbatches, its cost model and how the full job copies its nodes."""

    job: PlanningJob
    model: CostModel
    lift: Lift


def fold_job(
    job: PlanningJob, model: CostModel, hull_gap_fraction: float, max_clocks_per_op: int = 1
) -> FoldedJob | None:
    """``job`` (cost model ``model``) folded to ``stages + FOLD_EXTRA_MICROBATCHES``
    microbatches; ``None`` when that would not shrink it, its middle is not periodic, or the
    folded model numbers its options differently."""
    spec = job.spec
    folded_m = spec.stages + FOLD_EXTRA_MICROBATCHES
    if folded_m >= spec.microbatches:
        return None
    small = make_job(
        job.profile,
        spec.schedule,
        spec.stages,
        folded_m,
        blocking_power_w=spec.blocking_power_w,
        virtual_stages=spec.virtual_stages,
        p2p_latency_s=spec.p2p_latency_s,
        layers_per_stage=spec.layers_per_stage,
        layer_time_fractions=spec.layer_time_fractions,
        switch_latency_s=spec.switch_latency_s,
        switch_energy_j=spec.switch_energy_j,
        switch_stall_s=spec.switch_stall_s,
        profile_name=spec.profile_name,
    )
    lift = lift_map(job.graph, small.graph)
    if lift is None:
        return None
    small_model = build_cost_model(small, hull_gap_fraction, max_clocks_per_op)
    same_types = np.array_equal(small_model.opt_time_s, model.opt_time_s) and np.array_equal(
        small_model.node_type[lift.node_map], model.node_type
    )
    return FoldedJob(small, small_model, lift) if same_types else None


def lift_plans(
    folded: FoldedJob,
    plans: Sequence[IntArray],
    model: CostModel,
    topo: Topology,
    allmax_time_s: float,
) -> IntArray:
    """Full-job candidates (option indices) from the folded job's ``plans``.

    Per plan: as it is, and with no rank's period longer than the reference rank's (the
    slowest at the fastest clocks) in the plan, or at its fastest. Each lifted, and each also
    sped up to the same fraction of ``allmax_time_s`` as it had of the folded all-max time.
    """
    from perseus.solver.plan_kernels import tighten_kernel

    small, small_model, lift = folded.job, folded.model, folded.lift
    types, opt_t = small_model.node_type, small_model.opt_time_s
    tables = (types, opt_t, small_model.opt_cost_j)
    fastest = period_times_s(np.zeros_like(types), lift.periods, types, opt_t)
    ref = int(np.argmax(fastest))
    n_ranks = len(lift.periods)
    small_plans = [np.asarray(p, dtype=np.int64) for p in plans]
    small_plans += [
        balance_periods(p, lift.periods, np.full(n_ranks, limit), *tables)
        for p in plans
        for limit in (period_times_s(p, lift.periods, types, opt_t)[ref], fastest[ref])
    ]
    rows = np.stack(small_plans)
    small_times, _ = evaluate_many(
        small.graph,
        opt_t[types, rows],
        small_model.opt_energy_j[types, rows],
        small_model.blocking_power_w,
    )
    small_allmax_s = float(small.evaluate(small.allmax()).time_s)
    lifted = np.ascontiguousarray(rows[:, lift.node_map])
    targets = np.ascontiguousarray(small_times / small_allmax_s * allmax_time_s)
    tightened = tighten_kernel(topo.csr(), model.node_type, model.opt_time_s, lifted, targets)
    out: IntArray = np.concatenate([lifted, tightened])
    return out


def lift_map(full: OpGraph, folded: OpGraph) -> Lift | None:
    """How ``full``'s nodes copy ``folded``'s (same rank, same (stage, kind)); ``None`` if
    the ranks differ or no period up to ``_MAX_PERIOD`` matches."""
    if full.num_ranks != folded.num_ranks:
        return None
    label_full = full.stage * 8 + full.kind
    label_folded = folded.stage * 8 + folded.kind
    out = np.empty(full.num_nodes, dtype=np.int64)
    middle = np.zeros(full.num_nodes, dtype=np.bool_)
    periods: list[IntArray] = []
    for r in range(full.num_ranks):
        f0, f1 = int(full.rank_start[r]), int(full.rank_start[r + 1])
        s0, s1 = int(folded.rank_start[r]), int(folded.rank_start[r + 1])
        found = _rank_map(label_full[f0:f1], label_folded[s0:s1])
        if found is None:
            return None
        rank_map, period, mid = found
        out[f0:f1] = s0 + rank_map
        middle[f0:f1] = mid
        periods.append(s0 + period)
    return Lift(out, tuple(periods), middle)


@dataclass(frozen=True)
class Lift:
    """``node_map[i]`` is the folded node that full node ``i`` copies; ``periods[r]`` are the
    folded nodes of rank ``r``'s repeated period (empty if the rank's sequence is not cut);
    ``middle[i]`` says whether node ``i`` lies in the repeated middle."""

    node_map: IntArray
    periods: tuple[IntArray, ...]
    middle: BoolArray


def _rank_map(full: IntArray, folded: IntArray) -> tuple[IntArray, IntArray, BoolArray] | None:
    n_full, n_small = full.size, folded.size
    pos = np.arange(n_full)
    if n_small > n_full:
        return None
    if n_small == n_full:
        empty = np.zeros(0, dtype=np.int64)
        return (pos, empty, pos < 0) if np.array_equal(full, folded) else None
    head = n_small // 2
    tail_from = n_full - (n_small - head)
    for period in range(1, min(_MAX_PERIOD, head) + 1):
        src = np.where(
            pos < head,
            pos,
            np.where(
                pos >= tail_from, pos - (n_full - n_small), head - period + (pos - head) % period
            ),
        )
        if np.array_equal(folded[src], full):
            period_pos = np.arange(head - period, head, dtype=np.int64)
            return src.astype(np.int64), period_pos, (pos >= head) & (pos < tail_from)
    return None


def balance_periods(
    plan: IntArray,
    periods: tuple[IntArray, ...],
    limits_s: FloatArray,
    node_type: IntArray,
    opt_time_s: FloatArray,
    opt_cost_j: FloatArray,
) -> IntArray:
    """``plan`` (folded option indices) with rank ``r``'s repeated period no longer than
    ``limits_s[r]``: the cheapest speed-ups (least cost per second saved, one option step at
    a time) until it fits or every op of the period runs at its fastest."""
    out = plan.copy()
    for nodes, limit_s in zip(periods, limits_s, strict=True):
        if nodes.size == 0:
            continue
        types = node_type[nodes]
        total = float(opt_time_s[types, out[nodes]].sum())
        if not total > limit_s * (1 + 1e-12):
            continue
        # A period has a handful of ops: plain floats, not numpy calls on tiny arrays.
        times = [opt_time_s[t].tolist() for t in types.tolist()]
        costs = [opt_cost_j[t].tolist() for t in types.tolist()]
        idx = out[nodes].tolist()
        while total > limit_s * (1 + 1e-12):
            best, k, k_saved = math.inf, -1, 0.0
            for j, i in enumerate(idx):
                prev = max(i - 1, 0)
                saved = times[j][i] - times[j][prev]
                if saved > 0:
                    price = (costs[j][prev] - costs[j][i]) / saved
                    if price < best or k < 0:
                        best, k, k_saved = price, j, saved
            if k < 0:
                break
            idx[k] -= 1
            total -= k_saved
        out[nodes] = idx
    return out


def period_times_s(
    plan: IntArray, periods: tuple[IntArray, ...], node_type: IntArray, opt_time_s: FloatArray
) -> FloatArray:
    """Each rank's repeated period under ``plan`` (folded option indices), in seconds."""
    return np.array([opt_time_s[node_type[p], plan[p]].sum() for p in periods])
