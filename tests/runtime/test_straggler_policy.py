"""The straggler policy: which plan non-straggler pipelines run, without flapping."""

from __future__ import annotations

import random

import pytest

from perseus.errors import ConfigError, InfeasibleError
from perseus.plan import Baseline, Frontier, JobSpec, PlanPoint
from perseus.runtime.straggler.policy import (
    PolicyState,
    StragglerPolicy,
    choose_plan_index,
    initial_state,
    step_policy,
)

# time_s, energy_j: energy falls until T* = 1.30 s, then a useless slower point.
_POINTS = [(1.00, 100.0), (1.05, 90.0), (1.10, 84.0), (1.20, 80.0), (1.30, 78.0), (1.40, 79.0)]
T_MIN, T_STAR = 1.00, 1.30
MIN_ENERGY_INDEX = 4


def _frontier(points: list[tuple[float, float]] = _POINTS) -> Frontier:
    job = JobSpec(
        schedule="1f1b",
        ranks=1,
        stages=1,
        microbatches=1,
        blocking_power_w=80.0,
        profile_sha256="x",
    )
    return Frontier(
        job=job,
        stage_ops=(("F0", "B0"),),
        baseline=Baseline(time_s=1.0, energy_j=110.0),
        points=tuple(PlanPoint(time_s=t, energy_j=e, freqs_mhz=((1410, 1410),)) for t, e in points),
    )


def test_below_t_min_runs_fastest() -> None:
    f = _frontier()
    assert choose_plan_index(f, 0.5) == 0
    choice = StragglerPolicy(f).decide(0.9)
    assert (choice.point_index, choice.reason) == (0, "fastest")


@pytest.mark.parametrize(
    ("t_prime", "expected"), [(1.05, 1), (1.07, 1), (1.10, 2), (1.29, 3), (1.30, 4)]
)
def test_between_t_min_and_t_star_runs_cheapest_within(t_prime: float, expected: int) -> None:
    f = _frontier()
    assert choose_plan_index(f, t_prime) == expected
    assert f.points[expected] == f.cheapest_within(t_prime)


@pytest.mark.parametrize("t_prime", [1.30, 1.35, 1.40, 2.0, 100.0])
def test_beyond_t_star_capped_at_min_energy(t_prime: float) -> None:
    f = _frontier()
    assert choose_plan_index(f, t_prime) == MIN_ENERGY_INDEX
    choice = StragglerPolicy(f, hysteresis=0.0).decide(t_prime)
    assert choice.point_index == MIN_ENERGY_INDEX
    assert choice.time_s == T_STAR
    assert choice.reason == "min-energy"


def test_agrees_with_cheapest_within_everywhere() -> None:
    f = _frontier()
    for i in range(100, 200):
        t = i / 100
        assert f.points[choose_plan_index(f, t)] == f.cheapest_within(t)
    with pytest.raises(InfeasibleError):
        f.cheapest_within(0.99)


def test_chosen_plan_never_slower_than_t_prime_with_margin() -> None:
    policy = StragglerPolicy(_frontier(), hysteresis=0.02, smoothing=1.0)
    for t in (1.06, 1.12, 1.25, 1.5):
        choice = policy.decide(t)
        assert choice.time_s <= t * (1 - 0.02) or choice.point_index == 0


def test_straggler_keeps_fastest_plan() -> None:
    policy = StragglerPolicy(_frontier())
    policy.decide(1.2)
    choice = policy.decide(1.2, is_straggler=True)
    assert (choice.point_index, choice.reason) == (0, "straggler")


def test_recovery_reverts_to_fastest() -> None:
    policy = StragglerPolicy(_frontier(), hysteresis=0.01, smoothing=1.0)
    assert policy.decide(1.25).point_index == 3
    choice = policy.decide(1.0)
    assert choice.point_index == 0
    assert choice.switched
    assert policy.state.switches == 2


def test_noisy_observations_do_not_flap() -> None:
    rng = random.Random(7)
    policy = StragglerPolicy(_frontier(), hysteresis=0.02, smoothing=0.3)
    # A straggler at 1.10 s measured with ±1.5 % noise: the plan must settle and stay.
    choices = [policy.decide(1.10 * (1 + rng.uniform(-0.015, 0.015))) for _ in range(500)]
    assert policy.state.switches <= 2
    assert len({c.point_index for c in choices[50:]}) == 1


def test_noise_straddling_a_plan_boundary_without_hysteresis_flaps() -> None:
    # The control case: with no hysteresis and no smoothing, noise around the 1.10 s plan
    # boundary switches plans repeatedly, which is what the band prevents.
    rng = random.Random(3)
    flappy = StragglerPolicy(_frontier(), hysteresis=0.0, smoothing=1.0)
    steady = StragglerPolicy(_frontier(), hysteresis=0.02, smoothing=0.3)
    for _ in range(300):
        t = 1.10 * (1 + rng.uniform(-0.01, 0.01))
        flappy.decide(t)
        steady.decide(t)
    assert flappy.state.switches > 20
    assert steady.state.switches <= 2


def test_step_policy_is_pure_and_matches_object() -> None:
    f = _frontier()
    state = initial_state()
    policy = StragglerPolicy(f, hysteresis=0.01, smoothing=0.5)
    for t in (1.0, 1.2, 1.21, 1.4, 1.05, 1.0):
        before = state
        state, choice = step_policy(f, state, t, hysteresis=0.01, smoothing=0.5)
        assert before == initial_state() or before is not state
        assert choice == policy.decide(t)
        assert state == policy.state
    assert isinstance(state, PolicyState)


def test_two_ranks_with_same_observations_agree() -> None:
    f = _frontier()
    a, b = StragglerPolicy(f), StragglerPolicy(f)
    rng = random.Random(11)
    for _ in range(200):
        t = rng.uniform(0.95, 1.5)
        assert a.decide(t) == b.decide(t)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_observation_is_config_error(bad: float) -> None:
    with pytest.raises(ConfigError, match="positive"):
        StragglerPolicy(_frontier()).decide(bad)


@pytest.mark.parametrize(
    ("hysteresis", "smoothing"), [(-0.1, 0.5), (0.6, 0.5), (0.01, 0.0), (0.01, 1.5)]
)
def test_bad_parameters_are_config_errors(hysteresis: float, smoothing: float) -> None:
    with pytest.raises(ConfigError):
        StragglerPolicy(_frontier(), hysteresis=hysteresis, smoothing=smoothing)


def test_reset_returns_to_fastest() -> None:
    policy = StragglerPolicy(_frontier())
    policy.decide(1.3)
    policy.reset()
    assert policy.state == initial_state()
