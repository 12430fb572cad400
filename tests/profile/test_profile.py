from __future__ import annotations

import pytest

from perseus.errors import ProfileError
from perseus.io import load_profile
from perseus.profile import OpOption, build_profile, pareto_options
from perseus.schedule import Kind


def test_bundled_profiles_load():
    a100 = load_profile("a100")
    assert a100.num_stages == 8
    assert a100.kinds == (Kind.F, Kind.B)
    op = a100.op(0, Kind.F)
    assert op.max_freq.freq_mhz == 1410
    assert len(op.options) == 38
    assert [o.freq_mhz for o in op.options] == sorted(
        (o.freq_mhz for o in op.options), reverse=True
    )
    a40 = load_profile("a40")
    assert a40.op(7, Kind.B).max_freq.freq_mhz == 1740
    assert len(a40.op(7, Kind.B).options) == 60


def test_split_backward_conserves_time_and_energy():
    p = load_profile("a100")
    split = p.split_backward(0.4)
    assert split.has_weight
    b, w, full = (
        split.op(3, Kind.B).at(1200),
        split.op(3, Kind.W).at(1200),
        p.op(3, Kind.B).at(1200),
    )
    assert b.time_s + w.time_s == pytest.approx(full.time_s)
    assert b.energy_j == pytest.approx(0.4 * full.energy_j)
    assert split.split_backward(0.5) is split
    with pytest.raises(ProfileError, match=r"\(0, 1\)"):
        p.split_backward(1.0)


def test_hash_ignores_row_order():
    rows = [(0, Kind.F, 1000, 1.0, 2.0), (0, Kind.B, 1000, 2.0, 4.0), (0, Kind.F, 900, 1.1, 1.9)]
    assert build_profile(rows).sha256 == build_profile(rows[::-1]).sha256
    assert (
        build_profile(rows).sha256 != build_profile([*rows[:2], (0, Kind.F, 900, 1.1, 1.8)]).sha256
    )


def test_pareto_uses_effective_energy():
    fast = OpOption(1400, 1.0, 10.0)
    slow_cheaper_effective = OpOption(1000, 1.5, 10.2)  # +0.2 J raw but 0.5 s less idle at 1 W
    slow_worse = OpOption(900, 2.0, 12.0)
    assert pareto_options([fast, slow_cheaper_effective, slow_worse], 1.0) == (
        fast,
        slow_cheaper_effective,
    )
    assert pareto_options([fast, slow_cheaper_effective], 0.0) == (fast,)
