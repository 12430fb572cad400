"""The fleet planner's loop (``perseus fleet serve``), and a budget that follows a price or
carbon signal (:func:`signal_budget`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from perseus.dag.graph import FloatArray
from perseus.device.clock import Clock
from perseus.errors import ConfigError, PerseusError
from perseus.fleet.registry import FleetRegistry
from perseus.io.power_files import Signal

__all__ = ["BudgetTrack", "serve", "signal_budget"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BudgetTrack:
    """A budget over time: ``budgets_w[i]`` from ``starts_s[i]`` (seconds from the start)."""

    starts_s: FloatArray
    budgets_w: FloatArray

    def at(self, t_s: float) -> float:
        """The budget at ``t_s`` seconds from the start (the first one before it)."""
        i = max(int(np.searchsorted(self.starts_s, t_s, side="right")) - 1, 0)
        return float(self.budgets_w[i])

    def next_change_s(self, t_s: float) -> float | None:
        """The next interval boundary after ``t_s``, or None after the last."""
        i = int(np.searchsorted(self.starts_s, t_s, side="right"))
        return float(self.starts_s[i]) if i < len(self.starts_s) else None


def signal_budget(
    signal: Signal, *, budget_w: float, above: float, high_signal_budget_w: float
) -> BudgetTrack:
    """The budget a signal's first column sets: ``high_signal_budget_w`` where the value (in
    the column's declared unit) is above ``above``, ``budget_w`` elsewhere.

    Raises:
        ConfigError: either budget is not a positive number of watts.
    """
    for name, w in (("budget_w", budget_w), ("high_signal_budget_w", high_signal_budget_w)):
        if not (np.isfinite(w) and w > 0):
            raise ConfigError(f"`{name}` must be a positive number of watts, got {w}")
    series = signal.pick(None)
    per_declared = 1000.0 if series.unit.endswith("MWh") else 1.0
    declared = series.values_per_kwh * per_declared
    budgets = np.where(declared > above, high_signal_budget_w, budget_w).astype(np.float64)
    return BudgetTrack(np.asarray(signal.starts_s, dtype=np.float64), budgets)


def serve(
    fleet: FleetRegistry,
    *,
    clock: Clock,
    interval_s: float,
    budget_w: float | None = None,
    track: BudgetTrack | None = None,
    once: bool = False,
    until_s: float | None = None,
) -> None:
    """Look for changes every ``interval_s`` (and at each of ``track``'s boundaries) and
    re-solve; set ``budget_w`` first, or follow ``track``. Runs until ``until_s`` seconds
    have passed (for ever when None), or one look if ``once``. A look the database does not
    answer (busy, restarted, out of reach) once an earlier one was answered is logged and made
    again at the next one."""
    start_s = clock.now()
    applied: float | None = None
    answered = False
    while True:
        t_s = clock.now() - start_s
        want = track.at(t_s) if track is not None else budget_w
        try:
            if want is not None and want != applied:
                fleet.set_budget(want)
                applied = want
            epoch = fleet.replan()
            if epoch is not None:
                budget, running = fleet.running()
                log.info("plan %d: %d running jobs under %.1f W", epoch, running, budget or 0)
            answered = True
        except ConfigError:
            raise
        except PerseusError as e:  # busy, restarted or out of reach: the next look tries again
            if not answered:  # the first look (the only one with ``once``): a wrong URL, say
                raise
            log.warning("fleet planner: the database does not answer (%s); looking again", e)
        if once or (until_s is not None and t_s >= until_s):
            return
        wait_s = interval_s
        boundary_s = track.next_change_s(t_s) if track is not None else None
        if boundary_s is not None:
            wait_s = min(wait_s, boundary_s - t_s)
        if until_s is not None:
            wait_s = min(wait_s, until_s - t_s)
        clock.sleep(wait_s)
