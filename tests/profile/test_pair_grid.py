"""A pair sweep (coarse grid, refined near the hull) finds the full grid's hull."""

from __future__ import annotations

import pytest

from perseus.device.power_model import with_memory_clocks
from perseus.device.presets import A40_MEMORY
from perseus.io import load_profile
from perseus.profile.pair_grid import _hull, coarse_pair_grid, next_pairs
from perseus.schedule import Kind

POWER_W = 70.38


def test_coarse_grid_keeps_both_ends_at_every_memory_clock():
    grid = coarse_pair_grid([1740, 1725, 1710, 1695, 1680], [7251, 5001], stride=3)
    assert grid == (
        (1740, 7251),
        (1695, 7251),
        (1680, 7251),
        (1740, 5001),
        (1695, 5001),
        (1680, 5001),
    )
    with pytest.raises(ValueError):
        coarse_pair_grid([1740], [7251], stride=0)


@pytest.mark.parametrize("kind", [Kind.F, Kind.B])
def test_refinement_finds_the_full_hull_with_far_fewer_measurements(kind):
    op = with_memory_clocks(load_profile("a40"), A40_MEMORY).op(3, kind)
    table = {o.clocks: o for o in op.options}
    sm = sorted({o.freq_mhz for o in op.options}, reverse=True)
    measured = [table[p] for p in coarse_pair_grid(sm, A40_MEMORY.clocks_mhz, stride=4)]
    rounds = 0
    while todo := next_pairs(measured, sm, POWER_W):
        measured += [table[p] for p in todo]
        rounds += 1
    assert rounds <= 10
    assert [o.clocks for o in _hull(measured, POWER_W)] == [
        o.clocks for o in _hull(op.options, POWER_W)
    ]
    assert len(measured) < 0.5 * len(op.options)
