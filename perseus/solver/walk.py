"""Driving the frontier walk chunk by chunk, its emitted plans made into candidates on a
worker thread, and the lifting of a folded walk's plans.

:data:`METHODS` maps ``"compiled"`` (:func:`perseus.solver.compiled.walk_kernel`) to a core,
and :func:`core_of` makes one of any kernel of that signature (the tests' numpy oracle); a core
returns the candidates (reclaimed, each batch's Pareto set), the iteration count, the traced
relaxation and why the walk stopped. Complexity: the walk's, plus one tighten, reclaim and
evaluation pass, O(N + E) each, per emitted plan.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from perseus.dag.graph import IntArray
from perseus.job import PlanningJob
from perseus.profile.pareto import pareto_indices
from perseus.solver.cost_model import CostModel
from perseus.solver.fold import FoldedJob, lift_plans
from perseus.solver.pareto_search import plan_figures
from perseus.solver.paths import Topology
from perseus.solver.reclaim import reclaim_slack

__all__ = ["METHODS", "CoreFn", "Lifter", "Progress", "Then", "core_of", "pareto_within"]

Progress = Callable[[float], None]

#: Folded plans lifted at a time while the walk runs (each gives up to six full-size
#: candidates; small, so that lifting keeps up with the walk).
_LIFT_BATCH = 8
#: Walk iterations per compiled call (between progress reports).
_CHUNK_ITERATIONS = 2000
#: A second walk (ties left to the max flow) runs when the first cost at most this many
#: iteration × (node + edge) steps: a few tenths of a second.
_SECOND_WALK_MAX_WORK = 8e6


def _core(
    kernel: Callable[..., Any],
    job: PlanningJob,
    model: CostModel,
    topo: Topology,
    tol: float,
    quantum: float,
    gap: float,
    every_breakpoint: bool,
    progress: Progress | None,
    then: Then | None,
) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """The Phillips–Dessouky loop, ``kernel`` a chunk at a time (see :func:`_walk`).

    Ties between equally cheap cuts go to moving fewer ops (else the walk crawls); where the
    relaxation has several optimal plans the untied walk's rounding is sometimes better, so
    a walk that took a fraction of a second runs again untied and both keep their candidates
    (the LP curve is the first's). Each chunk's emitted plans become candidates (through
    ``then``) on a worker thread, in order, while the GIL-free kernels walk on.
    """
    from perseus.solver.compiled import TIE_UNITS

    def finish(emitted: IntArray) -> list[IntArray]:
        rows = _rounded_candidates(job, model, topo, emitted)
        return rows if then is None else then(rows)

    walk = (job, model, topo, tol, quantum, gap, every_breakpoint)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="perseus-candidates") as pool:
        pending: list[Future[list[IntArray]]] = []

        def submit(emitted: IntArray) -> None:
            pending.append(pool.submit(finish, emitted))

        iterations, lp_t, lp_e, reason = _walk(kernel, walk, progress, TIE_UNITS, submit)
        if iterations * (topo.num_nodes + topo.succ_idx.size) <= _SECOND_WALK_MAX_WORK:
            more_iterations, *_ = _walk(kernel, walk, None, 0, submit)
            iterations += more_iterations
        cand = [c for done in pending for c in done.result()]
    return cand, iterations, lp_t, lp_e, reason


def _rounded_candidates(
    job: PlanningJob, model: CostModel, topo: Topology, emitted: IntArray
) -> list[IntArray]:
    """Candidates from one chunk of emitted (rounded down, rounded up) row pairs: the
    rounded-up plan sped up to the rounded-down one's time, both reclaimed, the Pareto set
    kept."""
    from perseus.solver.plan_kernels import tighten_kernel

    rows = np.asarray(emitted, dtype=np.int64)
    down, up = rows[0::2], np.ascontiguousarray(rows[1::2])
    targets, _ = plan_figures(model, topo, job.graph.num_ranks, down)
    up = tighten_kernel(topo.csr(), model.node_type, model.opt_time_s, up, targets)
    return pareto_within(job, model, topo, np.concatenate([down, up]))


def _walk(
    kernel: Callable[..., Any],
    walk: tuple[PlanningJob, CostModel, Topology, float, float, float, bool],
    progress: Progress | None,
    tie_units: int,
    submit: Callable[[IntArray], None],
) -> tuple[int, list[float], list[float], str]:
    """One walk (``walk``: job, model, topology, tol, quantum, gap, every breakpoint) from the
    cheapest plan to the fastest, a chunk at a time; each chunk's emitted rows go to
    ``submit``."""
    from perseus.solver import compiled
    from perseus.solver.cut_network import build_network

    job, model, topo, tol, quantum, gap, every_breakpoint = walk

    _, pred_ptr, _, _, succ_ptr, succ_idx, _ = topo.csr()
    net = build_network(topo.num_nodes, pred_ptr, succ_ptr, succ_idx)
    types = model.node_type
    hull = [model.hull_time_s, model.hull_slope, model.hull_cost_j, model.num_hull]
    ht, hs, hc, nh = (np.ascontiguousarray(table[types]) for table in hull)
    rows = np.arange(topo.num_nodes)
    d = ht[rows, nh - 1].copy()
    t_min = float(topo.forward(ht[rows, 0])[1].max())
    state = np.zeros(compiled.STATE_SIZE)
    state[compiled.S_BEST_DEADLINE] = math.inf
    power_ranks = model.blocking_power_w * job.graph.num_ranks
    anchor_s = float(job.evaluate(job.allmax()).time_s)
    knobs = (tol, quantum, gap, every_breakpoint, power_ranks)
    limits = (*knobs, _CHUNK_ITERATIONS, tie_units, anchor_s)
    lp_t: list[float] = []
    lp_e: list[float] = []
    iterations = 0
    while state[compiled.S_DONE] == 0.0:
        emitted, chunk_t, chunk_e, done = kernel(
            topo.csr(), (ht, hs, hc, nh), types, model.opt_time_s, d, state, limits, net
        )
        iterations += int(done)
        if len(emitted):
            submit(emitted)
        lp_t.extend(chunk_t.tolist())
        lp_e.extend(chunk_e.tolist())
        if progress is not None and lp_t and lp_t[0] > t_min:
            progress(0.99 * min(1.0, (lp_t[0] - lp_t[-1]) / (lp_t[0] - t_min)))
    reason = {
        compiled.DONE_FASTEST: "fastest",
        compiled.DONE_STALLED: "stalled",
        compiled.DONE_NO_STEP: "no-step",
    }[float(state[compiled.S_DONE])]
    return iterations, lp_t, lp_e, reason


Then = Callable[[list[IntArray]], list[IntArray]]
CoreFn = Callable[
    [PlanningJob, CostModel, Topology, float, float, float, bool, "Progress | None", "Then | None"],
    tuple[list[IntArray], int, list[float], list[float], str],
]


def _core_compiled(*args: Any) -> tuple[list[IntArray], int, list[float], list[float], str]:
    """The walk compiled (:func:`perseus.solver.compiled.walk_kernel`)."""
    from perseus.solver.compiled import walk_kernel

    return _core(walk_kernel, *args)


def core_of(kernel: Callable[..., Any]) -> CoreFn:
    """The walk core around ``kernel``, a function with
    :func:`perseus.solver.compiled.walk_kernel`'s arguments and results."""
    return functools.partial(_core, kernel)


class Lifter:
    """Folded plans lifted to the full job (:func:`perseus.solver.fold.lift_plans`) in
    batches of :data:`_LIFT_BATCH` as they come, one batch at a time on ``lane`` (so the walk
    keeps a core of its own), each batch's Pareto set kept; :meth:`flush` lifts the plans left
    in two halves on ``pool``'s threads (the walk is done) and returns every batch's
    candidates in order. Each batch is lifted on its own, so the result does not depend on
    which thread lifts it."""

    def __init__(
        self,
        job: PlanningJob,
        model: CostModel,
        topo: Topology,
        folded: FoldedJob,
        allmax_time_s: float,
        pools: tuple[Executor, Executor],
    ) -> None:
        self._lift = (job, model, topo, folded, allmax_time_s)
        self._lane, self._pool = pools
        self._buffer: list[IntArray] = []
        self._batches: list[Future[list[IntArray]]] = []

    def __call__(self, plans: list[IntArray]) -> list[IntArray]:
        self._buffer.extend(plans)
        while len(self._buffer) >= _LIFT_BATCH:
            self._batches.append(self._lane.submit(self._lifted, self._buffer[:_LIFT_BATCH]))
            del self._buffer[:_LIFT_BATCH]
        return []

    def flush(self) -> list[IntArray]:
        half = (len(self._buffer) + 1) // 2
        for part in (self._buffer[:half], self._buffer[half:]):
            if part:
                self._batches.append(self._pool.submit(self._lifted, part))
        self._buffer = []
        out = [c for batch in self._batches for c in batch.result()]
        self._batches = []
        return out

    def _lifted(self, batch: list[IntArray]) -> list[IntArray]:
        job, model, topo, folded, allmax_time_s = self._lift
        lifted = lift_plans(folded, batch, model, topo, allmax_time_s)
        return pareto_within(job, model, topo, lifted)


METHODS: dict[str, CoreFn] = {"compiled": _core_compiled}


def pareto_within(
    job: PlanningJob, model: CostModel, topo: Topology, plans: IntArray
) -> list[IntArray]:
    """The reclaimed plans of one batch that no other plan of the batch dominates (safe to
    drop the others early; keeps memory flat)."""
    rec = reclaim_slack(model, topo, np.atleast_2d(plans))
    times, energies = plan_figures(model, topo, job.graph.num_ranks, rec)
    return list(rec[pareto_indices(times, energies)])
