"""Compiled loops over whole plans: longest paths, slack reclaiming, tightening, evaluation
and one-move neighbours.

They take option-index plans (K, N), per-type option tables and the DAG as CSR lists plus a
topological order (:class:`perseus.solver.paths.Topology`). Cached on disk by numba; imported
lazily. Complexity: O(N + E) per longest-path pass; reclaiming is two passes per plan;
tightening repeats both until the target is met (at most W·N rounds for W options per op); the
neighbour search reclaims and evaluates O(N) (O(N²) with pairs) plans per row.
"""

from __future__ import annotations

import numpy as np

from perseus.solver.aot import ahead_of_time
from perseus.solver.aot import jit as _jit
from perseus.solver.aot import jit_inline as _jit_inline

__all__ = [
    "backward_pass",
    "evaluate_kernel",
    "forward_pass",
    "neighbour_kernel",
    "reclaim_kernel",
    "tighten_kernel",
]


@_jit_inline
def _earliest_start(v, pred_ptr, pred_idx, pred_lat, end):
    """Op ``v``'s earliest start: its predecessors' latest finish plus latency (0 if none)."""
    s = 0.0
    for k in range(pred_ptr[v], pred_ptr[v + 1]):
        r = end[pred_idx[k]] + pred_lat[k]
        if r > s:
            s = r
    return s


@_jit
def _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end):
    """Earliest start/finish in place; returns the makespan."""
    makespan = 0.0
    for v in order:
        s = _earliest_start(v, pred_ptr, pred_idx, pred_lat, end)
        start[v] = s
        e = s + dur[v]
        end[v] = e
        if e > makespan:
            makespan = e
    return makespan


@_jit
def _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, late_start, late_finish):
    """Latest finish in place so that everything ends by ``deadline``."""
    for i in range(order.size - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            r = late_start[succ_idx[k]] - succ_lat[k]
            if r < lf:
                lf = r
        late_finish[v] = lf
        late_start[v] = lf - dur[v]


#: The longest-path passes for callers outside the kernels.
forward_pass = ahead_of_time("forward_pass", _forward)
backward_pass = ahead_of_time("backward_pass", _backward)


@_jit
def _reclaim_row(topo, node_type, opt_t, row, work):
    """Slack reclaiming (:mod:`perseus.solver.reclaim`) of one plan, in place; ``topo`` is
    ``(order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat)``, ``work`` (4, N)
    scratch. Returns the plan's makespan (unchanged by reclaiming)."""
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat = topo
    n = row.size
    start, end, dur, late_start = work[0], work[1], work[2], work[3]
    for v in range(n):
        dur[v] = opt_t[node_type[v], row[v]]
    deadline = _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end)
    margin = 8 * np.finfo(np.float64).eps * max(deadline, 1.0)
    for i in range(n - 1, -1, -1):
        v = order[i]
        lf = deadline
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            r = late_start[succ_idx[k]] - succ_lat[k]
            if r < lf:
                lf = r
        window = lf - start[v] - margin
        t = node_type[v]
        # Options are sorted by time (inf-padded): binary search, as two-clock tables are wide.
        fits = np.searchsorted(opt_t[t], window, side="right") - 1
        new = max(row[v], fits)
        row[v] = new
        late_start[v] = lf - max(opt_t[t, new], 0.0)
    return deadline


@_jit
def reclaim_kernel(topo, node_type, opt_t, plans):
    """Slack reclaiming (see :mod:`perseus.solver.reclaim`) of every row of ``plans`` (K, N);
    ``topo``: :meth:`~perseus.solver.paths.Topology.csr`, as for every kernel here."""
    out = plans.copy()
    work = np.empty((4, plans.shape[1]))
    for p in range(plans.shape[0]):
        _reclaim_row(topo, node_type, opt_t, out[p], work)
    return out


@_jit
def tighten_kernel(topo, node_type, opt_t, plans, targets_s):
    """Each row of ``plans`` (K, N), sped up until it finishes by ``targets_s[k]``.

    A round moves every critical op not at its fastest option one option faster, until the
    plan meets its target or no critical op can go faster. Blunt, so the result goes through
    the reclaim pass.
    """
    order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat = topo
    k_plans, n = plans.shape
    out = plans.copy()
    start = np.empty(n)
    end = np.empty(n)
    dur = np.empty(n)
    late_start = np.empty(n)
    late_finish = np.empty(n)
    for p in range(k_plans):
        while True:
            for v in range(n):
                dur[v] = opt_t[node_type[v], out[p, v]]
            deadline = _forward(order, pred_ptr, pred_idx, pred_lat, dur, start, end)
            if deadline <= targets_s[p]:
                break
            _backward(order, succ_ptr, succ_idx, succ_lat, dur, deadline, late_start, late_finish)
            eps = 1e-9 * deadline
            moved = False
            for v in range(n):
                if late_finish[v] - end[v] <= eps and out[p, v] > 0:
                    out[p, v] -= 1
                    moved = True
            if not moved:
                break
    return out


@_jit
def _time_and_energy(preds, node_type, opt_t, opt_c, power_ranks, row, work):
    """Makespan and energy (``Σ effective cost + P·R·T``) of one plan; ``preds`` is ``(order,
    pred_ptr, pred_idx, pred_lat)``, ``work`` (3+, N) scratch."""
    order, pred_ptr, pred_idx, pred_lat = preds
    cost = 0.0
    dur = work[2]
    for v in range(row.size):
        dur[v] = opt_t[node_type[v], row[v]]
        cost += opt_c[node_type[v], row[v]]
    t = _forward(order, pred_ptr, pred_idx, pred_lat, dur, work[0], work[1])
    return t, cost + power_ranks * t


@_jit
def evaluate_kernel(preds, node_type, opt_t, opt_c, power_ranks, plans):
    """Makespan and energy (``Σ effective cost + P·R·T``) of every row of ``plans`` (K, N);
    ``preds``: the first four of :meth:`~perseus.solver.paths.Topology.csr`."""
    k_plans, n = plans.shape
    time_s = np.empty(k_plans)
    energy_j = np.empty(k_plans)
    work = np.empty((3, n))
    for p in range(k_plans):
        time_s[p], energy_j[p] = _time_and_energy(
            preds, node_type, opt_t, opt_c, power_ranks, plans[p], work
        )
    return time_s, energy_j


@_jit
def neighbour_kernel(
    topo, node_type, opt_t, opt_c, num_opts, power_ranks, plans, archive_t, archive_e, pairs
):
    """Every plan one move away from a row of ``plans``, reclaimed, that the archive does not
    dominate (to a relative 1e-12).

    A move shifts one op one option faster or slower; with ``pairs`` also two ops at once,
    one each way. ``archive_t`` (ascending) and ``archive_e`` (descending) are a Pareto set.
    Returns ``(plans, time_s, energy_j)`` of the kept neighbours (duplicates possible).
    """
    k_plans, n = plans.shape
    costs = (node_type, opt_t, opt_c, power_ranks, archive_t, archive_e)
    kept = (np.empty((64, n), dtype=np.int64), np.empty(64), np.empty(64), np.int64(0))
    row = np.empty(n, dtype=np.int64)
    work = np.empty((4, n))
    second = n if pairs else 0
    for p in range(k_plans):
        for i in range(n):
            for step in (-1, 1):
                k = plans[p, i] + step
                if k < 0 or k >= num_opts[node_type[i]]:
                    continue
                kept = _try_move(topo, costs, plans[p], i, k, i, k, row, work, kept)  # one op
                # Pairs: op i one way, op j > i the other (each unordered pair once).
                for j in range(i + 1, second):
                    kj = plans[p, j] - step
                    if 0 <= kj < num_opts[node_type[j]]:
                        kept = _try_move(topo, costs, plans[p], i, k, j, kj, row, work, kept)
    out, out_t, out_e, n_out = kept
    return out[:n_out].copy(), out_t[:n_out].copy(), out_e[:n_out].copy()


@_jit
def _try_move(topo, costs, plan, i, k, j, kj, row, work, kept):
    """``plan`` with op ``i`` at option ``k`` and op ``j`` at ``kj`` (``j == i``: one op),
    reclaimed, appended to ``kept`` = (plans, time_s, energy_j, count) unless the archive
    dominates it; returns the new ``kept``."""
    node_type, opt_t, opt_c, power_ranks, archive_t, archive_e = costs
    out, out_t, out_e, n_out = kept
    n = plan.size
    for v in range(n):
        row[v] = plan[v]
    row[i] = k
    row[j] = kj
    _reclaim_row(topo, node_type, opt_t, row, work)
    t, e = _time_and_energy(topo[:4], node_type, opt_t, opt_c, power_ranks, row, work)
    a = np.searchsorted(archive_t, t * (1 + 1e-12), side="right") - 1
    if a >= 0 and archive_e[a] <= e * (1 + 1e-12):
        return kept
    if n_out == out.shape[0]:
        out, out_t, out_e = _grown(out, out_t, out_e)
    for v in range(n):
        out[n_out, v] = row[v]
    out_t[n_out] = t
    out_e[n_out] = e
    return out, out_t, out_e, n_out + 1


@_jit
def _grown(out, out_t, out_e):
    """``out`` (K, N) and ``out_t``, ``out_e`` (K,) copied into arrays twice as long
    (element loops: numba compiles a broadcasting setitem's error message for ~15 s)."""
    k, n = out.shape
    bigger = np.empty((2 * k, n), dtype=np.int64)
    bigger_t = np.empty(2 * k)
    bigger_e = np.empty(2 * k)
    for r in range(k):
        bigger_t[r] = out_t[r]
        bigger_e[r] = out_e[r]
        for v in range(n):
            bigger[r, v] = out[r, v]
    return bigger, bigger_t, bigger_e


# Called from Python only: the native ones where they were built (perseus.solver.aot).
evaluate_kernel = ahead_of_time("evaluate_kernel", evaluate_kernel)
neighbour_kernel = ahead_of_time("neighbour_kernel", neighbour_kernel)
reclaim_kernel = ahead_of_time("reclaim_kernel", reclaim_kernel)
tighten_kernel = ahead_of_time("tighten_kernel", tighten_kernel)
