"""The two-clock cost model: layer-weighted mix plus the switch cost."""

from __future__ import annotations

import pytest

from perseus.profile import OpOption, TwoClockOp, build_layer_split, op_clocks
from perseus.profile.two_clock import phased_cost


def test_op_clocks_normalises_plan_ops():
    assert op_clocks(1200) == TwoClockOp(1200, 1200, 0)
    assert op_clocks([1410, 1005, 5]) == TwoClockOp(1410, 1005, 5)
    assert op_clocks((1410, 1410, 5)) == TwoClockOp(1410, 1410, 0)
    assert op_clocks([1410, 1005, 5]).is_two_clock
    assert not op_clocks(900).is_two_clock


def test_mix_is_layer_weighted_and_the_old_clock_runs_through_the_set_latency():
    fast, slow = OpOption(1410, 0.10, 40.0), OpOption(1005, 0.14, 30.0)
    even = build_layer_split([4], 1, switch_latency_s=0.0)
    assert phased_cost((fast, slow), (even.work_before(0, 1),), even) == pytest.approx((0.13, 32.5))
    late = build_layer_split([4], 1, switch_latency_s=0.01, switch_energy_j=0.5)
    # 10 ms at 1410 MHz is another 10 % of the op's work at the old clock.
    assert phased_cost((fast, slow), (late.work_before(0, 1),), late) == pytest.approx(
        (0.35 * 0.10 + 0.65 * 0.14, 0.35 * 40 + 0.65 * 30 + 0.5)
    )
    # The switch can land past the op's end: then the op runs at the old clock throughout.
    assert phased_cost((fast, slow), (0.95,), late)[0] == pytest.approx(0.10)


def test_per_layer_profile_replaces_the_even_split():
    split = build_layer_split([3], 1, layer_time_fractions=[[2.0, 1.0, 1.0]])
    assert split.work_before(0, 1) == pytest.approx(0.5)
    assert build_layer_split([3, 5], 2).num_layers(1) == 5
