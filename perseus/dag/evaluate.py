"""The exact evaluator: iteration time, energy and per-op timing of a frequency plan.

Every figure perseus reports for a plan comes from here. **Time** is the longest path through
the DAG (op durations on nodes, P2P latency on cross-rank edges; every rank starts at 0 and an
op as early as its predecessors allow), computed by :func:`longest_path`, the one
implementation. **Energy** is ``Σ_ops e(stage, kind, f) + P_block · Σ_ranks (T − busy(rank))``:
each rank is a GPU drawing the blocking power whenever it is not computing. Two-clock and phased
ops cost what :func:`perseus.profile.two_clock.phased_cost` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.dag.graph import FloatArray, IntArray, OpGraph
from perseus.errors import PlanError
from perseus.profile.model import OpOption, OpProfile, Profile, clock_label
from perseus.profile.two_clock import LayerSplit, Phase, check_phases, op_phases, phased_cost
from perseus.schedule.actions import Kind

__all__ = [
    "Evaluation",
    "allmax_freqs",
    "evaluate_durations",
    "evaluate_freqs",
    "evaluate_many",
    "evaluations",
    "longest_path",
    "node_ops",
    "op_costs",
]

_KINDS = tuple(Kind)  # by kind code (perseus.dag.graph.KIND_CODES)
#: A plan as the evaluator takes it: per-node clocks (N,), two-clock rows (N, 3), or a list of
#: plan ops in any form :func:`perseus.profile.two_clock.op_phases` reads.
PlanArg = Sequence[int] | IntArray | Sequence[object]


@dataclass(frozen=True)
class Evaluation:
    """The exact figures of one plan.

    Attributes:
        time_s: Iteration time (makespan).
        energy_j: Total energy of all ranks over the iteration.
        compute_energy_j: Energy of the ops; ``blocking_energy_j`` that of the idle time.
        start_s: Per-node start times; ``end_s`` the end times.
        busy_s: Per-rank compute time.
    """

    time_s: float
    energy_j: float
    compute_energy_j: float
    blocking_energy_j: float
    start_s: FloatArray
    end_s: FloatArray
    busy_s: FloatArray


def longest_path(graph: OpGraph, time_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Earliest start/end of every node; ``time_s`` is (N,) or (K, N) for K plans at once.

    Complexity: O(N + E) numpy work in O(depth) vectorised steps.
    """
    start = np.zeros_like(time_s)
    end = np.zeros_like(time_s)
    src, dst, lat = graph.edge_src, graph.edge_dst, graph.edge_latency_s
    for gen, edges in zip(graph.generations, graph.generation_edges, strict=True):
        if edges.size:  # transposed, a node's row holds its start in every plan
            np.maximum.at(start.T, dst[edges], (end[..., src[edges]] + lat[edges]).T)
        end[..., gen] = start[..., gen] + time_s[..., gen]
    return start, end


def evaluate_durations(
    graph: OpGraph, time_s: FloatArray, energy_j: FloatArray, *, blocking_power_w: float
) -> Evaluation:
    """Evaluate a plan given each node's duration and energy. Complexity: as
    :func:`longest_path`."""
    t, e = np.atleast_2d(time_s), np.atleast_2d(energy_j)
    return evaluations(graph, t, e, blocking_power_w=blocking_power_w)[0]


def evaluations(
    graph: OpGraph, time_s: FloatArray, energy_j: FloatArray, *, blocking_power_w: float
) -> list[Evaluation]:
    """:func:`evaluate_durations` of each row of ``time_s`` and ``energy_j`` (K, N), one
    longest-path pass for all (each row's figures the same floats as alone)."""
    t = np.asarray(time_s, dtype=np.float64)
    e = np.asarray(energy_j, dtype=np.float64)
    starts, ends = longest_path(graph, t)
    out = []
    for k in range(t.shape[0]):
        makespan = float(ends[k].max())
        busy = np.bincount(graph.rank, weights=t[k], minlength=graph.num_ranks).astype(np.float64)
        compute = float(e[k].sum())
        blocking = float(blocking_power_w * (graph.num_ranks * makespan - busy.sum()))
        ev = Evaluation(makespan, compute + blocking, compute, blocking, starts[k], ends[k], busy)
        out.append(ev)
    return out


def evaluate_many(
    graph: OpGraph, time_s: FloatArray, energy_j: FloatArray, blocking_power_w: float
) -> tuple[FloatArray, FloatArray]:
    """Iteration times and energies, each (K,), of K plans at once (arrays of shape (K, N)):
    :func:`evaluate_durations` per row."""
    t = np.atleast_2d(np.asarray(time_s, dtype=np.float64))
    e = np.atleast_2d(np.asarray(energy_j, dtype=np.float64))
    _, end = longest_path(graph, t)
    makespan = end.max(axis=1)
    energy = e.sum(axis=1) + blocking_power_w * (graph.num_ranks * makespan - t.sum(axis=1))
    return makespan, energy


def op_costs(
    graph: OpGraph,
    profile: Profile,
    freqs_mhz: PlanArg,
    split: LayerSplit | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Per-node (time_s, energy_j) of a plan.

    Args:
        freqs_mhz: (N,) clocks, (N, 3) ``(freq_a_mhz, freq_b_mhz, layers_at_a)`` rows
            (one-clock ops as ``(f, f, 0)``), or N plan ops of any form
            (:func:`perseus.profile.two_clock.op_phases`), rank-major.
        split: How multi-phase ops are priced; needed only when the plan has such ops.

    Raises:
        PlanError: if the plan has the wrong length, a clock (pair) the profile lacks for that
            op, or a multi-phase op the job cannot run.
    """
    if (
        isinstance(freqs_mhz, np.ndarray)
        and freqs_mhz.shape == (graph.num_nodes,)
        and freqs_mhz.dtype.kind in "iu"
    ):
        found = _one_clock_costs(graph, profile, freqs_mhz)
        if found is not None:
            return found
    ops = _plan_rows(graph, freqs_mhz)
    time_s = np.empty(graph.num_nodes)
    energy_j = np.empty(graph.num_nodes)
    cache: dict[tuple[int, int, tuple[Phase, ...]], tuple[float, float]] = {}
    for i, key in enumerate(zip(graph.stage.tolist(), graph.kind.tolist(), strict=True)):
        phases = op_phases(ops[i])  # type: ignore[arg-type]
        hit = cache.get((*key, phases))
        if hit is None:
            hit = cache[(*key, phases)] = _phased_op_cost(graph, profile, i, phases, split)
        time_s[i], energy_j[i] = hit
    return time_s, energy_j


def _phased_op_cost(
    graph: OpGraph, profile: Profile, node: int, phases: tuple[Phase, ...], split: LayerSplit | None
) -> tuple[float, float]:
    """Time and energy of node ``node`` run in ``phases``; :class:`PlanError` names a clock
    the profile lacks."""
    stage = int(graph.stage[node])
    op = profile.op(stage, _KINDS[graph.kind[node]])
    check_phases(phases, stage, split)
    chosen: list[OpOption] = []
    for ph in phases:
        try:
            chosen.append(op.at(ph.freq_mhz, ph.mem_freq_mhz))
        except KeyError:
            r = int(graph.rank[node])
            raise PlanError(
                f"plan clock {clock_label(ph.freq_mhz, ph.mem_freq_mhz)} for rank {r} op {node - int(graph.rank_start[r])} "
                f"({graph.actions[node]}) was not profiled for stage {op.stage_index} "
                f"{op.kind.profile_name}; profiled clocks are {op.options[-1].freq_mhz}.."
                f"{op.options[0].freq_mhz} MHz"
                + ("" if op.has_memory_clocks else " at the one memory clock")
            ) from None
    if len(chosen) == 1:
        return chosen[0].time_s, chosen[0].energy_j
    assert split is not None  # check_phases raised without one
    work = [split.work_before(stage, ph.first_layer) for ph in phases[1:]]
    return phased_cost(chosen, work, split)


def _one_clock_costs(
    graph: OpGraph, profile: Profile, freqs_mhz: npt.NDArray[np.integer[Any]]
) -> tuple[FloatArray, FloatArray] | None:
    """:func:`op_costs` of per-node clocks (N,), one profile look-up per distinct (stage,
    kind, clock); ``None`` when a clock was not profiled (the general path names it)."""
    freqs = freqs_mhz.astype(np.int64)
    if freqs.size and not 0 <= freqs.min() <= freqs.max() < _CLOCK_KEY:
        return None
    codes = graph.stage.astype(np.int64) * len(_KINDS) + graph.kind
    keys, inverse = np.unique(codes * _CLOCK_KEY + freqs, return_inverse=True)
    time_s = np.empty(keys.size)
    energy_j = np.empty(keys.size)
    for j, key in enumerate(keys.tolist()):
        code, freq = divmod(key, _CLOCK_KEY)
        try:
            option = profile.op(code // len(_KINDS), _KINDS[code % len(_KINDS)]).at(freq, None)
        except KeyError:
            return None
        time_s[j], energy_j[j] = option.time_s, option.energy_j
    rows = inverse.reshape(-1)
    return time_s[rows], energy_j[rows]


#: Clocks below this (MHz) are looked up by one integer key per (stage, kind, clock).
_CLOCK_KEY = 1 << 20


def _plan_rows(graph: OpGraph, freqs_mhz: PlanArg) -> list[object]:
    """The plan as one plan op per node, or :class:`PlanError` on a bad length/shape."""
    if isinstance(freqs_mhz, np.ndarray) or all(isinstance(f, int) for f in freqs_mhz):
        freqs = np.asarray(freqs_mhz, dtype=np.int64)
        if freqs.ndim == 1:
            freqs = freqs[:, None]
        if freqs.ndim != 2 or freqs.shape[0] != graph.num_nodes or freqs.shape[1] not in (1, 3):
            raise PlanError(
                f"plan has {freqs.shape[0]} clocks but the schedule has {graph.num_nodes} ops"
            )
        return [r[0] if len(r) == 1 else r for r in freqs.tolist()]
    ops = list(freqs_mhz)
    if len(ops) != graph.num_nodes:
        raise PlanError(f"plan has {len(ops)} ops but the schedule has {graph.num_nodes} ops")
    return ops


def evaluate_freqs(
    graph: OpGraph,
    profile: Profile,
    freqs_mhz: PlanArg,
    *,
    blocking_power_w: float,
    split: LayerSplit | None = None,
) -> Evaluation:
    """Evaluate a plan in any form :func:`op_costs` takes."""
    time_s, energy_j = op_costs(graph, profile, freqs_mhz, split)
    return evaluate_durations(graph, time_s, energy_j, blocking_power_w=blocking_power_w)


def node_ops(graph: OpGraph, profile: Profile) -> list[OpProfile]:
    """Each node's (stage, kind) options in ``profile``."""
    return [
        profile.op(int(s), _KINDS[int(k)]) for s, k in zip(graph.stage, graph.kind, strict=True)
    ]


def allmax_freqs(graph: OpGraph, profile: Profile) -> IntArray:
    """Every op at its (stage, kind)'s highest profiled clock: the baseline plan."""
    return np.array([op.max_freq.freq_mhz for op in node_ops(graph, profile)], dtype=np.int64)
