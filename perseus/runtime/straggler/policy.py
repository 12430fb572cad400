"""Which frontier plan a pipeline runs when another pipeline straggles (the rule:
``docs/straggler.md``); pure and deterministic, so all ranks fed the same observed T′ agree.

Against noise, T′ is smoothed (an EMA of weight ``smoothing``) and a decision fixes a deadline
``D``, picking the cheapest plan within ``D·(1 − h)``; the plan is kept while the smoothed T′
stays inside ``[D·(1 − h), D·(1 + h)]``, so keeping it never slows the job. :func:`step_policy`
is the pure step over a frozen :class:`PolicyState`; :class:`StragglerPolicy` holds the state.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal

from perseus.errors import ConfigError
from perseus.plan import Frontier

__all__ = [
    "PlanChoice",
    "PolicyState",
    "StragglerPolicy",
    "choose_plan_index",
    "initial_state",
    "step_policy",
]

Reason = Literal["fastest", "straggler", "slack", "min-energy", "hold"]

# Relative tolerance when comparing a plan's time with a deadline (float noise in JSON times).
_TIME_RTOL = 1e-12


@dataclass(frozen=True, slots=True)
class PlanChoice:
    """The plan to run next (``point_index`` into ``frontier.points``, its time and energy).

    Attributes:
        reason: ``"fastest"`` (T′ at or below T_min), ``"straggler"`` (this pipeline is the
            straggler), ``"slack"`` (cheapest plan within T′), ``"min-energy"`` (T′ beyond
            T*, capped) or ``"hold"`` (T′ inside the hysteresis band: previous plan kept).
        switched: True when the plan differs from the previous decision's.
    """

    point_index: int
    time_s: float
    energy_j: float
    reason: Reason
    switched: bool


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Everything a decision depends on besides the frontier; ranks holding equal states agree.

    Attributes:
        point_index: The plan currently chosen.
        deadline_s: The smoothed T′ the current plan was chosen for (None before the first
            observation, or while this pipeline is the straggler).
        smoothed_s: Moving average of the observed T′ (None before the first).
        switches: Number of plan changes so far.
    """

    point_index: int
    deadline_s: float | None
    smoothed_s: float | None
    switches: int


class _Table:
    """Sorted times and each prefix's cheapest point (O(K) to build):
    :meth:`~perseus.plan.Frontier.cheapest_within`'s rule, the lowest ``(energy_j, -time_s)``
    (same energy: the slower point, more slack left for the straggler), the first of equals."""

    __slots__ = ("best_index", "energies", "times")

    def __init__(self, frontier: Frontier) -> None:
        points = frontier.points
        self.times = [p.time_s for p in points]
        self.energies = [p.energy_j for p in points]
        best: list[int] = []
        for i, p in enumerate(points):
            old = points[best[-1]] if best else None
            better = old is None or (p.energy_j, -p.time_s) < (old.energy_j, -old.time_s)
            best.append(i if better else best[-1])
        self.best_index = best

    def choose(self, deadline_s: float) -> int:
        k = bisect.bisect_right(self.times, deadline_s * (1 + _TIME_RTOL))
        return 0 if k == 0 else self.best_index[k - 1]


def choose_plan_index(frontier: Frontier, straggler_time_s: float) -> int:
    """Index of :meth:`perseus.plan.Frontier.cheapest_within`'s plan, but below T_min the
    fastest (index 0) instead of an error. O(K) for K points."""
    return _Table(frontier).choose(straggler_time_s)


def initial_state() -> PolicyState:
    """The state before any observation: the fastest plan."""
    return PolicyState(point_index=0, deadline_s=None, smoothed_s=None, switches=0)


def _check_params(hysteresis: float, smoothing: float) -> None:
    if not (math.isfinite(hysteresis) and 0 <= hysteresis < 0.5):
        raise ConfigError(f"hysteresis must be in [0, 0.5), got {hysteresis}; 0.01 is typical")
    if not (math.isfinite(smoothing) and 0 < smoothing <= 1):
        raise ConfigError(f"smoothing must be in (0, 1], got {smoothing}; 1 disables smoothing")


def _step(
    table: _Table,
    state: PolicyState,
    observed_time_s: float,
    is_straggler: bool,
    hysteresis: float,
    smoothing: float,
) -> tuple[PolicyState, PlanChoice]:
    if not (math.isfinite(observed_time_s) and observed_time_s > 0):
        raise ConfigError(
            f"observed iteration time must be a positive number, got {observed_time_s}"
        )
    prev = state.smoothed_s
    smoothed = (
        observed_time_s if prev is None else smoothing * observed_time_s + (1 - smoothing) * prev
    )
    reason: Reason
    if is_straggler:
        index, deadline, reason = 0, None, "straggler"
    elif state.deadline_s is not None and (
        state.deadline_s * (1 - hysteresis) <= smoothed <= state.deadline_s * (1 + hysteresis)
    ):
        index, deadline, reason = state.point_index, state.deadline_s, "hold"
    else:
        deadline = smoothed
        index = table.choose(deadline * (1 - hysteresis))
        if index == 0:
            reason = "fastest"
        elif index == table.best_index[-1]:
            reason = "min-energy"
        else:
            reason = "slack"
    switched = index != state.point_index
    new_state = PolicyState(index, deadline, smoothed, state.switches + int(switched))
    choice = PlanChoice(index, table.times[index], table.energies[index], reason, switched)
    return new_state, choice


def step_policy(
    frontier: Frontier,
    state: PolicyState,
    observed_time_s: float,
    *,
    is_straggler: bool = False,
    hysteresis: float = 0.01,
    smoothing: float = 0.5,
) -> tuple[PolicyState, PlanChoice]:
    """One decision: fold ``observed_time_s`` (the slowest pipeline's latest T′) into ``state``
    (:func:`initial_state` at first) and choose; neither input is modified.

    ``is_straggler``: on the straggling pipeline itself, which keeps its fastest plan;
    ``hysteresis``: the band's relative half-width ``h``; ``smoothing``: the newest
    observation's weight in the moving average (1: none). O(K) for K points
    (:class:`StragglerPolicy` keeps the table: O(log K)).

    Raises:
        ConfigError: on a non-positive observation or parameters out of range.
    """
    _check_params(hysteresis, smoothing)
    return _step(_Table(frontier), state, observed_time_s, is_straggler, hysteresis, smoothing)


class StragglerPolicy:
    """Holds a :class:`PolicyState` and applies :func:`step_policy` to each observation."""

    def __init__(
        self, frontier: Frontier, *, hysteresis: float = 0.01, smoothing: float = 0.5
    ) -> None:
        _check_params(hysteresis, smoothing)
        self.frontier = frontier
        self.hysteresis = hysteresis
        self.smoothing = smoothing
        self._table = _Table(frontier)
        self.state = initial_state()

    def decide(self, observed_time_s: float, *, is_straggler: bool = False) -> PlanChoice:
        """Fold in one observation of T′ and return the plan to run next."""
        self.state, choice = _step(
            self._table, self.state, observed_time_s, is_straggler, self.hysteresis, self.smoothing
        )
        return choice

    def reset(self) -> None:
        """Back to the fastest plan with no history (e.g. after a job restart)."""
        self.state = initial_state()
