"""The trace replay's figures against the library and an independent recomputation."""

from __future__ import annotations

import numpy as np

from perseus.recurring.policy import UNSTOPPED_AFTER, BatchSizeOptimizer, Observation


def _obs(bs: int, cost: float, reached: bool) -> Observation:
    return Observation(bs, 100.0, cost, 1.0, cost, reached, 3)


def test_the_library_stops_early_no_more_than_the_replay_does() -> None:
    # The replay turns early stopping off after UNSTOPPED_AFTER failed runs in a row (a lucky
    # cheap run can set beta x best below what every size needs); the optimizer the library
    # runs did not, so with beta near 1 its runs kept stopping (13 in a row on cifar100).
    policy = BatchSizeOptimizer((16, 32, 64), 32, beta=1.01)
    rng = np.random.default_rng(0)
    history = [_obs(32, 100.0, True)] + [_obs(32, 101.5, False)] * (UNSTOPPED_AFTER - 1)
    assert policy.decide(history, rng).cost_limit == 101.0
    assert policy.cost_limit(history) == 101.0
    history.append(_obs(16, 101.5, False))
    assert policy.decide(history, rng).cost_limit is None
    assert policy.cost_limit(history) is None
    history.append(_obs(32, 100.5, True))  # a converged run turns it back on
    assert policy.decide(history, rng).cost_limit == 101.0
