"""The cost, the bandit's posterior and the batch-size policy's rules (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.recurring.bandit import (
    ArmPosterior,
    GaussianPrior,
    pooled_rel_std,
    posteriors,
    thompson_sample,
)
from perseus.recurring.cost import PowerLimitMeasurement, best_power_limit_w, zeus_cost
from perseus.recurring.policy import BatchSizeOptimizer, HistoryTally, Observation

SIZES = (8, 16, 32, 64, 128)


def obs(bs: int, cost: float, reached: bool = True) -> Observation:
    return Observation(bs, 100.0, cost, 0.0, cost, reached)


def test_zeus_cost_weights_energy_and_time() -> None:
    assert zeus_cost(1000.0, 10.0, 1.0, 300.0) == 1000.0
    assert zeus_cost(1000.0, 10.0, 0.0, 300.0) == 3000.0
    assert zeus_cost(1000.0, 10.0, 0.5, 300.0) == 2000.0


def test_best_power_limit_minimises_cost_per_sample_and_ties_go_high() -> None:
    m = {
        300.0: PowerLimitMeasurement(300.0, 100.0, 280.0),
        200.0: PowerLimitMeasurement(200.0, 90.0, 190.0),
        100.0: PowerLimitMeasurement(100.0, 40.0, 100.0),
    }
    # η = 1: energy per sample 2.8, 2.11, 2.5 J -> 200 W.
    assert best_power_limit_w(m, 1.0, 300.0) == 200.0
    # η = 0: time only -> the fastest.
    assert best_power_limit_w(m, 0.0, 300.0) == 300.0
    tie = {w: PowerLimitMeasurement(w, 10.0, 50.0) for w in (150.0, 250.0)}
    assert best_power_limit_w(tie, 0.5, 300.0) == 250.0
    with pytest.raises(ConfigError):
        best_power_limit_w({}, 0.5, 300.0)


def test_pooled_noise_matches_hand_computation() -> None:
    prior = GaussianPrior(rel_std=0.1, weight=2.0)
    samples = {8: [90.0, 110.0], 16: [50.0], 32: [200.0, 200.0, 260.0]}
    ss = (0.1**2 + 0.1**2) + sum(((x - 220.0) / 220.0) ** 2 for x in (200.0, 200.0, 260.0))
    expected = math.sqrt((2.0 * 0.01 + ss) / (2.0 + 1 + 2))
    assert pooled_rel_std(samples, prior) == pytest.approx(expected)
    assert pooled_rel_std({}, prior) == pytest.approx(0.1)


def test_posterior_update_narrows_with_observations_and_tracks_the_mean() -> None:
    prior = GaussianPrior()
    one = posteriors({8: [100.0]}, prior)[8]
    assert one == ArmPosterior(mean=100.0, std=pytest.approx(10.0), count=1)
    four = posteriors({8: [100.0, 100.0, 100.0, 100.0]}, prior)[8]
    # Same mean; std shrinks by sqrt(4) and by the data's zero scatter in the pooled noise.
    assert four.mean == 100.0 and four.std < one.std / 2
    shifted = posteriors({8: [100.0, 140.0]}, prior)[8]
    assert shifted.mean == pytest.approx(120.0)


def test_thompson_sampling_prefers_the_cheap_arm_and_is_seeded() -> None:
    arms = {8: ArmPosterior(100.0, 5.0, 3), 16: ArmPosterior(130.0, 5.0, 3)}
    picks = [thompson_sample(arms, np.random.default_rng(s)) for s in range(200)]
    assert picks.count(8) > 190
    a = [thompson_sample(arms, np.random.default_rng(7)) for _ in range(3)]
    assert a == [a[0]] * 3
    assert thompson_sample({8: ArmPosterior(1.0, 0.0, 1)}, np.random.default_rng(0)) == 8


def test_first_run_is_the_default_and_no_limit_before_a_convergence() -> None:
    policy = BatchSizeOptimizer(SIZES, 64)
    d = policy.decide([], np.random.default_rng(0))
    assert (d.batch_size, d.phase, d.cost_limit) == (64, "default", None)


def test_walk_goes_down_while_it_improves_and_never_up() -> None:
    policy = BatchSizeOptimizer(SIZES, 64)
    rng = np.random.default_rng(0)
    history = [obs(64, 100.0)]
    assert policy.decide(history, rng).batch_size == 32
    history.append(obs(32, 60.0))
    assert policy.decide(history, rng).batch_size == 16
    history.append(obs(16, 200.0))  # clearly worse: the walk stops
    for _ in range(20):
        d = policy.decide(history, rng)
        assert d.phase == "thompson" and d.batch_size in (32, 64)
        assert 128 not in (d.batch_size,)


def test_walk_turns_up_when_the_smaller_neighbour_is_worse() -> None:
    policy = BatchSizeOptimizer(SIZES, 64)
    history = [obs(64, 100.0), obs(32, 300.0)]
    assert policy.decide(history, np.random.default_rng(0)).batch_size == 128


def test_early_stop_limit_is_beta_times_the_cheapest_converged_run() -> None:
    policy = BatchSizeOptimizer(SIZES, 64, beta=2.5)
    history = [obs(64, 100.0), obs(32, 80.0), obs(16, 10.0, reached=False)]
    assert policy.cost_limit(history) == pytest.approx(200.0)
    assert policy.decide(history, np.random.default_rng(0)).cost_limit == pytest.approx(200.0)


def test_failed_runs_are_penalised_and_a_never_converging_arm_is_pruned() -> None:
    policy = BatchSizeOptimizer(SIZES, 64)
    history = [obs(64, 100.0), obs(32, 80.0), obs(16, 50.0, reached=False)]
    costs = policy.arm_costs(history)
    assert costs[16] == [pytest.approx(160.0)]  # max(incurred 50, 2 x 80)
    rng = np.random.default_rng(1)
    chosen = {policy.decide(history, rng).batch_size for _ in range(50)}
    assert 16 not in chosen  # tried and failed: neither explored again nor sampled
    # A failure of a converging arm counts against it, through its mean.
    history2 = [obs(64, 100.0), obs(32, 300.0), obs(128, 90.0), obs(128, 10.0, reached=False)]
    assert policy.arm_costs(history2)[128] == [90.0, pytest.approx(180.0)]


def test_pending_runs_are_not_explored_twice() -> None:
    policy = BatchSizeOptimizer(SIZES, 64)
    history = [obs(64, 100.0)]
    d = policy.decide(history, np.random.default_rng(0), pending=[32])
    assert d.batch_size == 128


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ConfigError, match="default batch size 48"):
        BatchSizeOptimizer(SIZES, 48)
    with pytest.raises(ConfigError, match="beta"):
        BatchSizeOptimizer(SIZES, 64, beta=1.0)


def test_epochs_shared_across_sizes_keep_the_walk_past_one_noisy_run() -> None:
    sizes = [512, 1024, 2048, 4096, 8192]

    def run(bs: int, cost: float, epochs: int) -> Observation:
        return Observation(bs, 100.0, cost, 0.0, cost, True, epochs)

    # 4096 needed 7 epochs once (its neighbour 4); per epoch it is the cheapest size.
    history = [run(1024, 100.0, 4), run(512, 200.0, 4), run(2048, 60.0, 4), run(4096, 84.0, 7)]
    shared = BatchSizeOptimizer(sizes, 1024)
    assert shared.decide(history, np.random.default_rng(0)).batch_size == 8192
    plain = BatchSizeOptimizer(sizes, 1024, share_epochs=False)
    picks = {plain.decide(history, np.random.default_rng(s)).batch_size for s in range(20)}
    assert 8192 not in picks  # judged by its one noisy run, 4096 closes the walk


@pytest.mark.parametrize("seed", range(8))
def test_deciding_from_a_tally_is_deciding_from_the_history(seed: int) -> None:
    """decide_from (the replay's, a tally kept run by run) decides as decide (the whole
    history) after every run of a history with failures, preemptions and epochs."""
    gen = np.random.default_rng(seed)
    policy = BatchSizeOptimizer(SIZES, 32, beta=1.5 + seed % 3, share_epochs=seed % 4 != 3)
    tally = policy.tally()
    assert isinstance(tally, HistoryTally)
    history: list[Observation] = []
    for k in range(150):
        for pending in ((), (int(gen.choice(SIZES)),)):
            want = policy.decide(history, np.random.default_rng(k), pending=pending)
            got = policy.decide_from(tally, np.random.default_rng(k), pending=pending)
            assert got == want, (k, pending)
        bs = want.batch_size if gen.random() < 0.8 else int(gen.choice(SIZES))
        cost = float(gen.uniform(50, 150) * (1 + abs(math.log2(bs / 16)) / 4))
        o = Observation(
            bs,
            150.0,
            cost,
            cost / 100,
            cost,
            reached=bool(gen.random() < 0.7),
            epochs=int(gen.integers(0, 20)) if gen.random() < 0.8 else None,
            preempted=bool(gen.random() < 0.15),
        )
        history.append(o)
        tally.add(o)
    with pytest.raises(ConfigError, match="another policy"):
        BatchSizeOptimizer(SIZES, 32).decide_from(tally, np.random.default_rng(0))
