"""Baseline plans at many stages: work and memory grow with the nodes, not ranks x stages."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from perseus.dag.evaluate import node_ops
from perseus.solver import baselines
from tests.solver.conftest import small_job


class _CountedEq(np.ndarray):
    """An array that counts its ``==`` comparisons (a mask per rank is one each)."""

    compared = 0

    def __eq__(self, other):  # type: ignore[override]
        type(self).compared += 1
        return super().__eq__(other)


def _reference_rank_freqs(job, freqs_mhz):
    """Per node, its op's highest clock at most its rank's clock, one node at a time."""
    g, out = job.graph, []
    for r, op in zip(g.rank.tolist(), node_ops(g, job.profile), strict=True):
        options = op.options
        fits = [o.freq_mhz for o in options if o.freq_mhz <= freqs_mhz[r]]
        out.append(fits[0] if fits else options[-1].freq_mhz)
    return out


@pytest.mark.parametrize(
    ("schedule", "stages", "microbatches", "virtual_stages"),
    [("1f1b", 4, 6, 1), ("gpipe", 3, 4, 1), ("interleaved", 8, 8, 2), ("interleaved", 6, 6, 3)],
)
def test_rank_freqs_match_the_per_node_rule(schedule, stages, microbatches, virtual_stages):
    job = small_job(schedule, stages, microbatches, clocks=6, virtual_stages=virtual_stages)
    ranks = job.graph.num_ranks
    for freqs in ([1400] * ranks, [900] * ranks, [1400 - 150 * r for r in range(ranks)]):
        got = baselines._rank_freqs(job, freqs)
        assert got.tolist() == _reference_rank_freqs(job, freqs)


def test_rank_freqs_memory_follows_the_nodes_not_ranks_times_stages():
    # The dense ranks x stages x kinds table was 400 MB at 4096 stages, per global clock.
    job = small_job("1f1b", 256, 1, clocks=2)
    freqs = [1400] * job.graph.num_ranks
    tracemalloc.start()
    try:
        baselines._rank_freqs(job, freqs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    dense = 256 * 256 * 3 * 8
    assert peak < dense // 4


def test_per_stage_finds_each_ranks_stages_in_one_pass():
    # A mask per rank over every node was O(ranks x nodes): 5 s at 4096 stages x 122.
    job = small_job("interleaved", 8, 8, clocks=4, virtual_stages=2)
    expected = baselines._per_stage_freqs(job)
    counted = job.graph.rank.view(_CountedEq)
    graph = dataclasses.replace(job.graph, rank=counted)
    _CountedEq.compared = 0
    got = baselines._per_stage_freqs(dataclasses.replace(job, graph=graph))
    assert got.tolist() == expected.tolist()
    assert _CountedEq.compared == 0
