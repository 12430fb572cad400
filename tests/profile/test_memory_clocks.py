"""Clock pairs in profiles and phased ops: lookup, validation, canonical forms, pricing."""

from __future__ import annotations

import pytest

from perseus.errors import PlanError, ProfileError
from perseus.profile import build_profile
from perseus.profile.model import OpOption
from perseus.profile.two_clock import (
    Phase,
    build_layer_split,
    op_clocks,
    op_phases,
    phased_cost,
    phases_op,
)
from perseus.schedule import Kind


def _pair_rows():
    rows = []
    for kind, scale in ((Kind.F, 1.0), (Kind.B, 2.0)):
        for f in (1400, 1000):
            for mem, slow in ((7000, 1.0), (5000, 1.1)):
                t = scale * slow * 1400 / f
                rows.append((0, kind, f, t, t * f / 10, mem))
    return rows


def test_options_are_pairs_and_a_plain_clock_means_the_default_memory_clock():
    p = build_profile(_pair_rows())
    op = p.op(0, Kind.F)
    assert op.has_memory_clocks
    assert [o.clocks for o in op.options] == [
        (1400, 7000),
        (1400, 5000),
        (1000, 7000),
        (1000, 5000),
    ]
    assert op.max_freq.clocks == (1400, 7000)
    assert op.at(1000).mem_freq_mhz == 7000  # the highest memory clock at that SM clock
    assert op.at(1000, 5000).time_s == pytest.approx(1.1 * 1.4)
    with pytest.raises(KeyError):
        op.at(1000, 6000)


def test_rows_without_memory_clock_hash_as_before_and_pairs_hash_differently():
    plain = [(0, Kind.F, 1400, 1.0, 2.0), (0, Kind.B, 1400, 2.0, 4.0)]
    explicit_none = [(*r, None) for r in plain]
    with_mem = [(*r, 7000) for r in plain]
    assert build_profile(plain).sha256 == build_profile(explicit_none).sha256
    assert build_profile(plain).sha256 != build_profile(with_mem).sha256


def test_mixed_and_duplicate_pairs_are_refused():
    rows = _pair_rows()
    with pytest.raises(ProfileError, match="duplicate row"):
        build_profile([*rows, rows[0]])
    with pytest.raises(ProfileError, match="some rows of this op name a memory clock"):
        build_profile([*rows, (0, Kind.F, 900, 3.0, 3.0, None)])


def test_op_forms_read_as_phases_and_write_canonically():
    assert op_phases(1410) == (Phase(1410, None, 0),)
    assert op_phases([1410, 1200, 3]) == (Phase(1410, None, 0), Phase(1200, None, 3))
    assert op_phases([1410, 1410, 3]) == (Phase(1410, None, 0),)
    phased = [[1410, 7251, 0], [1410, 7251, 2], [900, 5001, 4]]
    assert op_phases(phased) == (Phase(1410, 7251, 0), Phase(900, 5001, 4))
    assert phases_op(op_phases(phased)) == ((1410, 7251, 0), (900, 5001, 4))
    assert phases_op(op_phases([[1410, None, 0], [1200, None, 5]])) == (1410, 1200, 5)
    assert phases_op(op_phases([[1410, None, 0]])) == 1410
    for bad, match in (
        ([[1410, None, 1]], "start at layer 0"),
        ([[1410, None, 0], [900, None, 0]], "increasing layers"),
        ([[1410, None]], "a phase is"),
    ):
        with pytest.raises(PlanError, match=match):
            op_phases(bad)


def test_sm_only_consumers_refuse_memory_clocks_but_read_two_phases():
    assert op_clocks([[1410, None, 0], [1200, None, 4]]) == (1410, 1200, 4)
    with pytest.raises(PlanError, match="memory clocks or more than two phases"):
        op_clocks([[1410, 7251, 0]])


def test_phased_cost_mixes_the_phases_and_charges_stalls():
    a, b, c = OpOption(1400, 1.0, 300.0), OpOption(1000, 1.3, 260.0), OpOption(800, 1.6, 250.0)
    # three phases, no latency: the layer-weighted mix
    free = build_layer_split([4], 1, switch_latency_s=0.0)
    t, e = phased_cost((a, b, c), (0.25, 0.75), free)
    assert t == pytest.approx(0.25 * 1.0 + 0.5 * 1.3 + 0.25 * 1.6)
    assert e == pytest.approx(0.25 * 300 + 0.5 * 260 + 0.25 * 250)
    stalled = build_layer_split([4], 1, switch_latency_s=0.0, switch_stall_s=0.01)
    t2, e2 = phased_cost((a, b, c), (0.25, 0.75), stalled)
    assert t2 == pytest.approx(t + 0.02)
    assert e2 == pytest.approx(e + 0.01 * 260 / 1.3 + 0.01 * 250 / 1.6)
