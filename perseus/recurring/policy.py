"""Which batch size the next run of a recurring job uses, from the runs so far (pure).

A function of the history and a random generator, so processes sharing one history decide
consistently. Rules (docs/recurring.md): (1) run ``b0`` first; (2) then an untried neighbour
of the arms not clearly worse than the best (``margin_std``), the cheapest arm first and its
smaller neighbour first; (3) then Thompson
sampling among converged arms (:mod:`perseus.recurring.bandit`), exploring the drawn arm's
untried neighbour once. A run past ``β ×`` the cheapest converged run stops and fails; a failed
arm's cost is penalised with ``max(incurred, β × best)``; a preempted run is no evidence
until :data:`MAX_PREEMPTIONS` in a row (:func:`evidence`). After :data:`UNSTOPPED_AFTER`
failed runs in a row early stopping is off until a run converges (a lucky cheap run can set
``β ×`` best below what most runs of every size need).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from perseus.errors import ConfigError
from perseus.recurring.bandit import (
    ArmPosterior,
    GaussianPrior,
    thompson_sample,
)

__all__ = [
    "MAX_PREEMPTIONS",
    "UNSTOPPED_AFTER",
    "BatchSizeOptimizer",
    "Decision",
    "HistoryTally",
    "Observation",
    "evidence",
]

#: Preemptions in a row of one batch size that count as one failed run of it; fewer are retried.
MAX_PREEMPTIONS = 3
#: Failed runs in a row after which runs are not stopped early until one converges.
UNSTOPPED_AFTER = 10


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
    streak: dict[int, int] = {}
    return [e for o in history if (e := _as_evidence(o, streak)) is not None]


def _as_evidence(o: Observation, streak: dict[int, int]) -> Observation | None:
    """``o`` as :func:`evidence` counts it, given (and updating) each size's preemption streak."""
    if not o.preempted:
        streak.pop(o.batch_size, None)
        return o
    streak[o.batch_size] = streak.get(o.batch_size, 0) + 1
    if streak[o.batch_size] < MAX_PREEMPTIONS:
        return None
    streak.pop(o.batch_size)  # now a failed run (idempotent)
    return replace(o, preempted=False, reached=False)


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
        """``β ×`` the cheapest converged run, or None before any run converged or after
        :data:`UNSTOPPED_AFTER` failed runs in a row."""
        tally = self.tally()
        for o in history:
            tally.add(o)
        return tally.cost_limit()

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
        """The next run's batch size given the finished runs so far, oldest first (read
        through a :class:`HistoryTally`, as :meth:`decide_from`).

        ``pending``: sizes of runs started but not finished; they count as tried, so two
        concurrent runs never explore the same size. O(len(history) + len(batch_sizes)²)
        (the converged arms' neighbours are looked up by position).
        """
        tally = self.tally()
        for o in history:
            tally.add(o)
        return self.decide_from(tally, rng, pending=pending)

    def tally(self) -> HistoryTally:
        """An empty :class:`HistoryTally` of this policy, for :meth:`decide_from`."""
        return HistoryTally(self)

    def decide_from(
        self, tally: HistoryTally, rng: np.random.Generator, *, pending: Sequence[int] = ()
    ) -> Decision:
        """:meth:`decide` from a :class:`HistoryTally` of the history: O(len(batch_sizes)²)
        whatever the history's length."""
        if tally.policy is not self:
            raise ConfigError("decide_from: the tally was made by another policy")
        tried = tally.tried | set(pending)
        limit = tally.cost_limit()
        if not tally.converged:
            return self._start(tally.runs > 0, tried, limit)
        post, rel_std = tally.posteriors()
        shared = tally.epoch_shared() if self.share_epochs else {}
        # Rules 2 and 3, from the converged arms' posteriors.
        means = {b: p.mean for b, p in post.items()}
        for arm in self._close_arms(means, rel_std, shared):
            if (neighbour := self._untried_neighbour(arm, tried)) is not None:
                return Decision(neighbour, "explore", limit)
        drawn = thompson_sample(post, rng)
        if (neighbour := self._untried_neighbour(drawn, tried)) is not None:
            return Decision(neighbour, "explore", limit)
        return Decision(drawn, "thompson", limit)

    def _start(self, any_run: bool, tried: set[int], limit: float | None) -> Decision:
        """Rule 1: ``b0``, or the untried size nearest it once ``b0`` failed."""
        b0 = self.default_batch_size
        fresh = [b for b in self.batch_sizes if b not in tried]
        # Everything failed once (or runs): keep trying the default.
        if b0 not in tried or not any_run or not fresh:
            return Decision(b0, "default", limit)
        nearest = min(fresh, key=lambda b: (abs(math.log(b / b0)), b))
        return Decision(nearest, "explore", limit)

    def _close_arms(
        self, means: Mapping[int, float], rel_std: float, shared: Mapping[int, float]
    ) -> list[int]:
        """Rule 2: the arms not clearly worse than the best, cheapest first (``shared``:
        :meth:`HistoryTally.epoch_shared`'s costs, empty without ``share_epochs``)."""
        bar = min(means.values()) * (1.0 + self.margin_std * rel_std)
        close = [b for b in means if means[b] <= bar]
        close += [b for b, c in shared.items() if b not in close and b in means and c <= bar]
        return sorted(close, key=lambda b: (means[b], b))

    def _untried_neighbour(self, arm: int, tried: set[int]) -> int | None:
        """The smaller, else the larger, immediate neighbour of ``arm`` that never ran."""
        sizes = self.batch_sizes
        i = sizes.index(arm)
        for j in (i - 1, i + 1):
            if 0 <= j < len(sizes) and sizes[j] not in tried:
                return sizes[j]
        return None


class HistoryTally:
    """What :meth:`BatchSizeOptimizer.decide` reads of a history, kept one run at a time
    (:meth:`add`, O(1)), so that a caller deciding after each run of a growing history (the
    trace replay) does not re-read it. The bandit's means and spreads are running sums
    (Welford's for the spread), equal to :func:`~perseus.recurring.bandit.posteriors`' up to
    float rounding; the rest is exact.
    """

    def __init__(self, policy: BatchSizeOptimizer) -> None:
        self.policy = policy
        #: Runs in the evidence (:func:`evidence`), every size tried, the cheapest converged
        #: run's cost and whether any converged.
        self.runs = 0
        self.tried: set[int] = set()
        self.best = math.inf
        self.converged = False
        #: Failed runs since the last converged one.
        self.failed_in_a_row = 0
        self._streak: dict[int, int] = {}
        self._cost_sum: dict[int, float] = {}  # penalised costs (arm_costs), per arm
        self._cost_n: dict[int, int] = {}
        self._spread: dict[int, tuple[int, float, float]] = {}  # converged: n, mean, m2
        self._per_epoch: dict[int, float] = {}
        self._epochs: dict[int, list[int]] = {}  # [sum, count] of converged runs' epochs

    def add(self, o: Observation) -> None:
        """Count ``o``, the history's next run (a preemption as :func:`evidence` counts it)."""
        counted = _as_evidence(o, self._streak)
        if counted is None:
            return
        o, b = counted, counted.batch_size
        self.runs += 1
        self.tried.add(b)
        self.failed_in_a_row = 0 if o.reached else self.failed_in_a_row + 1
        if o.reached:  # as arm_costs: a failed run is penalised against the best so far
            value = o.cost
            self.best = min(self.best, o.cost)
            self.converged = True
            n, mean, m2 = self._spread.get(b, (0, 0.0, 0.0))
            delta = o.cost - mean
            mean += delta / (n + 1)
            self._spread[b] = (n + 1, mean, m2 + delta * (o.cost - mean))
            if o.epochs:
                self._per_epoch[b] = min(self._per_epoch.get(b, math.inf), o.cost / o.epochs)
                counts = self._epochs.setdefault(b, [0, 0])
                counts[0] += o.epochs
                counts[1] += 1
        else:
            best = self.best
            value = max(o.cost, self.policy.beta * best) if math.isfinite(best) else o.cost
        self._cost_sum[b] = self._cost_sum.get(b, 0.0) + value
        self._cost_n[b] = self._cost_n.get(b, 0) + 1

    def cost_limit(self) -> float | None:
        """:meth:`BatchSizeOptimizer.cost_limit` of the history counted so far."""
        if not self.converged or self.failed_in_a_row >= UNSTOPPED_AFTER:
            return None
        return self.policy.beta * self.best

    def posteriors(self) -> tuple[dict[int, ArmPosterior], float]:
        """The converged arms' posteriors and the shared relative spread
        (:func:`~perseus.recurring.bandit.posteriors`, from the running sums)."""
        prior = self.policy.prior
        num, den = prior.weight * prior.rel_std**2, prior.weight
        for n, mean, m2 in self._spread.values():
            if n >= 2 and mean > 0:
                num += m2 / mean**2
                den += n - 1
        rel = math.sqrt(num / den)
        out = {}
        for b in self._spread:
            count = self._cost_n[b]
            mean = self._cost_sum[b] / count
            out[b] = ArmPosterior(mean=mean, std=rel * abs(mean) / math.sqrt(count), count=count)
        return out, rel

    def epoch_shared(self) -> dict[int, float]:
        """Optimistic cost of each converged arm with known epochs: its cheapest cost per
        epoch times the smallest mean epoch count among it and its adjacent sizes (epochs to
        the target change smoothly with the batch size)."""
        means = {b: total / count for b, (total, count) in self._epochs.items()}
        sizes = self.policy.batch_sizes
        out = {}
        for b, c in self._per_epoch.items():
            i = sizes.index(b)
            out[b] = c * min(means[x] for x in sizes[max(0, i - 1) : i + 2] if x in means)
        return out
