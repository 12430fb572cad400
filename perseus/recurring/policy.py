"""Which batch size the next run of a recurring job uses, from the runs so far (pure).

A function of the history and a random generator, so processes sharing one history decide
consistently. Rules (docs/recurring.md): (1) run ``b0`` first; (2) then an untried neighbour
of the arms not clearly worse than the best (``margin_std``), the cheapest arm first and its
smaller neighbour first; (3) then Thompson
sampling among converged arms (:mod:`perseus.recurring.bandit`), exploring the drawn arm's
untried neighbour once. A run past ``β ×`` the cheapest converged run stops and fails; a failed
arm's cost is penalised with ``max(incurred, β × best)``; a preempted run is no evidence
until :data:`MAX_PREEMPTIONS` in a row (:func:`evidence`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from perseus.errors import ConfigError
from perseus.recurring.bandit import GaussianPrior, pooled_rel_std, posteriors, thompson_sample

__all__ = ["MAX_PREEMPTIONS", "BatchSizeOptimizer", "Decision", "Observation", "evidence"]

#: Preemptions in a row of one batch size that count as one failed run of it; fewer are retried.
MAX_PREEMPTIONS = 3


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished (or preempted) run of a recurring job.

    Attributes:
        power_limit_w: Power limit it ran under (after profiling; NaN: none).
        cost: ``η·E + (1 − η)·MAXPOWER·T`` of the run.
        reached: Whether it reached the target metric.
        epochs: Epochs the run trained (None when unknown).
        preempted: The run was preempted (figures as of its last heartbeat): no evidence
            about its batch size (:func:`evidence`).
    """

    batch_size: int
    power_limit_w: float
    energy_j: float
    time_s: float
    cost: float
    reached: bool
    epochs: int | None = None
    preempted: bool = False


def evidence(history: Sequence[Observation]) -> list[Observation]:
    """Every finished run, and each streak of :data:`MAX_PREEMPTIONS` preemptions of one
    size as one failed run (its last preemption); shorter streaks are left out. O(n)."""
    out: list[Observation] = []
    streak: dict[int, int] = {}
    for o in history:
        if not o.preempted:
            streak.pop(o.batch_size, None)
            out.append(o)
            continue
        streak[o.batch_size] = streak.get(o.batch_size, 0) + 1
        if streak[o.batch_size] >= MAX_PREEMPTIONS:  # now a failed run (idempotent)
            streak.pop(o.batch_size)
            out.append(replace(o, preempted=False, reached=False))
    return out


@dataclass(frozen=True, slots=True)
class Decision:
    """The next run's batch size, why, and the cost at which it is stopped early (None
    while no run has converged)."""

    batch_size: int
    phase: str  # "default", "explore" or "thompson"
    cost_limit: float | None


@dataclass(frozen=True)
class BatchSizeOptimizer:
    """The batch-size policy of one recurring job (rules in the module docstring).

    Args:
        default_batch_size: ``b0``, the job's usual batch size (one of ``batch_sizes``).
        beta: Early-stopping factor β > 1 (Zeus: 2.0).
        prior: Prior of the bandit's shared noise level.
        margin_std: Rule 2's margin, in shared relative standard deviations.
        share_epochs: Rule 2 also judges an arm by its neighbours' epoch counts.
    """

    batch_sizes: Sequence[int]
    default_batch_size: int
    beta: float = 2.0
    prior: GaussianPrior = field(default_factory=GaussianPrior)
    margin_std: float = 2.0
    share_epochs: bool = True

    def __post_init__(self) -> None:
        sizes = tuple(sorted(set(int(b) for b in self.batch_sizes)))
        if not sizes or sizes[0] < 1:
            raise ConfigError(f"batch sizes must be positive integers, got {self.batch_sizes}")
        if self.default_batch_size not in sizes:
            raise ConfigError(
                f"default batch size {self.default_batch_size} is not among the allowed "
                f"batch sizes {list(sizes)}; add it or pick one of them"
            )
        if not self.beta > 1.0:
            raise ConfigError(f"beta must be > 1 (early-stop threshold factor), got {self.beta}")
        object.__setattr__(self, "batch_sizes", sizes)

    def cost_limit(self, history: Sequence[Observation]) -> float | None:
        """``β ×`` the cheapest converged run, or None before any run converged."""
        best = min((o.cost for o in history if o.reached), default=None)
        return None if best is None else self.beta * best

    def arm_costs(self, history: Sequence[Observation]) -> dict[int, list[float]]:
        """Every arm's costs, failed runs penalised (preemptions as :func:`evidence` counts)."""
        costs: dict[int, list[float]] = {}
        best = math.inf
        for o in evidence(history):
            if o.reached:
                value = o.cost
                best = min(best, o.cost)
            else:
                value = max(o.cost, self.beta * best) if math.isfinite(best) else o.cost
            costs.setdefault(o.batch_size, []).append(value)
        return costs

    def decide(
        self,
        history: Sequence[Observation],
        rng: np.random.Generator,
        *,
        pending: Sequence[int] = (),
    ) -> Decision:
        """The next run's batch size given the finished runs so far, oldest first.

        ``pending``: sizes of runs started but not finished; they count as tried, so two
        concurrent runs never explore the same size. O(len(history) + len(batch_sizes)).
        """
        history = evidence(history)
        limit = self.cost_limit(history)
        tried = {o.batch_size for o in history} | set(pending)
        converged: dict[int, list[float]] = {}
        for o in history:
            if o.reached:
                converged.setdefault(o.batch_size, []).append(o.cost)
        if not converged:
            return self._start(history, tried, limit)
        costs = self.arm_costs(history)
        post = posteriors({b: costs[b] for b in converged}, self.prior, noise_samples=converged)
        for arm in self._close_arms(history, converged, {b: p.mean for b, p in post.items()}):
            if (neighbour := self._untried_neighbour(arm, tried)) is not None:
                return Decision(neighbour, "explore", limit)
        drawn = thompson_sample(post, rng)
        if (neighbour := self._untried_neighbour(drawn, tried)) is not None:
            return Decision(neighbour, "explore", limit)
        return Decision(drawn, "thompson", limit)

    def _start(
        self, history: Sequence[Observation], tried: set[int], limit: float | None
    ) -> Decision:
        """Rule 1: ``b0``, or the untried size nearest it once ``b0`` failed."""
        b0 = self.default_batch_size
        fresh = [b for b in self.batch_sizes if b not in tried]
        # Everything failed once (or runs): keep trying the default.
        if b0 not in tried or not history or not fresh:
            return Decision(b0, "default", limit)
        nearest = min(fresh, key=lambda b: (abs(math.log(b / b0)), b))
        return Decision(nearest, "explore", limit)

    def _close_arms(
        self,
        history: Sequence[Observation],
        converged: dict[int, list[float]],
        means: Mapping[int, float],
    ) -> list[int]:
        """Rule 2: the arms not clearly worse than the best, cheapest first."""
        rel_std = pooled_rel_std(converged, self.prior)
        bar = min(means.values()) * (1.0 + self.margin_std * rel_std)
        close = [b for b in means if means[b] <= bar]
        if self.share_epochs:
            shared = self._epoch_shared(history)
            close += [b for b, c in shared.items() if b not in close and b in means and c <= bar]
        return sorted(close, key=lambda b: (means[b], b))

    def _epoch_shared(self, history: Sequence[Observation]) -> dict[int, float]:
        """Optimistic cost of each converged arm with known epochs: its cheapest cost per
        epoch times the smallest mean epoch count among it and its adjacent sizes (epochs to
        the target change smoothly with the batch size). O(len(history))."""
        per_epoch: dict[int, float] = {}
        epochs: dict[int, list[int]] = {}
        for o in history:
            if o.reached and o.epochs:
                b = o.batch_size
                per_epoch[b] = min(per_epoch.get(b, math.inf), o.cost / o.epochs)
                epochs.setdefault(b, []).append(o.epochs)
        sizes = self.batch_sizes
        out = {}
        for b, c in per_epoch.items():
            i = sizes.index(b)
            near = [
                sum(epochs[x]) / len(epochs[x]) for x in sizes[max(0, i - 1) : i + 2] if x in epochs
            ]
            out[b] = c * min(near)
        return out

    def _untried_neighbour(self, arm: int, tried: set[int]) -> int | None:
        """The smaller, else the larger, immediate neighbour of ``arm`` that never ran."""
        sizes = self.batch_sizes
        i = sizes.index(arm)
        for j in (i - 1, i + 1):
            if 0 <= j < len(sizes) and sizes[j] not in tried:
                return sizes[j]
        return None
