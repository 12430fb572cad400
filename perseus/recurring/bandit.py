"""Gaussian Thompson sampling over batch sizes, with a noise level shared across arms (pure).

Run costs are Gaussian around each arm's mean with a standard deviation proportional to it
(the spread comes from the number of epochs). The relative spread is shared by every arm,
pooled from each arm with two or more runs and shrunk towards a prior guess:

    σ_rel² = (κ·σ₀² + Σ_a Σ_i ((x_ai − x̄_a)/x̄_a)²) / (κ + Σ_a (n_a − 1))

so arm ``a``'s posterior is ``N(x̄_a, (σ_rel·x̄_a)²/n_a)`` and an arm joins sampling after one
run (Zeus needs two runs of each). Costs are minimised: the smallest draw wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perseus.errors import ConfigError

__all__ = ["ArmPosterior", "GaussianPrior", "pooled_rel_std", "posteriors", "thompson_sample"]


@dataclass(frozen=True, slots=True)
class GaussianPrior:
    """Prior on the shared relative noise of run costs: the guess ``rel_std`` (σ₀; 0.1 is
    ±10 %) worth ``weight`` (κ) pseudo-observations."""

    rel_std: float = 0.1
    weight: float = 2.0

    def __post_init__(self) -> None:
        if not self.rel_std > 0 or not self.weight > 0:
            raise ConfigError(
                f"bandit prior: rel_std and weight must be > 0, got {self.rel_std}, {self.weight}"
            )


@dataclass(frozen=True, slots=True)
class ArmPosterior:
    """Posterior of one arm's mean cost: ``N(mean, std²)`` from ``count`` runs."""

    mean: float
    std: float
    count: int


def pooled_rel_std(samples: Mapping[int, Sequence[float]], prior: GaussianPrior) -> float:
    """The shared relative standard deviation (see the module docstring). O(total samples)."""
    num = prior.weight * prior.rel_std**2
    den = prior.weight
    for xs in samples.values():
        if len(xs) < 2:
            continue
        mean = sum(xs) / len(xs)
        if mean <= 0:
            continue
        num += sum(((x - mean) / mean) ** 2 for x in xs)
        den += len(xs) - 1
    return math.sqrt(num / den)


def posteriors(
    costs: Mapping[int, Sequence[float]],
    prior: GaussianPrior,
    *,
    noise_samples: Mapping[int, Sequence[float]] | None = None,
) -> dict[int, ArmPosterior]:
    """Posterior of every arm with at least one cost (failed runs' penalties included).

    ``noise_samples``: the costs that estimate the shared noise (default ``costs``; callers
    pass converged runs only, so that a penalty does not read as noise).
    """
    rel = pooled_rel_std(costs if noise_samples is None else noise_samples, prior)
    out = {}
    for arm, xs in costs.items():
        if not xs:
            continue
        mean = sum(xs) / len(xs)
        out[arm] = ArmPosterior(mean=mean, std=rel * abs(mean) / math.sqrt(len(xs)), count=len(xs))
    return out


def thompson_sample(arms: Mapping[int, ArmPosterior], rng: np.random.Generator) -> int:
    """Draw one mean per arm (in sorted order, so a seed fixes the choice); the smallest wins.

    Raises:
        ConfigError: if ``arms`` is empty.
    """
    if not arms:
        raise ConfigError("Thompson sampling needs at least one arm with an observation")

    def draw(arm: int) -> float:
        post = arms[arm]
        return float(rng.normal(post.mean, post.std)) if post.std > 0 else post.mean

    return min(sorted(arms), key=draw)
