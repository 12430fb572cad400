"""The operation DAG of one training iteration, built from a schedule.

Nodes are the schedule's actions numbered rank-major (each rank's in execution order), so a
plan's ``freqs_mhz[r][j]`` flattens onto node ids. Edges join consecutive actions of a rank and
the data dependencies of :func:`perseus.schedule.action_dependencies`; edges across ranks carry
a constant P2P latency.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from graphlib import CycleError, TopologicalSorter

import numpy as np
import numpy.typing as npt

from perseus.errors import ScheduleError
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.dependencies import action_dependencies

__all__ = ["KIND_CODES", "OpGraph", "build_dag"]

KIND_CODES: dict[Kind, int] = {Kind.F: 0, Kind.B: 1, Kind.W: 2}

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class OpGraph:
    """Immutable operation DAG.

    Attributes:
        actions: ``actions[i]`` is node ``i``'s action; ``rank``, ``stage`` and ``kind`` (a
            :data:`KIND_CODES` code) hold its rank, stage index and kind.
        rank_start: Node ids of rank ``r`` are ``rank_start[r] .. rank_start[r+1]-1``.
        edge_src: Edge sources (deduplicated), ``edge_dst`` their destinations.
        edge_latency_s: Latency added on each edge (P2P latency on cross-rank edges, else 0).
        generations: Topological generations (node ids whose predecessors all lie in earlier
            generations), for vectorised longest paths; ``generation_edges[g]`` lists the
            edges entering generation ``g``.
    """

    schedule: Schedule
    actions: tuple[Action, ...]
    rank: IntArray
    stage: IntArray
    kind: IntArray
    rank_start: IntArray
    edge_src: IntArray
    edge_dst: IntArray
    edge_latency_s: FloatArray
    generations: tuple[IntArray, ...]
    generation_edges: tuple[IntArray, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.actions)

    @property
    def num_ranks(self) -> int:
        return len(self.rank_start) - 1

    def node_of(self, action: Action) -> int:
        """Node id of ``action``; raises KeyError if the schedule does not contain it."""
        return self._node_ids[action]

    @cached_property
    def _node_ids(self) -> dict[Action, int]:
        return {a: i for i, a in enumerate(self.actions)}


def build_dag(schedule: Schedule, *, p2p_latency_s: float = 0.0) -> OpGraph:
    """Build the operation DAG of one iteration of ``schedule``.

    Args:
        schedule: A validated schedule (the builders validate).
        p2p_latency_s: Constant latency added on every edge between different ranks.

    Raises:
        ScheduleError: if ``p2p_latency_s`` is negative or the schedule has a cycle.

    Complexity: O(N log N) for N actions (fewer than 2N edges, sorted once).
    """
    if p2p_latency_s < 0:
        raise ScheduleError(f"p2p latency must be >= 0 s, got {p2p_latency_s}")
    actions = tuple(a for acts in schedule.rank_actions for a in acts)
    n = len(actions)
    sizes = [len(acts) for acts in schedule.rank_actions]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    rank = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    stage = np.fromiter((a.stage_index for a in actions), dtype=np.int64, count=n)
    kind = np.fromiter((KIND_CODES[a.kind] for a in actions), dtype=np.int64, count=n)
    src, dst = _edges(schedule, actions, starts.tolist())
    latency = np.where(rank[src] != rank[dst], float(p2p_latency_s), 0.0)
    try:
        generations = _topological_generations(n, src, dst)
    except CycleError:
        raise ScheduleError(f"schedule {schedule.name!r} has a dependency cycle") from None
    edges_in = _generation_edges(n, generations, dst)
    return OpGraph(
        schedule, actions, rank, stage, kind, starts, src, dst, latency, generations, edges_in
    )


def _edges(
    schedule: Schedule, actions: tuple[Action, ...], starts: list[int]
) -> tuple[IntArray, IntArray]:
    """Sorted, distinct edges (sources, destinations); :class:`ScheduleError` if an action
    depends on one that no rank runs."""
    index = {a: i for i, a in enumerate(actions)}
    edges: set[tuple[int, int]] = set()
    for first, end in itertools.pairwise(starts):
        edges.update((i, i + 1) for i in range(first, end - 1))
    for i, a in enumerate(actions):
        for dep in action_dependencies(a, schedule.num_stages):
            if dep not in index:
                raise ScheduleError(f"action {a} depends on {dep}, which no rank runs")
            edges.add((index[dep], i))
    ordered = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    return ordered[:, 0].copy(), ordered[:, 1].copy()


def _generation_edges(
    n: int, generations: tuple[IntArray, ...], dst: IntArray
) -> tuple[IntArray, ...]:
    """Per generation, the indices of the edges into its nodes (in edge order)."""
    gen_of = np.empty(n, dtype=np.int64)
    for k, gen in enumerate(generations):
        gen_of[gen] = k
    edge_gen = gen_of[dst]
    order = np.argsort(edge_gen, kind="stable")
    bounds = np.searchsorted(edge_gen[order], np.arange(len(generations) + 1))
    return tuple(order[bounds[k] : bounds[k + 1]] for k in range(len(generations)))


def _topological_generations(n: int, src: IntArray, dst: IntArray) -> tuple[IntArray, ...]:
    """Kahn's layering, each generation sorted by node id: marking a whole ready batch done
    before asking for the next makes each batch one generation. Raises
    :class:`graphlib.CycleError` on a cycle."""
    sorter: TopologicalSorter[int] = TopologicalSorter({v: () for v in range(n)})
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        sorter.add(v, u)
    sorter.prepare()
    generations = []
    while sorter.is_active():
        ready = sorter.get_ready()
        generations.append(np.array(sorted(ready), dtype=np.int64))
        sorter.done(*ready)
    return tuple(generations)
