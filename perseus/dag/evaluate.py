"""The exact evaluator: iteration time, energy and per-op timing of a frequency plan.

Every figure perseus reports for a plan comes from here.

* **Time** is the longest path through the DAG with op durations as node weights and P2P
  latency on cross-rank edges; every rank starts at 0 and ops start as early as their
  predecessors allow (as a pipeline engine runs them).
* **Energy** is ``Σ_ops e(stage, kind, f) + P_block · Σ_ranks (T − busy(rank))``: each rank is
  one GPU that draws the blocking power whenever it is not computing (bubbles and P2P waits).
* **Two-clock ops** (a plan given as an (N, 3) array of ``(freq_a_mhz, freq_b_mhz,
  layers_at_a)``) cost what :func:`perseus.profile.two_clock.two_clock_cost` says: the
  layer-weighted mix of the two clocks plus the switch cost.

The longest path itself is :func:`longest_path`, the one implementation every caller uses
(the solver's compiled loops run the same recurrence on CSR arrays, see
:mod:`perseus.solver.compiled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag.graph import OpGraph
from perseus.errors import PlanError
from perseus.profile.model import Profile
from perseus.profile.two_clock import LayerSplit, check_op, op_clocks, two_clock_cost
from perseus.schedule.actions import Kind

__all__ = [
    "Evaluation",
    "allmax_freqs",
    "evaluate_durations",
    "evaluate_freqs",
    "evaluate_many",
    "longest_path",
    "op_costs",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Evaluation:
    """The exact figures of one plan.

    Attributes:
        time_s: Iteration time (makespan).
        energy_j: Total energy of all ranks over the iteration.
        compute_energy_j: Energy of the ops themselves.
        blocking_energy_j: Blocking power × idle time, summed over ranks.
        start_s, end_s: Per-node start and end times.
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

    Every rank starts at 0; a node starts when its last predecessor has finished (plus the
    edge latency). Complexity: O(N + E) numpy work in O(depth) vectorised steps.
    """
    start = np.zeros_like(time_s)
    end = np.zeros_like(time_s)
    src, dst, lat = graph.edge_src, graph.edge_dst, graph.edge_latency_s
    for gen, edges in zip(graph.generations, graph.generation_edges, strict=True):
        if edges.size:
            ready = end[..., src[edges]] + lat[edges]
            if time_s.ndim == 1:
                np.maximum.at(start, dst[edges], ready)
            else:
                np.maximum.at(start, (slice(None), dst[edges]), ready)  # type: ignore[arg-type]
        end[..., gen] = start[..., gen] + time_s[..., gen]
    return start, end


def evaluate_durations(
    graph: OpGraph, time_s: FloatArray, energy_j: FloatArray, *, blocking_power_w: float
) -> Evaluation:
    """Evaluate a plan given each node's duration and energy.

    Complexity: O(N + E) numpy work in O(depth) vectorised steps.
    """
    t = np.asarray(time_s, dtype=np.float64)
    e = np.asarray(energy_j, dtype=np.float64)
    start, end = longest_path(graph, t)
    makespan = float(end.max())
    busy = np.bincount(graph.rank, weights=t, minlength=graph.num_ranks).astype(np.float64)
    compute = float(e.sum())
    blocking = float(blocking_power_w * (graph.num_ranks * makespan - busy.sum()))
    return Evaluation(makespan, compute + blocking, compute, blocking, start, end, busy)


def evaluate_many(
    graph: OpGraph, time_s: FloatArray, energy_j: FloatArray, blocking_power_w: float
) -> tuple[FloatArray, FloatArray]:
    """Iteration times and energies of K plans at once (arrays of shape (K, N)).

    Returns:
        ``(time_s, energy_j)``, each of shape (K,), equal to :func:`evaluate_durations` per row.
    """
    t = np.atleast_2d(np.asarray(time_s, dtype=np.float64))
    e = np.atleast_2d(np.asarray(energy_j, dtype=np.float64))
    _, end = longest_path(graph, t)
    makespan = end.max(axis=1)
    energy = e.sum(axis=1) + blocking_power_w * (graph.num_ranks * makespan - t.sum(axis=1))
    return makespan, energy


def op_costs(
    graph: OpGraph,
    profile: Profile,
    freqs_mhz: Sequence[int] | IntArray,
    split: LayerSplit | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Per-node (time_s, energy_j) of a plan.

    Args:
        graph: The DAG.
        profile: Its profile.
        freqs_mhz: (N,) clocks, or (N, 3) ``(freq_a_mhz, freq_b_mhz, layers_at_a)`` rows
            (one-clock ops as ``(f, f, 0)``), node order rank-major.
        split: How two-clock ops are priced (the job's layers and switch cost); needed only
            when the plan has two-clock ops.

    Raises:
        PlanError: if the plan has the wrong length, a clock the profile lacks for that op, or
            a two-clock op the job cannot run.
    """
    freqs = np.asarray(freqs_mhz, dtype=np.int64)
    if freqs.ndim == 1:
        freqs = freqs[:, None]
    if freqs.shape[0] != graph.num_nodes or freqs.shape[1] not in (1, 3):
        raise PlanError(
            f"plan has {freqs.shape[0]} clocks but the schedule has {graph.num_nodes} ops"
        )
    kinds = list(Kind)
    time_s = np.empty(graph.num_nodes)
    energy_j = np.empty(graph.num_nodes)
    cache: dict[tuple[int, int, int, int, int], tuple[float, float]] = {}
    rows = freqs.tolist()
    stages, kind_codes = graph.stage.tolist(), graph.kind.tolist()
    for i in range(graph.num_nodes):
        op_spec = op_clocks(rows[i][0] if len(rows[i]) == 1 else rows[i])
        key = (stages[i], kind_codes[i], *op_spec)
        hit = cache.get(key)
        if hit is None:
            op = profile.op(stages[i], kinds[kind_codes[i]])
            check_op(op_spec, stages[i], split)
            try:
                a = op.at(op_spec.freq_a_mhz)
                b = op.at(op_spec.freq_b_mhz)
            except KeyError as e:
                r = int(graph.rank[i])
                j = i - int(graph.rank_start[r])
                raise PlanError(
                    f"plan clock {e.args[0]} MHz for rank {r} op {j} ({graph.actions[i]}) was "
                    f"not profiled for stage {op.stage_index} {op.kind.profile_name}; profiled "
                    f"clocks are {op.options[-1].freq_mhz}..{op.options[0].freq_mhz} MHz"
                ) from None
            if op_spec.is_two_clock and split is not None:  # check_op raised if no split
                hit = two_clock_cost(a, b, split.work_before(stages[i], op_spec.layers_at_a), split)
            else:
                hit = (a.time_s, a.energy_j)
            cache[key] = hit
        time_s[i], energy_j[i] = hit
    return time_s, energy_j


def evaluate_freqs(
    graph: OpGraph,
    profile: Profile,
    freqs_mhz: Sequence[int] | IntArray,
    *,
    blocking_power_w: float,
    split: LayerSplit | None = None,
) -> Evaluation:
    """Evaluate a plan given per-node clocks or two-clock rows (see :func:`op_costs`)."""
    time_s, energy_j = op_costs(graph, profile, freqs_mhz, split)
    return evaluate_durations(graph, time_s, energy_j, blocking_power_w=blocking_power_w)


def allmax_freqs(graph: OpGraph, profile: Profile) -> IntArray:
    """Every op at its (stage, kind)'s highest profiled clock: the baseline plan."""
    kinds = list(Kind)
    return np.array(
        [
            profile.op(int(s), kinds[int(k)]).max_freq.freq_mhz
            for s, k in zip(graph.stage, graph.kind, strict=True)
        ],
        dtype=np.int64,
    )
