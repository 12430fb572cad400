"""The compiled walk against the reference walk, and its warm-started min cut against scipy."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import maximum_flow

from perseus.errors import ConfigError
from perseus.solver import cut_network, trace, walk

from .conftest import CASES, small_job
from .oracles.reference_walk import walk_chunk


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in CASES])
def test_compiled_walk_traces_the_same_relaxation_as_the_reference(case):
    schedule, stages, microbatches, virtual, seed = case
    job = small_job(schedule, stages, microbatches, seed=seed, virtual_stages=virtual)
    fast = trace(job, hull_gap_fraction=0.0)
    ref = trace(job, hull_gap_fraction=0.0, method=walk_chunk)
    assert fast.complete and ref.complete
    # Both walk the same LP's breakpoints (step for step: test_reference_walk.py): same ends,
    # same energy at every deadline.
    t_ref, e_ref = ref.lp_time_s[::-1], ref.lp_energy_j[::-1]
    t_fast, e_fast = fast.lp_time_s[::-1], fast.lp_energy_j[::-1]
    assert t_fast[0] == pytest.approx(t_ref[0], rel=1e-9)
    assert t_fast[-1] == pytest.approx(t_ref[-1], rel=1e-9)
    grid = np.linspace(t_ref[0], t_ref[-1], 200)
    np.testing.assert_allclose(np.interp(grid, t_fast, e_fast), np.interp(grid, t_ref, e_ref), 1e-9)
    # Every emitted point is exact whichever walk produced it.
    for point in fast.frontier.points:
        ev = job.evaluate(job.flat(point))
        assert ev.time_s == point.time_s
        assert ev.energy_j == point.energy_j


def test_unknown_method_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown solver method"):
        trace(small_job(), method="quantum")


def test_candidates_are_made_on_a_worker_thread_while_the_walk_goes_on(monkeypatch):
    job = small_job("1f1b", 4, 6, seed=5)
    threads: list[str] = []
    make = walk._rounded_candidates

    def spy(*args):
        threads.append(threading.current_thread().name)
        return make(*args)

    monkeypatch.setattr(walk, "_rounded_candidates", spy)
    monkeypatch.setattr(walk, "_CHUNK_ITERATIONS", 3)
    trace(job)
    assert len(threads) > 1
    assert all(name.startswith("perseus-candidates") for name in threads), threads


def test_walk_resumed_in_small_chunks_gives_the_same_frontier(monkeypatch):
    job = small_job("1f1b", 4, 6, seed=5)
    whole = trace(job)
    monkeypatch.setattr(walk, "_CHUNK_ITERATIONS", 3)
    chunked = trace(job)
    assert chunked.iterations == whole.iterations
    assert chunked.frontier == whole.frontier
    np.testing.assert_array_equal(chunked.lp_energy_j, whole.lp_energy_j)


def _random_dag(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR successor lists (and predecessor pointers) of a random DAG on ``n`` nodes."""
    succ: list[list[int]] = [[] for _ in range(n)]
    preds = np.zeros(n, dtype=np.int64)
    for v in range(n):
        for w in range(v + 1, n):
            if rng.random() < 3 / n:
                succ[v].append(w)
                preds[w] += 1
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(s) for s in succ], out=succ_ptr[1:])
    succ_idx = np.array([w for s in succ for w in s], dtype=np.int64)
    pred_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(preds, out=pred_ptr[1:])
    return pred_ptr, succ_ptr, succ_idx


@pytest.mark.parametrize("log_slots", [None, 3], ids=["log", "log-overflowing"])
@pytest.mark.parametrize("seed", range(10))
def test_warm_started_min_cut_matches_scipy_after_every_change(seed, log_slots):
    # Small DAGs, and larger ones whose search trees lose whole subtrees to a change. The
    # min cut looks at the slots noted as changed; a log too small for them means all slots.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 12)) if seed < 6 else int(rng.integers(30, 60))
    pred_ptr, succ_ptr, succ_idx = _random_dag(rng, n)
    a_src, a_dst, ptr, to, twin, is_fwd, fs, rs = cut_network.build_network(
        n, pred_ptr, succ_ptr, succ_idx
    )
    m = a_src.size
    source, sink = 2 * n, 2 * n + 1
    capa = np.zeros(m, dtype=np.int64)
    res = np.zeros(2 * m, dtype=np.int64)
    stack = np.empty(4 * m + 8, dtype=np.int64), np.empty(4 * m + 8, dtype=np.int64)
    search = cut_network.search_arrays(2 * n + 2, res.size)
    if log_slots is not None:
        search = (*search[:-1], np.full(log_slots, -1, dtype=np.int64))
    side = np.zeros(2 * n + 2, dtype=np.bool_)
    # Only arcs in the adjacency may carry capacity (source arcs of sources, sink arcs of sinks).
    usable = np.array([fs[k] < ptr[-1] for k in range(m)])
    for _ in range(40):
        # Change a random handful of capacities (up and down), as a walk iteration does.
        for k in rng.choice(np.flatnonzero(usable), size=min(6, int(usable.sum())), replace=False):
            new_cap = np.int64(rng.integers(0, 20))
            network = (a_src, a_dst, ptr, to, twin, is_fwd, fs, rs)
            ok = cut_network.set_capacity(k, new_cap, (network, capa, res, *stack, search[-1]))
            assert ok
        side[:] = False
        assert cut_network.augment(source, sink, ptr, to, twin, res, search, side)
        flow = res[rs]
        assert np.all((flow >= 0) & (flow <= capa))
        net = np.zeros(2 * n + 2, dtype=np.int64)
        np.add.at(net, a_src, flow)
        np.add.at(net, a_dst, -flow)
        assert np.all(net[: 2 * n] == 0)  # conservation at every inner node
        graph = sp.csr_array((capa.astype(np.int32), (a_src, a_dst)), shape=(2 * n + 2,) * 2)
        graph.sum_duplicates()
        best = maximum_flow(graph, source, sink).flow_value
        assert net[source] == best
        crossing = side[a_src] & ~side[a_dst]
        assert capa[crossing].sum() == best  # the reported side is a minimum cut
        assert side[source] and not side[sink]
        # The minimal source side (the same for every maximum flow): all the residual reaches.
        reach, todo = {source}, [source]
        while todo:
            v = todo.pop()
            new = {int(to[a]) for a in range(ptr[v], ptr[v + 1]) if res[a] > 0} - reach
            reach |= new
            todo.extend(new)
        assert set(np.flatnonzero(side).tolist()) == reach


_SIGNATURES = """
from perseus.solver import compiled, cut_capacities, cut_network, trace
from tests.solver.conftest import small_job
trace(small_job("1f1b", 3, 5, seed=2))
helpers = [compiled._apply, compiled._emit, cut_network._cancel, cut_network.set_capacity]
helpers += [cut_capacities._price_op, cut_capacities._set_op_capacities]
helpers += [compiled._forward_again]
print([len(h.signatures) for h in helpers])
"""


@pytest.mark.slow
def test_each_walk_helper_is_compiled_for_one_signature_only(tmp_path):
    # A literal argument (0, True) at one call site makes numba compile a second
    # specialisation of the callee: first-run compile time for nothing. An empty kernel cache
    # (a fresh process) so that the helpers are compiled, not loaded with the walk.
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import JIT_ONLY

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", JIT_ONLY + _SIGNATURES],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == str([1] * 7)


def test_longest_path_pass_redone_for_changes_only_gives_the_full_pass_floats():
    from perseus.solver import compiled, plan_kernels

    rng = np.random.default_rng(7)
    n = 60
    pred_ptr, succ_ptr, succ_idx = _random_dag(rng, n)
    edges = [(v, int(w)) for v in range(n) for w in succ_idx[succ_ptr[v] : succ_ptr[v + 1]]]
    pred_idx = np.array([v for w in range(n) for v, x in edges if x == w], dtype=np.int64)
    succ_lat = rng.random(succ_idx.size) * 1e-3
    lat = {e: succ_lat[i] for i, e in enumerate(edges)}
    pred_lat = np.array([lat[(v, w)] for w in range(n) for v, x in edges if x == w])
    order = np.arange(n, dtype=np.int64)  # edges go from lower to higher nodes
    topo = (order, pred_ptr, pred_idx, pred_lat, succ_ptr, succ_idx, succ_lat)
    pos = np.arange(n, dtype=np.int64)
    kept = (pos, np.full(n, np.nan), np.zeros(n, np.int8))
    start, end = np.empty(n), np.empty(n)
    x = rng.random(n)
    for _ in range(30):
        # A few ops change, as in a walk step or a Newton trial.
        x[rng.choice(n, size=int(rng.integers(0, 5)), replace=False)] = rng.random()
        makespan = compiled._forward_again(topo, x, start, end, kept)
        full_start, full_end = np.empty(n), np.empty(n)
        expected = plan_kernels.forward_pass(
            order, pred_ptr, pred_idx, pred_lat, x, full_start, full_end
        )
        assert makespan == expected
        np.testing.assert_array_equal(start, full_start)
        np.testing.assert_array_equal(end, full_end)
        assert not kept[2].any()
