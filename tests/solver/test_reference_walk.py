"""The numpy walk against the compiled one: the same cuts, the same frontier, point for point;
and its exact min cut (the minimal source side) against a brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from perseus.plan import points_sha256
from perseus.solver import trace
from perseus.solver.cut_network import INF_CAP

from .conftest import CASES, small_job
from .oracles.maxflow import minimal_source_side
from .oracles.reference_walk import walk_chunk


def _same_walk(job, **kwargs) -> None:
    fast = trace(job, **kwargs)
    ref = trace(job, method=walk_chunk, **kwargs)
    assert ref.frontier.points == fast.frontier.points
    assert points_sha256(ref.frontier.points) == points_sha256(fast.frontier.points)
    # Step for step: the same breakpoints, candidates and ending.
    assert (ref.iterations, ref.candidates, ref.stop_reason) == (
        fast.iterations,
        fast.candidates,
        fast.stop_reason,
    )
    np.testing.assert_array_equal(ref.lp_time_s, fast.lp_time_s)
    np.testing.assert_array_equal(ref.lp_energy_j, fast.lp_energy_j)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in CASES])
def test_reference_walk_gives_the_compiled_frontier_point_for_point(case):
    schedule, stages, microbatches, virtual, seed = case
    _same_walk(small_job(schedule, stages, microbatches, seed=seed, virtual_stages=virtual))


def test_reference_walk_matches_with_every_breakpoint_and_a_quantum():
    job = small_job("1f1b", 4, 6, seed=5)
    _same_walk(job, min_gap_fraction=0.0)
    _same_walk(job, time_quantum_s=0.01)


@pytest.mark.slow
def test_reference_walk_gives_the_demo_frontier():
    from perseus.cli.demo import DEMO_JOB
    from perseus.io import load_profile
    from perseus.job import make_job

    job = make_job(
        load_profile(str(DEMO_JOB["profile"])),
        str(DEMO_JOB["schedule"]),
        int(DEMO_JOB["stages"]),
        int(DEMO_JOB["microbatches"]),
        blocking_power_w=float(DEMO_JOB["blocking_power_w"]),
    )
    _same_walk(job)


def _brute_minimal_side(n, src, dst, cap, source, sink):
    """Every s-t cut tried: the least capacity, and the smallest source side among the
    minimum cuts (the minimal one is their intersection, itself a minimum cut)."""
    inner = [v for v in range(n) if v not in (source, sink)]
    best, sides = None, []
    for bits in itertools.product([False, True], repeat=len(inner)):
        side = np.zeros(n, dtype=bool)
        side[source] = True
        side[inner] = bits
        value = sum(int(c) for c in cap[side[src] & ~side[dst]])  # no int64 overflow
        if best is None or value < best:
            best, sides = value, [side]
        elif value == best:
            sides.append(side)
    return best, np.logical_and.reduce(sides)


@pytest.mark.parametrize("seed", range(12))
def test_minimal_source_side_is_the_exact_minimal_min_cut(seed):
    # Capacities on the walk's scale (up to 2**52, beyond scipy's int32), ties included, and
    # infinite arcs: the cut must be exact, and the smallest of the minimum cuts.
    rng = np.random.default_rng(seed)
    n, source, sink = 8, 0, 7
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.45]
    src = np.array([a for a, _ in pairs], dtype=np.int64)
    dst = np.array([b for _, b in pairs], dtype=np.int64)
    base = rng.integers(1, 4, size=src.size) * 2**50 + rng.integers(0, 3, size=src.size)
    cap = np.where(rng.random(src.size) < 0.25, INF_CAP, base).astype(np.int64)
    side = minimal_source_side(n, src, dst, cap, source, sink)
    best, minimal = _brute_minimal_side(n, src, dst, cap, source, sink)
    if best >= INF_CAP:
        assert side is None
        return
    assert side is not None
    assert sum(int(c) for c in cap[side[src] & ~side[dst]]) == best
    np.testing.assert_array_equal(side, minimal)


def test_minimal_source_side_is_none_when_only_infinite_cuts_exist():
    src = np.array([0, 1, 0], dtype=np.int64)
    dst = np.array([1, 2, 2], dtype=np.int64)
    cap = np.array([INF_CAP, INF_CAP, 2**52], dtype=np.int64)
    assert minimal_source_side(3, src, dst, cap, 0, 2) is None
    cap[1] = 2**51 + 1
    side = minimal_source_side(3, src, dst, cap, 0, 2)
    assert side is not None and side.tolist() == [True, True, False]
