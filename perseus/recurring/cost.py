"""Zeus's cost ``η·E + (1 − η)·MAXPOWER·T`` and the power-limit choice it implies (pure).

The epochs to the target do not depend on the power limit, so the limit with the lowest cost
per sample gives the cheapest run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perseus.errors import ConfigError

__all__ = ["PowerLimitMeasurement", "best_power_limit_w", "check_eta", "zeus_cost"]


def check_eta(eta: float) -> float:
    """η, or :class:`ConfigError` if it is outside [0, 1]."""
    if not 0.0 <= eta <= 1.0:
        raise ConfigError(f"eta must be in [0, 1] (0: fastest, 1: least energy), got {eta}")
    return float(eta)


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """``η·energy_j + (1 − η)·max_power_w·time_s`` (joules)."""
    return eta * energy_j + (1.0 - eta) * max_power_w * time_s


@dataclass(frozen=True, slots=True)
class PowerLimitMeasurement:
    """Throughput and average board power measured at one power limit."""

    power_limit_w: float
    samples_per_s: float
    avg_power_w: float

    def cost_per_sample(self, eta: float, max_power_w: float) -> float:
        """The cost of one sample (``1/throughput`` seconds)."""
        time_s = 1.0 / self.samples_per_s
        return zeus_cost(self.avg_power_w * time_s, time_s, eta, max_power_w)


def best_power_limit_w(
    measurements: Mapping[float, PowerLimitMeasurement], eta: float, max_power_w: float
) -> float:
    """The power limit whose measured cost per sample is smallest.

    Ties go to the higher limit (the faster one). O(len(measurements)).

    Raises:
        ConfigError: if ``measurements`` is empty or a throughput is not positive.
    """
    if not measurements:
        raise ConfigError("no power-limit measurements to choose from")
    for m in measurements.values():
        if not m.samples_per_s > 0:
            raise ConfigError(
                f"power limit {m.power_limit_w} W: throughput must be > 0, got {m.samples_per_s}"
            )
    return min(measurements, key=lambda w: (measurements[w].cost_per_sample(eta, max_power_w), -w))
