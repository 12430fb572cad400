"""The straggler what-if: job-level savings vs slowdown factor."""

from __future__ import annotations

import itertools
import math

import pytest

from perseus.errors import ConfigError
from perseus.io.bundled import load_profile
from perseus.job import make_job
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.straggler.sweep import StragglerCase, parse_factors, straggler_sweep

RANKS, POWER_W = 4, 80.0
# Fastest 1.0 s / 900 J (all-max is 1.0 s / 1000 J); T* = 1.3 s at 700 J.
_POINTS = [(1.0, 900.0), (1.1, 800.0), (1.2, 740.0), (1.3, 700.0)]


def _frontier() -> Frontier:
    job = JobSpec(
        schedule="1f1b",
        ranks=RANKS,
        stages=4,
        microbatches=4,
        blocking_power_w=POWER_W,
        profile_sha256="x",
    )
    return Frontier(
        job=job,
        stage_ops=tuple(("F0", "B0") for _ in range(RANKS)),
        baseline=Baseline(time_s=1.0, energy_j=1000.0),
        points=tuple(
            PlanPoint(time_s=t, energy_j=e, freqs_mhz=tuple((1410, 1410) for _ in range(RANKS)))
            for t, e in _POINTS
        ),
    )


def test_hand_computed_case() -> None:
    (case,) = straggler_sweep(_frontier(), pipelines=3, factors=[1.2])
    wait = RANKS * POWER_W
    # Two others: all-max 1000 J + 0.2 s wait; Perseus: the 1.2 s plan, no wait.
    allmax = 2 * (1000 + wait * 0.2) + 1.2 * 1000
    perseus = 2 * 740 + 1.2 * 900
    fastest = 2 * (900 + wait * 0.2) + 1.2 * 900
    assert case.plan_index == 2
    assert case.job_time_s == pytest.approx(1.2)
    assert case.allmax_energy_j == pytest.approx(allmax)
    assert case.perseus_energy_j == pytest.approx(perseus)
    assert case.fastest_energy_j == pytest.approx(fastest)
    assert case.saving_vs_allmax == pytest.approx(1 - perseus / allmax)
    assert case.saving_vs_fastest == pytest.approx(1 - perseus / fastest)


def test_no_straggler_saves_only_the_intrinsic_share() -> None:
    (case,) = straggler_sweep(_frontier(), pipelines=8, factors=[1.0])
    assert case.plan_index == 0
    assert case.saving_vs_fastest == pytest.approx(0.0)
    assert case.saving_vs_allmax == pytest.approx(1 - 900 / 1000)


def test_others_never_slower_than_the_straggler_and_capped_at_t_star() -> None:
    f = _frontier()
    for case in straggler_sweep(f, pipelines=4, factors=parse_factors("1.0:2.0:0.01")):
        assert case.plan_time_s <= case.straggler_time_s * (1 + 1e-12)
        assert case.plan_time_s <= f.min_energy.time_s
        assert case.job_time_s == pytest.approx(max(case.straggler_time_s, f.baseline.time_s))


def _peak_then_slow_decline(cases: tuple[StragglerCase, ...], s_star: float) -> None:
    savings = [c.saving_vs_allmax for c in cases]
    peak = max(range(len(cases)), key=savings.__getitem__)
    step = cases[1].factor - cases[0].factor
    assert abs(cases[peak].factor - s_star) <= step + 1e-9, (cases[peak].factor, s_star)
    after = savings[peak:]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(after))
    # "Declines slowly": each further 5 % of slowdown costs well under a point of saving.
    assert all(a - b < 0.01 for a, b in itertools.pairwise(after))
    assert savings[-1] > 0.5 * savings[peak]


def test_synthetic_shape_peaks_at_t_star() -> None:
    f = _frontier()
    cases = straggler_sweep(f, pipelines=16, factors=parse_factors("1.0:2.0:0.05"))
    # A 4-point frontier is a staircase, so savings need not rise monotonically before T*;
    # the peak and the slow decline after it hold regardless.
    _peak_then_slow_decline(cases, f.min_energy.time_s / f.fastest.time_s)


def test_each_factor_picks_cheapest_within_without_a_scan_of_the_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ties in energy, in time and whole duplicates pick the point cheapest_within picks; no
    factor scans the points (10,000 factors over a 100,000-point frontier took ~21 min)."""
    ties = [(1.0, 900.0), (1.1, 800.0), (1.1, 800.0), (1.2, 800.0), (1.2, 760.0), (1.3, 760.0)]
    f = _frontier().with_points(
        tuple(
            PlanPoint(time_s=t, energy_j=e, freqs_mhz=tuple((1410, 1410) for _ in range(RANKS)))
            for t, e in ties
        )
    )
    factors = [1.0, 1.05, 1.1, 1.1 + 1e-13, 1.15, 1.2, 1.25, 1.3, 2.0]
    expected = []
    for s in factors:
        plan = f.cheapest_within(s * f.fastest.time_s)
        expected.append(f.points.index(plan))
    calls: list[float] = []
    monkeypatch.setattr(Frontier, "cheapest_within", lambda self, t: calls.append(t))
    cases = straggler_sweep(f, pipelines=4, factors=factors)
    assert [c.plan_index for c in cases] == expected == [0, 0, 1, 1, 1, 4, 4, 5, 5]
    assert calls == []


def test_more_pipelines_save_more() -> None:
    f = _frontier()
    few = straggler_sweep(f, pipelines=2, factors=[1.2])[0]
    many = straggler_sweep(f, pipelines=128, factors=[1.2])[0]
    assert many.saving_vs_allmax > few.saving_vs_allmax


def test_records_are_frozen() -> None:
    case = straggler_sweep(_frontier(), pipelines=2, factors=[1.1])[0]
    with pytest.raises(AttributeError):
        case.factor = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("pipelines", "factors", "match"),
    [
        (1, [1.1], "pipelines"),
        (4, [0.9], r"in \[1, 1000\]"),
        (4, [math.nan], r"in \[1, 1000\]"),
        (4, [], "no slowdown"),
    ],
)
def test_bad_inputs(pipelines: int, factors: list[float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        straggler_sweep(_frontier(), pipelines=pipelines, factors=factors)


def test_parse_factors() -> None:
    assert parse_factors("1.05:1.5:0.05") == pytest.approx([1.05 + 0.05 * i for i in range(10)])
    assert parse_factors("1.0:1.5:0.05")[4] == 1.2
    assert parse_factors("1.1,1.3") == (1.1, 1.3)
    assert parse_factors("1.2:1.2:0.1") == (1.2,)


@pytest.mark.parametrize("text", ["abc", "1:2", "1:2:0", "2:1:0.1", "1:2:x", "1:1e9:1e-9"])
def test_parse_factors_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="`factors`"):
        parse_factors(text)


def _solved(microbatches: int) -> Frontier:
    from perseus.solver import trace_frontier

    job = make_job(load_profile("a100"), "1f1b", 8, microbatches, blocking_power_w=83.64)
    return trace_frontier(job)


def test_real_frontier_shape_small() -> None:
    f = _solved(8)
    cases = straggler_sweep(f, pipelines=16, factors=parse_factors("1.0:1.5:0.05"))
    s_star = f.min_energy.time_s / f.fastest.time_s
    rising = [c.saving_vs_allmax for c in cases if c.factor <= s_star]
    assert all(b > a for a, b in itertools.pairwise(rising))
    _peak_then_slow_decline(cases, f.min_energy.time_s / f.fastest.time_s)


@pytest.mark.slow
def test_gpt3_a100_8x96_16_pipelines_peaks_near_t_star() -> None:
    """The README table: savings peak near T* and decline slowly after it."""
    f = _solved(96)
    cases = straggler_sweep(f, pipelines=16, factors=parse_factors("1.05:1.5:0.05"))
    _peak_then_slow_decline(cases, f.min_energy.time_s / f.fastest.time_s)
    assert 0.2 < max(c.saving_vs_allmax for c in cases) < 0.4


def test_all_max_job_waits_for_its_own_straggler_not_t_prime() -> None:
    # A one-plan file (`perseus plan pick`) slower than all-max: with no straggler the saving
    # vs all-max is the plan's own 1 - E/E_allmax; the all-max job's others used to wait until
    # T' = s·T_plan (23.6 % printed for a 21.9 % plan).
    f = _frontier()
    plan = f.with_points([f.points[2]])  # 1.2 s, 740 J; all-max 1.0 s, 1000 J
    no_straggler, slowed = straggler_sweep(plan, pipelines=3, factors=[1.0, 1.5])
    assert no_straggler.saving_vs_allmax == pytest.approx(1 - 740 / 1000)
    wait = RANKS * POWER_W
    allmax = 2 * (1000 + wait * 0.5) + 1.5 * 1000  # all-max straggler: 1.5 s
    perseus = 2 * (740 + wait * (1.8 - 1.2)) + 1.5 * 740  # T' = 1.8 s
    assert slowed.allmax_energy_j == pytest.approx(allmax)
    assert slowed.perseus_energy_j == pytest.approx(perseus)
