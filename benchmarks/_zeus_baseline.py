"""Zeus's batch-size policy (NSDI'23), re-implemented from its description for comparison.

Written for ``benchmarks/recurring.py`` only, so the two policies run in the same simulator on
the same sampled training paths. Behaviour as Zeus's paper and artifact describe it:

* **Pruning exploration, two rounds.** A round starts at the default batch size (round 2: the
  cheapest of round 1), walks down through every smaller batch size until a run fails to
  reach the target, then up through every larger one until a failure. Sizes that reached the
  target survive the round.
* **Gaussian Thompson sampling** over the survivors: each arm's noise precision is the inverse
  variance of its own observed costs (so every arm needs two observations, which the two
  pruning rounds provide), flat prior; an arm with zero variance samples its mean exactly.
* **Early stopping** at ``β ×`` the cheapest *recurrence* so far (the sum of its runs'
  costs). A run that cannot afford one epoch is observed as ``100·β·min`` and failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perseus.recurring.policy import Decision, Observation

__all__ = ["ZeusPolicy"]


class ZeusPolicy:
    """Stateful: consumes the history incrementally (one instance per simulated job)."""

    def __init__(self, batch_sizes: Sequence[int], default: int, beta: float = 2.0) -> None:
        self.sizes = sorted(batch_sizes)
        self.default = default
        self.beta = beta
        self.seen = 0
        self.min_recurrence_cost = math.inf
        self._acc = 0.0
        self.rewards: dict[int, list[float]] = {}
        self.round = 0
        self.survivors = list(self.sizes)
        self._queue = self._round_queue()
        self._expect: int | None = None
        self._good: list[tuple[float, int]] = []
        self._direction_failed = False
        self.pruning = True

    def _round_queue(self) -> list[list[int]]:
        i = self.survivors.index(self.default)
        down = sorted(self.survivors[: i + 1], reverse=True)
        up = sorted(self.survivors[i + 1 :])
        return [down, up]

    def _observe(self, o: Observation) -> None:
        cost = o.cost
        if o.cost == 0.0 and not o.reached:  # could not afford one epoch
            cost = 100 * self.beta * self.min_recurrence_cost
        else:
            self._acc += o.cost
        if o.reached:
            self.min_recurrence_cost = min(self.min_recurrence_cost, self._acc)
            self._acc = 0.0
        self.rewards.setdefault(o.batch_size, []).append(cost)
        if self.pruning and o.batch_size == self._expect:
            self._expect = None
            if o.reached:
                self._good.append((cost, o.batch_size))
            else:
                self._queue[0] = []  # this direction is over

    def _next_pruning(self) -> int | None:
        while self._queue:
            if self._queue[0]:
                return self._queue[0].pop(0)
            self._queue.pop(0)
        # Round over.
        self.round += 1
        self.survivors = sorted(b for _, b in self._good)
        if self._good:
            self.default = min(self._good)[1]
        self._good = []
        if self.round >= 2 or not self.survivors:
            self.pruning = False
            return None
        self._queue = self._round_queue()
        return self._next_pruning()

    def decide(self, history: Sequence[Observation], rng: np.random.Generator) -> Decision:
        for o in history[self.seen :]:
            self._observe(o)
        self.seen = len(history)
        limit = (
            None if math.isinf(self.min_recurrence_cost) else self.beta * self.min_recurrence_cost
        )
        if self.pruning:
            if self._expect is not None:  # still waiting (should not happen sequentially)
                return Decision(self._expect, "explore", limit)
            b = self._next_pruning()
            if b is not None:
                self._expect = b
                return Decision(b, "explore", limit)
        arms = self.survivors or [self.default]
        for arm in rng.permutation(arms):
            if len(self.rewards.get(int(arm), [])) < 2:
                return Decision(int(arm), "explore", limit)
        best, best_draw = arms[0], math.inf
        for arm in arms:
            xs = np.asarray(self.rewards[arm])
            var = float(xs.var())
            std = 0.0 if var == 0.0 else math.sqrt(var / len(xs))
            draw = float(xs.mean()) if std == 0.0 else float(rng.normal(xs.mean(), std))
            if draw < best_draw:
                best, best_draw = arm, draw
        return Decision(best, "thompson", limit)
