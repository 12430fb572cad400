"""Just-in-time power-limit profiler: try each limit for a few iterations of a real run.

After ``warmup_steps``, each candidate limit in turn holds for ``settle_steps`` and a measured
window; the limit with the lowest cost per sample is then kept for the run. A window
whose energy counter did not advance is left out; with none measured the highest limit stays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from perseus.device.base import PowerLimitGPU
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.errors import ConfigError
from perseus.recurring.cost import PowerLimitMeasurement, best_power_limit_w, check_eta

__all__ = ["PowerLimitProfiler", "candidate_power_limits_w"]

log = logging.getLogger(__name__)


def candidate_power_limits_w(
    low_w: float, high_w: float, step_w: float = 25.0
) -> tuple[float, ...]:
    """``high_w, high_w − step_w, …`` down to ``low_w`` (included), as Zeus profiles."""
    if not 0 < low_w <= high_w or not step_w > 0:
        raise ConfigError(f"power-limit range {low_w}-{high_w} W, step {step_w} W is invalid")
    out = []
    w = high_w
    while w > low_w + 1e-9:
        out.append(w)
        w -= step_w
    out.append(low_w)
    return tuple(out)


class PowerLimitProfiler:
    """Profiles power limits during the first iterations of a run (see module docstring).

    Args:
        gpu: The GPU whose limit is changed (the caller resets it after the run).
        eta: Energy-time weight η of the cost.
        max_power_w: ``MAXPOWER`` of the cost (default: the highest candidate limit).
        power_limits_w: Candidates (default: the GPU's range in 25 W steps, highest first).
        warmup_steps: Iterations skipped first; ``settle_steps`` after each limit change, then
            at least ``window_steps`` measured.
        min_window_s: Minimum measured seconds per limit (energy counters update ~10 Hz).
        clock: What windows are timed on (the simulated GPU's clock in emulation).
    """

    def __init__(
        self,
        gpu: PowerLimitGPU,
        *,
        eta: float,
        max_power_w: float | None = None,
        power_limits_w: Sequence[float] | None = None,
        warmup_steps: int = 10,
        settle_steps: int = 2,
        window_steps: int = 10,
        min_window_s: float = 1.0,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if warmup_steps < 0 or settle_steps < 0 or window_steps < 1 or min_window_s < 0:
            raise ConfigError(
                "profiler: warmup_steps and settle_steps must be >= 0, window_steps >= 1, "
                "min_window_s >= 0"
            )
        self.gpu = gpu
        self.eta = check_eta(eta)
        self._max_power_w = max_power_w
        self._limits = tuple(power_limits_w) if power_limits_w is not None else None
        self.warmup_steps = warmup_steps
        self.settle_steps = settle_steps
        self.window_steps = window_steps
        self.min_window_s = min_window_s
        self._clock = clock
        self.measurements: dict[float, PowerLimitMeasurement] = {}
        self.chosen_w: float | None = None
        self._index = -1  # -1: warming up
        self._count = 0
        self._samples = 0
        self._t0 = 0.0
        self._e0_mj = 0

    @property
    def done(self) -> bool:
        return self.chosen_w is not None

    @property
    def power_limits_w(self) -> tuple[float, ...]:
        if self._limits is None:
            low, high = self.gpu.power_limit_range_w()
            self._limits = candidate_power_limits_w(low, high)
        return self._limits

    def _begin(self, index: int) -> None:
        self._index, self._count, self._samples = index, 0, 0
        self.gpu.set_power_limit_w(self.power_limits_w[index])
        if self.settle_steps == 0:
            self._start_window()

    def step(self, samples: int) -> None:
        """Account one finished iteration of ``samples`` samples (no-op once done)."""
        if self.done:
            return
        self._count += 1
        if self._index < 0:
            if self._count >= self.warmup_steps:
                self._begin(0)
            return
        if self._count == self.settle_steps:
            self._start_window()
            return
        if self._count < self.settle_steps:
            return
        self._samples += samples
        elapsed = self._clock.now() - self._t0
        if self._count - self.settle_steps < self.window_steps or elapsed < self.min_window_s:
            return
        energy_j = (self.gpu.energy_mj() - self._e0_mj) / 1000.0
        limit = self.power_limits_w[self._index]
        if elapsed > 0 and self._samples > 0 and energy_j > 0:  # else: nothing measured
            self.measurements[limit] = PowerLimitMeasurement(
                limit, self._samples / elapsed, energy_j / elapsed
            )
        if self._index + 1 < len(self.power_limits_w):
            self._begin(self._index + 1)
            return
        self._finish()

    def _start_window(self) -> None:
        self._t0 = self._clock.now()
        self._e0_mj = self.gpu.energy_mj()
        self._samples = 0

    def _finish(self) -> None:
        max_power_w = max(self.power_limits_w) if self._max_power_w is None else self._max_power_w
        chosen = max(self.power_limits_w)  # kept if the energy counter never advanced
        if self.measurements:
            chosen = best_power_limit_w(self.measurements, self.eta, max_power_w)
        self.gpu.set_power_limit_w(chosen)
        self.chosen_w = chosen
        costs = {w: m.cost_per_sample(self.eta, max_power_w) for w, m in self.measurements.items()}
        log.info("power-limit profile: %s -> %g W", costs, chosen)
