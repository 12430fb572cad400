"""A profile measured under a binding power cap: the options above the cap-bound clock are
collapsed into it before planning."""

from __future__ import annotations

from perseus.io import load_profile
from perseus.job import make_job
from perseus.profile.model import build_profile, cap_bound_clock_mhz
from perseus.runtime.planning import plan_from_profile
from perseus.schedule import Kind, build_schedule


def _capped_rows(stages: int = 2) -> list[tuple[int, Kind, int, float, float]]:
    """Like the A40 at 300 W: every request from 1500 to 1740 MHz runs at the same time and
    power (the cap holds the clock at 1500 MHz), below it time rises and power falls."""
    rows = []
    for stage in range(stages):
        for kind, t0 in ((Kind.F, 0.1), (Kind.B, 0.2)):
            for f in range(1740, 1004, -15):
                held = min(f, 1500)
                time_s = t0 * (0.3 + 0.7 * 1740 / held) / (0.3 + 0.7 * 1740 / 1500)
                noise = 1.0 + 0.004 * ((f // 15) % 3 - 1)  # measurement noise within 1 %
                power_w = 290.0 * (held / 1500) ** 2.2 * noise
                rows.append((stage, kind, f, time_s * noise, power_w * time_s))
    return rows


def test_cap_bound_clock_is_found_and_options_above_it_collapse() -> None:
    profile = build_profile(_capped_rows())
    op = profile.op(0, Kind.F)
    assert cap_bound_clock_mhz(op.options) == 1500
    collapsed = profile.collapse_cap_bound()
    assert collapsed.op(0, Kind.F).max_freq.freq_mhz == 1500
    assert all(o.freq_mhz <= 1500 for o in collapsed.op(1, Kind.B).options)
    assert collapsed.op(0, Kind.F).at(1200) == op.at(1200)  # below the cap: untouched
    assert collapsed.sha256 == profile.sha256  # plans name the measurement


def test_plans_from_a_cap_bound_profile_never_ask_above_the_cap_bound_clock() -> None:
    profile = build_profile(_capped_rows())
    schedule = build_schedule("1f1b", 2, 4)
    _, frontier = plan_from_profile(schedule, profile, 70.0, 0, None)
    asked = {f for point in frontier.points for rank in point.freqs_mhz for f in rank}
    assert max(asked) == 1500
    # Planned from the raw profile, the fastest plan asks for 1740 MHz, which never runs.
    raw = make_job(profile, "1f1b", 2, 4, blocking_power_w=70.0)
    assert raw.allmax()[0] == 1740


def test_the_bundled_a40_is_cap_bound_and_the_a100_is_not() -> None:
    a40, a100 = load_profile("a40"), load_profile("a100")
    assert set(a40.cap_bound_clocks().values()) <= set(range(1440, 1516))
    assert a100.cap_bound_clocks() == {}
    assert a100.collapse_cap_bound() is a100
